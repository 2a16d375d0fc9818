"""The admin pages: groups and weights, users and keys, backends, the live queue and shares, decisions.

Every change goes through the admin API's own function (``daemon/admin/api.py``,
``daemon/request/accounting.py``), so a form and ``mr`` validate alike and fail with
the same sentence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from ...explain import PRIORITY_TERMS, SCORE_TERMS, ended, lost_by
from ...formats import fmt_duration, fmt_num, fmt_time
from ...store import QUOTA_FIELDS, NotFound
from ..admin import api
from ..admin.views import share_view
from ..admin.watch import queue_dict, quota_rows, status_dict
from ..process.appkeys import AUTH, DECISIONS, DISPATCHER, REGISTRY, SCHEDULER, STORE
from ..request.accounting import change_quota
from .render import action, admin_page, page
from .sessions import Session

__all__ = ["setup_admin_pages"]


def _field(form: Any, name: str) -> str:
    value = form.get(name, "")
    return value.strip() if isinstance(value, str) else ""


def _shares(app: web.Application) -> dict[str, Any]:
    """``mr share``'s figures without each subject's quotas (which no page here shows), so 1,000 users stay cheap."""
    store = app[STORE]
    share = app[SCHEDULER].share(app[DISPATCHER].clock(), active=True)
    return share_view(share, store.list_users(), store.list_groups(), lambda _kind, _key: [])


@admin_page
async def groups(request: web.Request, session: Session) -> web.StreamResponse:
    app = request.app
    rows = app[STORE].list_groups()
    share = {g["name"]: g for g in _shares(app)["groups"]}
    return page(request, "groups.html", session, groups=rows, share=share)


@admin_page
@action("/ui/admin/groups")
async def set_group_weight(request: web.Request, session: Session) -> str:
    name = request.match_info["name"]
    group = api.change_group_weight(request.app, name, _field(await request.post(), "weight"))
    return f"group {name} now weighs {group.scheduler_weight:g}"


@admin_page
async def users(request: web.Request, session: Session) -> web.StreamResponse:
    store = request.app[STORE]
    return page(request, "users.html", session, users=store.list_users(), keys=api.key_counts(store))


@admin_page
async def user(request: web.Request, session: Session) -> web.StreamResponse:
    return _user_page(request, session)


def _user_page(request: web.Request, session: Session, new_key: str | None = None) -> web.Response:
    app = request.app
    store = app[STORE]
    app[AUTH].flush()  # the keys' last-used times, as `mr user keys` shows them
    try:
        row = store.get_user(request.match_info["name"])
    except NotFound as exc:
        return page(request, "error.html", session, 404, message=str(exc))
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
@action("/ui/admin/users/{name}")
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
@action("/ui/admin/users/{name}")
async def set_user_quota(request: web.Request, session: Session) -> str:
    name = request.match_info["name"]
    form = await request.post()
    change_quota(request.app, "user", name, {f: _quota_value(_field(form, f)) for f in QUOTA_FIELDS})
    return f"quotas of {name} saved"


@admin_page
@action("/ui/admin/users/{name}")
async def revoke_key(request: web.Request, session: Session) -> str:
    name = request.match_info["name"]
    key_id = api.revoke_user_key(request.app, name, request.match_info["key_id"])
    return f"key {key_id} of {name} revoked"


@admin_page
async def create_key(request: web.Request, session: Session) -> web.StreamResponse:
    """A new key, shown on this one answer only (never stored in plain, never in a URL or a later page)."""
    try:
        key = api.new_key(request.app, request.match_info["name"])
    except NotFound:
        return _user_page(request, session)  # which says, with a 404, that there is no such user
    return _user_page(request, session, new_key=key)


@admin_page
async def backends(request: web.Request, session: Session) -> web.StreamResponse:
    registry = request.app[REGISTRY]
    rows = [registry.row_dict(e) for e in registry.entries.values()]
    return page(request, "backends.html", session, backends=rows)


@admin_page
@action("/ui/admin/backends")
async def backend_state(request: web.Request, session: Session) -> str:
    name, verb = request.match_info["name"], request.match_info["verb"]
    row = api.set_backend_state(request.app, name, "draining" if verb == "drain" else "enabled")
    return f"backend {name} is {row['status']}"


@admin_page
async def top(request: web.Request, session: Session) -> web.StreamResponse:
    app = request.app
    share = _shares(app)
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


def explain(record: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """``mr why``'s explanation as rows for a page: the same terms, meanings and sentences (``explain.py``)."""
    chosen = str(record.get("selected_backend_id"))

    def label(bid: str) -> str:
        return names.get(bid) or (str(record.get("selected_backend") or "") if bid == chosen else "") or f"#{bid}"

    terms = record.get("priority") if isinstance(record.get("priority"), Mapping) else {}
    fallback = {"weight": record.get("user_weight"), "deficit": record.get("user_deficit")}
    priority = [
        (term, fmt(terms.get(key, fallback.get(key))), meaning)  # type: ignore[union-attr]
        for key, term, meaning, fmt in PRIORITY_TERMS
    ]
    components = record.get("score_components") or {}
    scores = record.get("scores") or {}
    ids = [str(b) for b in record.get("candidate_backends") or []] or list(components) or list(scores)
    ids.sort(key=lambda b: -float((components.get(b) or {}).get("score", scores.get(b, 0)) or 0))
    best = components.get(chosen) or {}
    candidates = []
    for bid in ids:
        row = components.get(bid) or {}
        cells = [
            f"-{fmt_num(row[key], 1)}" if key == "penalty" and row.get(key) else fmt_num(row.get(key), 1)
            for key, _, _ in SCORE_TERMS
        ]
        lost = lost_by(row, best) if bid != chosen and row and best else ""
        evicts = ", ".join(map(str, row.get("evicts") or []))
        candidates.append(
            (label(bid), bid == chosen, fmt_num(row.get("score", scores.get(bid)), 1), cells, lost, evicts)
        )
    rejected = sorted(
        (label(str(bid)), "; ".join(map(str, why)) if isinstance(why, list) else str(why))
        for bid, why in (record.get("rejected") or {}).items()
    )
    return {
        "record": record,
        "backend": None if record.get("selected_backend_id") is None else label(chosen),
        "when": fmt_time(record.get("wall_time")) if record.get("wall_time") is not None else None,
        "waited": fmt_duration(record.get("queue_wait")),
        "ended": ended(record),
        "priority": priority,
        "score_terms": SCORE_TERMS,
        "candidates": candidates,
        "rejected": rejected,
    }


@admin_page
async def why(request: web.Request, session: Session) -> web.StreamResponse:
    """``mr why``'s explanation of one decision."""
    rid = request.match_info["request_id"]
    record = request.app[DECISIONS].get(rid)
    if record is None:
        return page(request, "error.html", session, 404, message=f"No decision record for request {rid!r}.")
    names = {str(bid): e.row.name for bid, e in request.app[REGISTRY].entries.items()}
    return page(request, "why.html", session, rid=rid, **explain(record, names))


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
