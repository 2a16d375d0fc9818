"""The admin API (docs/admin-api.md): groups, users, keys and backends; what the pool is doing is in watch.py.

Durable facts go to the store first; the scheduler and the key cache are then
brought in line, so a change is visible to the very next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from aiohttp import web

from ...names import key_label, person_identity
from ...scheduler import check_weight
from ...store import AlreadyExists, InvalidValue, Store
from ...store.people import KEEP
from ...store.worker import json_bytes
from ..edge.catalog import pool_models
from ..edge.services import SERVICES
from ..request.weights import apply_user
from .aliases import setup_alias_routes
from .backend_edits import backend_dict, models_left_without, refuse_orphaning, set_backend
from .watch import quota_rows, setup_watch_routes

__all__ = [
    "change_group_weight",
    "change_user",
    "create_backend",
    "create_group",
    "create_user",
    "delete_backend",
    "delete_group",
    "delete_user",
    "json_body",
    "new_key",
    "revoke_user_key",
    "set_backend_state",
    "setup_admin_routes",
    "sync_users",
]


async def json_body(request: web.Request) -> dict[str, Any]:
    try:
        data = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidValue("the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidValue("the request body must be a JSON object")
    return data


def sync_users(app: web.Application, group: str | None = None, name: str | None = None) -> None:
    """Bring the scheduler's weights and the quotas in line with the store after an admin change."""
    app[SERVICES].auth.clear()
    app[SERVICES].quotas.reload()
    scheduler = app[SERVICES].scheduler
    store = app[SERVICES].store
    users = [store.get_user(name)] if name is not None else store.list_users(group)
    for user in users:
        if scheduler.has_user(user.id):
            apply_user(scheduler, user.id, user)


# -- groups ----------------------------------------------------------------------------


async def list_groups(request: web.Request) -> web.Response:
    store = request.app[SERVICES].store
    counts = store.users_per_group()
    return web.json_response(
        [
            {**g.to_dict(), "users": counts.get(g.name, 0), "quotas": quota_rows(request.app, "group", g.name)}
            for g in store.list_groups()
        ]
    )


async def add_group(request: web.Request) -> web.Response:
    group = create_group(request.app, await json_body(request))
    return web.json_response({**group.to_dict(), "users": 0}, status=201)


def create_group(app: web.Application, data: dict[str, Any]) -> Any:
    """Add a group (the admin API and the web UI): ``{"name", "weight"}``."""
    return app[SERVICES].store.add_group(data.get("name"), check_weight(data.get("weight")))


def change_group_weight(app: web.Application, name: str, weight: object) -> Any:
    """Set a group's weight (the admin API and the web UI): validated, stored, applied from now on."""
    group = app[SERVICES].store.set_group_weight(name, check_weight(weight))
    app[SERVICES].scheduler.set_group(name, group.scheduler_weight)
    sync_users(app, group=name)
    return group


async def set_group(request: web.Request) -> web.Response:
    data = await json_body(request)
    group = change_group_weight(request.app, request.match_info["name"], data.get("weight"))
    return web.json_response(group.to_dict())


