"""The admin pages: groups and weights, users and keys, backends, the live queue and shares, decisions.

Every change goes through the admin API's own function (``daemon/admin.py``,
``daemon/accounting.py``), so a form and ``mr`` validate alike and fail with
the same sentence.
"""

from __future__ import annotations

import io
from typing import Any

from aiohttp import web
from rich.console import Console

from ...cli.why import why_view
from ...store import QUOTA_FIELDS, NotFound
from .. import admin as api
from ..accounting import change_quota
from ..keys import DECISIONS, REGISTRY, STORE
from ..watch import queue_dict, quota_rows, share_dict, status_dict
from .render import action, admin_page, page
from .sessions import Session

__all__ = ["setup_admin_pages"]


def _field(form: Any, name: str) -> str:
    value = form.get(name, "")
    return value.strip() if isinstance(value, str) else ""


@admin_page
async def groups(request: web.Request, session: Session) -> web.StreamResponse:
    app = request.app
    rows = app[STORE].list_groups()
    share = {g["name"]: g for g in share_dict(app)["groups"]}
    return page(request, "groups.html", session, groups=rows, share=share)


@admin_page
@action
async def set_group_weight(request: web.Request, session: Session) -> str:
    name = request.match_info["name"]
    group = api.change_group_weight(request.app, name, _field(await request.post(), "weight"))
    return f"group {name} now weighs {group.scheduler_weight:g}"


@admin_page
async def users(request: web.Request, session: Session) -> web.StreamResponse:
    store = request.app[STORE]
    keys: dict[str, int] = {}
    for key in store.list_keys():
        keys[key.user] = keys.get(key.user, 0) + 1
    return page(request, "users.html", session, users=store.list_users(), keys=keys)


@admin_page
async def user(request: web.Request, session: Session, *, new_key: str | None = None) -> web.StreamResponse:
    app = request.app
    store = app[STORE]
    try:
        row = store.get_user(request.match_info["name"])
    except NotFound as exc:
        return page(request, "error.html", session, 404, message=str(exc).strip("'\""))
    return page(
        request,
        "user.html",
        session,
        user=row,
        groups=store.list_groups(),
        keys=store.list_keys(row.name),
        quotas=quota_rows(app, "user", row.id),
        quota_fields=QUOTA_FIELDS,
        new_key=new_key,
    )


@admin_page
@action
async def set_user(request: web.Request, session: Session) -> str:
    name = request.match_info["name"]
    form = await request.post()
    weight = _field(form, "weight_override")
    changes: dict[str, Any] = {"group": _field(form, "group"), "weight": weight or None}
    row = api.change_user(request.app, name, changes)
    return f"user {name} is in group {row.group} with weight {row.weight:g}"


def _quota_value(raw: str) -> int | str | None:
    """A form's quota: blank removes it, a whole number sets it; anything else goes to the store, which refuses it."""
    if not raw:
        return None
    return int(raw) if raw.isdigit() else raw


@admin_page
@action
async def set_user_quota(request: web.Request, session: Session) -> str:
    name = request.match_info["name"]
    form = await request.post()
    change_quota(request.app, "user", name, {f: _quota_value(_field(form, f)) for f in QUOTA_FIELDS})
    return f"quotas of {name} saved"


@admin_page
@action
async def revoke_key(request: web.Request, session: Session) -> str:
    name = request.match_info["name"]
    key_id = api.revoke_user_key(request.app, name, request.match_info["key_id"])
    return f"key {key_id} of {name} revoked"


@admin_page
async def create_key(request: web.Request, session: Session) -> web.StreamResponse:
    """A new key, shown on this one answer only (never stored in plain, never in a URL or a later page)."""
    key = api.new_key(request.app, request.match_info["name"])
    return await user.__wrapped__(request, session, new_key=key)  # type: ignore[attr-defined]


@admin_page
async def backends(request: web.Request, session: Session) -> web.StreamResponse:
    registry = request.app[REGISTRY]
    rows = [registry.row_dict(e) for e in registry.entries.values()]
    return page(request, "backends.html", session, backends=rows)


@admin_page
@action
async def backend_state(request: web.Request, session: Session) -> str:
    name, verb = request.match_info["name"], request.match_info["verb"]
    row = api.set_backend_state(request.app, name, "draining" if verb == "drain" else "enabled")
    return f"backend {name} is {row['status']}"


@admin_page
async def top(request: web.Request, session: Session) -> web.StreamResponse:
    app = request.app
    share = share_dict(app)
    active = [u for u in share["users"] if u["queued"] or u["running"] or u["recent_tokens"]]
    active.sort(key=lambda u: -u["recent_tokens"])
    return page(
        request,
        "top.html",
        session,
        pool=status_dict(app),
        queue=queue_dict(app)["queue"],
        active=active[:50],
        hidden=max(0, len(active) - 50),
        decisions=app[DECISIONS].recent(10),
        refresh=True,
    )


@admin_page
async def decisions(request: web.Request, session: Session) -> web.StreamResponse:
    user_name = request.query.get("user") or None
    rows = request.app[DECISIONS].recent(100, user=user_name)
    return page(request, "decisions.html", session, decisions=rows, user=user_name or "")


@admin_page
async def why(request: web.Request, session: Session) -> web.StreamResponse:
    """``mr why``'s explanation, drawn by the same code into HTML."""
    rid = request.match_info["request_id"]
    record = request.app[DECISIONS].get(rid)
    if record is None:
        return page(request, "error.html", session, 404, message=f"No decision record for request {rid!r}.")
    names = {str(bid): e.row.name for bid, e in request.app[REGISTRY].entries.items()}
    console = Console(record=True, width=140, file=io.StringIO(), color_system=None)
    console.print(why_view(record, names))
    return page(request, "why.html", session, rid=rid, explanation=console.export_text())


def setup_admin_pages(app: web.Application) -> None:
    r = app.router
    r.add_get("/ui/admin/", top)
    r.add_get("/ui/admin/top", top)
    r.add_get("/ui/admin/groups", groups)
    r.add_post("/ui/admin/groups/{name}/weight", set_group_weight)
    r.add_get("/ui/admin/users", users)
    r.add_get("/ui/admin/users/{name}", user)
    r.add_post("/ui/admin/users/{name}", set_user)
    r.add_post("/ui/admin/users/{name}/quota", set_user_quota)
    r.add_post("/ui/admin/users/{name}/keys", create_key)
    r.add_post("/ui/admin/users/{name}/keys/{key_id}/revoke", revoke_key)
    r.add_get("/ui/admin/backends", backends)
    r.add_post("/ui/admin/backends/{name}/{verb:drain|enable}", backend_state)
    r.add_get("/ui/admin/decisions", decisions)
    r.add_get("/ui/admin/decisions/{request_id}", why)
