"""A backend changed in place (``PUT /admin/backends/{name}``), and what a drain would leave without a backend.

A change keeps the backend's id, so its usage and decision records stay under its name (``rm`` then
``add`` gave it a new id, and ``mr usage --by backend`` two rows). Its URL and engine are not settings
of the same server: another server is added as another backend.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web

from ...backends import model_key
from ...store import InUse, InvalidValue
from ..edge.services import SERVICES

__all__ = ["SETTABLE", "backend_dict", "change_backend", "models_left_without", "refuse_orphaning", "set_backend"]

SETTABLE = ("max_concurrent", "parallel", "max_loaded", "gpus", "node", "priority")
"""What ``PUT /admin/backends/{name}`` changes; null clears ``parallel``, ``max_loaded``, ``gpus`` and ``node``."""
_CLEARED: dict[str, Any] = {"parallel": None, "max_loaded": None, "gpus": [], "node": ""}


def backend_dict(app: web.Application, entry: Any) -> dict[str, Any]:
    """A backend's row, with ``node_error`` when its ``mr agent`` does not answer (also in ``error`` if free)."""
    row = app[SERVICES].registry.row_dict(entry)
    node_error = app[SERVICES].gpus.node_error(entry.row.node) if entry.row.node else None
    row["node_error"] = node_error
    if node_error and not row.get("error"):
        row["error"] = node_error
    return row


async def change_backend(app: web.Application, name: str, data: dict[str, Any]) -> dict[str, Any]:
    """Set the given settings of backend ``name`` (the admin API and the web UI); its row, once its agent answered.

    Raises:
        InvalidValue: an unknown setting, the URL or engine, or a bad value; nothing is changed.
        NotFound: no backend ``name``.
    """
    unknown = sorted(set(data) - set(SETTABLE))
    if unknown and unknown[0] in ("url", "engine"):
        raise InvalidValue(
            f"cannot change the {unknown[0]} of backend {name!r}: that is another server; add it with "
            f"`mr backend add` and remove this one with `mr backend rm {name}`"
        )
    if unknown:
        raise InvalidValue(f"{unknown[0]!r} is not a backend setting; change any of {', '.join(SETTABLE)}")
    if not data:
        raise InvalidValue(f"give at least one setting to change: {', '.join(SETTABLE)}")
    changes: dict[str, Any] = {}
    for key, value in data.items():
        if value is None and key not in _CLEARED:
            raise InvalidValue(f"{key} of backend {name!r} cannot be cleared; give a value")
        changes[key] = _CLEARED[key] if value is None else value
    store, registry = app[SERVICES].store, app[SERVICES].registry
    was = store.get_backend(name)
    row = store.update_backend(name, **changes)
    registry.update_row(row)
    app[SERVICES].dispatcher.pump()  # more slots may take waiting work at once
    if row.node and row.node != was.node:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(
                app[SERVICES].gpus.poll_node(row.node), app[SERVICES].config.backends.connect_timeout + 1
            )
    return backend_dict(app, registry.entries[row.id])


async def set_backend(request: web.Request) -> web.Response:
    try:
        data = await request.json()
    except ValueError:
        raise InvalidValue("the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidValue('the request body must be a JSON object of settings, such as {"max_concurrent": 8}')
    return web.json_response(await change_backend(request.app, request.match_info["name"], data))


def models_left_without(app: web.Application, name: str) -> list[str]:
    """The models that no backend but ``name`` takes requests for now: draining it leaves them none."""
    scheduler, store = app[SERVICES].scheduler, app[SERVICES].store
    this = scheduler.backend(store.get_backend(name).id)
    if this is None:
        return []
    others = [
        b
        for b in (scheduler.backend(bid) for bid in app[SERVICES].registry.entries)
        if b is not None and b.id != this.id
    ]
    served = {model_key(m) for b in others if b.takes_work for m in b.models}
    return sorted(m for m in this.models if model_key(m) not in served)


def refuse_orphaning(app: web.Application, name: str) -> None:
    """Refuse to drain ``name`` while it is the last backend of a model, naming the models.

    Raises:
        InUse: draining it would fail every new request for those models at once.
    """
    left = models_left_without(app, name)
    if left:
        them = "it" if len(left) == 1 else "them"
        raise InUse(
            f"draining {name} would leave {_and(left)} without a backend, so every request for {them} would fail; "
            f"add a backend that serves {them} first, or drain anyway with `mr backend drain {name} --force`"
        )


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
