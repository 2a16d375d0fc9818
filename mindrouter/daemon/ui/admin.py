"""The admin pages that show the pool: Live (queue and shares), Groups with their people's shares, decisions.

The forms that change the pool are in ``people_forms.py`` and ``backend_forms.py``; this
module registers them with its own pages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from ...explain import PRIORITY_TERMS, SCORE_TERMS, ended, lost_by
from ...formats import fmt_duration, fmt_num, fmt_time
from ..admin.views import share_view
from ..admin.watch import backend_names, queue_dict, status_dict
from ..edge.services import SERVICES
from .backend_forms import setup_backend_forms
from .people_forms import setup_people_forms
from .render import admin_page, page
from .sessions import Session

__all__ = ["setup_admin_pages"]


def _shares(app: web.Application) -> dict[str, Any]:
    """``mr share``'s figures without each subject's quotas (which no page here shows), so 1,000 users stay cheap."""
    store = app[SERVICES].store
    share = app[SERVICES].scheduler.share(app[SERVICES].dispatcher.clock(), active=True)
    return share_view(share, store.list_users(), store.list_groups(), lambda _kind, _key: [], backend_names(app))


@admin_page
async def groups(request: web.Request, session: Session) -> web.StreamResponse:
    app = request.app
    rows = app[SERVICES].store.list_groups()
    shares = _shares(app)
    share = {g["name"]: g for g in shares["groups"]}
    people: dict[str, list[dict[str, Any]]] = {}
    for u in _active(shares):
        people.setdefault(u["group"], []).append(u)
    return page(request, "groups.html", session, groups=rows, share=share, people=people)


def _active(shares: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The people with demand now (a target) or work queued or running, heaviest first."""
    active = [u for u in shares["users"] if u["target_share"] is not None or u["queued"] or u["running"]]
    return sorted(active, key=lambda u: (-u["recent_units"], u["name"]))


@admin_page
async def top(request: web.Request, session: Session) -> web.StreamResponse:
    app = request.app
    share = _shares(app)
    active = _active(share)
    return page(
        request,
        "top.html",
        session,
        pool=status_dict(app),
        queue=queue_dict(app)["queue"],
        active=active[:50],
        hidden=max(0, len(active) - 50),
        pools=_pools(share) if len(share["pools"]) > 1 else [],
        decisions=app[SERVICES].decisions.recent(10),
        refresh=True,
    )


def _pools(shares: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each pool of backends with the people who have a target in it, for Live where pools differ."""
    rows: dict[tuple[str, ...], dict[str, Any]] = {}
    for u in shares["users"]:
        for seat in u["pools"]:
            if seat["target_share"] is None:
                continue
            key = tuple(seat["backends"])
            label = ", ".join(seat["names"])
            rows.setdefault(key, {"label": label, "people": []})["people"].append({**seat, "name": u["name"]})
    return sorted(rows.values(), key=lambda p: str(p["label"]))


@admin_page
async def decisions(request: web.Request, session: Session) -> web.StreamResponse:
    user_name = request.query.get("user") or None
    rows = request.app[SERVICES].decisions.recent(100, user=user_name)
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
    record = request.app[SERVICES].decisions.get(rid)
    if record is None:
        return page(request, "error.html", session, 404, message=f"No decision record for request {rid!r}.")
    return page(request, "why.html", session, rid=rid, **explain(record, backend_names(request.app)))


def setup_admin_pages(app: web.Application) -> None:
    r = app.router
    r.add_get("/ui/admin/", top)
    r.add_get("/ui/admin/top", top)
    r.add_get("/ui/admin/groups", groups)
    r.add_get("/ui/admin/decisions", decisions)
    r.add_get("/ui/admin/decisions/{request_id}", why)
    setup_people_forms(app)
    setup_backend_forms(app)