async def remove_group(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    delete_group(request.app, name)
    return web.json_response({"removed": name})


def delete_group(app: web.Application, name: str) -> None:
    """Remove an empty group (the store refuses one with users, saying to move them first)."""
    app[SERVICES].store.remove_group(name)


# -- users -----------------------------------------------------------------------------


def _user_dict(app: web.Application, user: Any, keys: dict[str, int]) -> dict[str, Any]:
    state = app[SERVICES].scheduler.user(user.id)
    return _user_row(user, keys, state, quota_rows(app, "user", user.id))


def _user_row(user: Any, keys: dict[str, int], state: Any, quotas: list[dict[str, Any]]) -> dict[str, Any]:
    """A user as the admin API shows it: its row, keys, standing now (``state``, None if idle) and quotas."""
    return {
        **user.to_dict(),
        "keys": keys.get(user.name, 0),
        "queued": state.queued if state else 0,
        "running": state.running if state else 0,
        "recent_tokens": state.recent_tokens if state else 0,
        "quotas": quotas,
    }


async def list_users(request: web.Request) -> web.Response:
    """`mr user list`: every user. The people active now and the quotas set are read here, on the loop (what
    they number); every row is read and encoded on the store's worker (10,000 users took 225 ms on the loop)."""
    services = request.app[SERVICES]
    live = {u.user_id: u for u in services.scheduler.share(services.dispatcher.clock(), active=True).users}
    limits = services.quotas.by_subject()

    def build(store: Store) -> bytes:
        keys = store.key_counts()
        rows = [
            _user_row(u, keys, live.get(u.id), [limit.to_dict() for limit in limits.get(("user", u.id), ())])
            for u in store.list_users()
        ]
        return json_bytes(rows)

    return web.Response(body=await services.store_worker.run(build), content_type="application/json")


async def add_user(request: web.Request) -> web.Response:
    data = await json_body(request)
    return web.json_response(_user_dict(request.app, create_user(request.app, data), {}), status=201)


def create_user(app: web.Application, data: dict[str, Any]) -> Any:
    """Add a user (the admin API and the web UI): ``{"name", "group", "weight", "proxy", ...}``, or a proxy's
    person with ``"person_of"``; the new row."""
    if data.get("person_of") is not None:
        return _add_person(app, data)
    weight = data.get("weight")
    proxy = _proxy_flag(data) or data.get("proxy_group") is not None
    if not proxy and "person_from" in data:
        raise InvalidValue('"person_from" goes with "proxy": true, for a user whose requests name a person')
    return app[SERVICES].store.add_user(
        data.get("name"),
        data.get("group"),
        None if weight is None else check_weight(weight),
        proxy=proxy,
        proxy_group=data.get("proxy_group"),
        person_from=data.get("person_from", "header"),
    )


def _add_person(app: web.Application, data: dict[str, Any]) -> Any:
    """A proxy's person made ahead of their first request (``{"name": IDENTITY, "person_of": PROXY}``), so an
    admin can give them a group first; the proxy then finds them as if it had made them (``edge/people.py``)."""
    store = app[SERVICES].store
    proxy = store.get_user(str(data["person_of"]))
    if not proxy.proxy:
        raise InvalidValue(
            f"{proxy.name!r} is not a proxy; name the front end's user, such as --person-of webui "
            "(`mr user list` shows proxies)"
        )
    identity = person_identity(data.get("name"))
    if identity is None:
        raise InvalidValue("give the identity the proxy forwards, such as an e-mail address, as the name")
    if store.person_of(proxy.id, identity) is not None:
        raise AlreadyExists(f"{proxy.name!r} already has a person {identity!r}; move them with `mr user set-group`")
    return store.add_person(proxy.id, str(data.get("group") or proxy.forwards_to), identity)


def _proxy_flag(data: dict[str, Any]) -> bool:
    proxy = data.get("proxy", False)
    if not isinstance(proxy, bool):
        raise InvalidValue('"proxy" must be true or false')
    return proxy


async def set_user(request: web.Request) -> web.Response:
    data = await json_body(request)
    user = change_user(request.app, request.match_info["name"], data)
    return web.json_response(_user_dict(request.app, user, request.app[SERVICES].store.key_counts()))


def change_user(app: web.Application, name: str, data: dict[str, Any]) -> Any:
    """Change a user's weight, group or proxy settings (the admin API and the web UI); returns the user."""
    store = app[SERVICES].store
    proxy_fields = {"proxy", "proxy_group", "person_from"} & set(data)
    if not ("weight" in data or "group" in data or proxy_fields):
        raise InvalidValue(
            'give a new "weight" (a number, or null to use the group\'s), a new "group", or "proxy" (true or false)'
            ' with its "proxy_group" and "person_from"'
        )
    if proxy_fields:
        _set_proxy(store, name, data)
    if "weight" in data:
        weight = data["weight"]
        store.set_user_weight(name, None if weight is None else check_weight(weight))
    if "group" in data:
        store.set_user_group(name, data["group"])
    sync_users(app, name=name)
    return store.get_user(name)


def _set_proxy(store: Store, name: str, data: dict[str, Any]) -> None:
    """``proxy``, ``proxy_group`` and ``person_from`` of a PUT; the settings a PUT leaves out stay."""
    proxy = _proxy_flag(data) if "proxy" in data else store.get_user(name).proxy
    if not proxy and {"proxy_group", "person_from"} & set(data):
        raise InvalidValue(
            f'user {name!r} is not a proxy, so it has no "proxy_group" or "person_from"; '
            f"make it one with `mr user set-proxy {name} on`"
        )
    store.set_user_proxy(name, proxy, data.get("proxy_group", KEEP), data.get("person_from", KEEP))


async def remove_user(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    delete_user(request.app, name)
    return web.json_response({"removed": name})


def delete_user(app: web.Application, name: str) -> None:
    """Remove a user and its keys (the admin API and the web UI); its usage rows stay."""
    store = app[SERVICES].store
    user = store.get_user(name)
    store.remove_user(name)
    app[SERVICES].auth.clear()
    app[SERVICES].quotas.reload()
    with contextlib.suppress(ValueError):
        app[SERVICES].scheduler.remove_user(user.id)


def new_key(app: web.Application, name: str, label: object = None) -> str:
    """A new API key for ``name``, named ``label``; the caller shows it once (only its hash is kept)."""
    try:
        checked = key_label(label)
    except ValueError as exc:
        raise InvalidValue(str(exc)) from None
    key: str = app[SERVICES].store.create_key(name, checked)
    app[SERVICES].auth.clear()
    return key


async def create_key(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    data = await json_body(request) if request.body_exists else {}
    key = new_key(request.app, name, data.get("label"))
    return web.json_response({"user": name, "key": key}, status=201)


async def list_keys(request: web.Request) -> web.Response:
    """A user's keys: id, prefix, created, last used; never the key (only its hash is stored)."""
    request.app[SERVICES].auth.flush()
    return web.json_response([k.to_dict() for k in request.app[SERVICES].store.list_keys(request.match_info["name"])])


def revoke_user_key(app: web.Application, name: str, key_id: str) -> int:
    """Revoke one of ``name``'s keys by its id (a string, as a path or form gives it)."""
    if not key_id.isdigit():
        raise InvalidValue(f"key id {key_id!r} is not a number; see the ids with `mr user keys {name}`")
    app[SERVICES].store.revoke_key(name, int(key_id))
    app[SERVICES].auth.clear()
    return int(key_id)


async def revoke_key(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    revoked = revoke_user_key(request.app, name, request.match_info["key_id"])
    return web.json_response({"user": name, "revoked": revoked})


# -- backends ----------------------------------------------------------------------------


async def list_backends(request: web.Request) -> web.Response:
    app = request.app
    return web.json_response([backend_dict(app, e) for e in app[SERVICES].registry.entries.values()])


async def add_backend(request: web.Request) -> web.Response:
    return web.json_response(await create_backend(request.app, await json_body(request)), status=201)


async def create_backend(app: web.Application, data: dict[str, Any]) -> dict[str, Any]:
    """Add a backend (the admin API and the web UI) and wait a little for its first probe; its row."""
    fields = {
        k: data[k]
        for k in ("max_concurrent", "gpus", "node", "priority", "parallel", "max_loaded")
        if data.get(k) is not None
    }
    row = app[SERVICES].store.add_backend(data.get("name"), data.get("url"), data.get("engine"), **fields)
    entry = app[SERVICES].registry.add(row)
    wait = app[SERVICES].config.backends.connect_timeout + 1
    if entry.task is not None:  # a standby router does not probe (process/roles.py)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(entry.probed.wait(), wait)
    if row.node:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(app[SERVICES].gpus.poll_node(row.node), wait)
    return backend_dict(app, entry)


def set_backend_state(app: web.Application, name: str, state: str) -> dict[str, Any]:
    """Drain (``"draining"``) or enable (``"enabled"``) a backend (the admin API and the web UI); its row."""
    row = app[SERVICES].store.set_backend_state(name, state)
    registry = app[SERVICES].registry
    registry.update_row(row)
    if state == "draining":
        registry.released(row.id)
    app[SERVICES].dispatcher.pump()
    return registry.row_dict(registry.entries[row.id])


async def drain_backend(request: web.Request) -> web.Response:
    """Refused while it is the last backend of a model, unless ``{"force": true}``; the row then names those models
    (``models_left_without``)."""
    data = await json_body(request) if request.body_exists else {}
    name = request.match_info["name"]
    if data.get("force") is not True:
        refuse_orphaning(request.app, name)
    left = models_left_without(request.app, name)
    return web.json_response({**set_backend_state(request.app, name, "draining"), "models_left_without": left})


async def enable_backend(request: web.Request) -> web.Response:
    return web.json_response(set_backend_state(request.app, request.match_info["name"], "enabled"))


async def remove_backend(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    await delete_backend(request.app, name)
    return web.json_response({"removed": name})


async def delete_backend(app: web.Application, name: str) -> None:
    """Remove a backend (the admin API and the web UI); its usage rows stay under its id."""
    row = app[SERVICES].store.get_backend(name)
    app[SERVICES].store.remove_backend(name)
    await app[SERVICES].registry.remove(row.id)


async def list_models(request: web.Request) -> web.Response:
    rows = [
        {
            "model": model.name,
            "backends": [e.row.name for e, _ in model.on],
            "loaded_on": [e.row.name for e, _ in model.loaded_on()],
        }
        for model in pool_models(request.app).values()
    ]
    return web.json_response(rows)


def setup_admin_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/admin/groups", list_groups)
    r.add_post("/admin/groups", add_group)
    r.add_put("/admin/groups/{name}", set_group)
    r.add_delete("/admin/groups/{name}", remove_group)
    r.add_get("/admin/users", list_users)
    r.add_post("/admin/users", add_user)
    r.add_put("/admin/users/{name}", set_user)
    r.add_delete("/admin/users/{name}", remove_user)
    r.add_post("/admin/users/{name}/keys", create_key)
    r.add_get("/admin/users/{name}/keys", list_keys)
    r.add_delete("/admin/users/{name}/keys/{key_id}", revoke_key)
    r.add_get("/admin/backends", list_backends)
    r.add_post("/admin/backends", add_backend)
    r.add_put("/admin/backends/{name}", set_backend)
    r.add_post("/admin/backends/{name}/drain", drain_backend)
    r.add_post("/admin/backends/{name}/enable", enable_backend)
    r.add_delete("/admin/backends/{name}", remove_backend)
    r.add_get("/admin/models", list_models)
    setup_watch_routes(app)
    setup_alias_routes(app)
