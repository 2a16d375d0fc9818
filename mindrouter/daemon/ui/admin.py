"""The admin pages that show the pool: Live (queue and shares), Groups with their people's shares, decisions.

The forms that change the pool are in ``people_forms.py`` and ``backend_forms.py``; this
module registers them with its own pages.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from ...explain import PRIORITY_TERMS, SCORE_TERMS, busy_is_cache, ended, lost_by
from ...formats import fmt_duration, fmt_num, fmt_time
from ..admin.views import share_view
from ..admin.watch import backend_names, status_dict
from ..edge.services import SERVICES
from .backend_forms import setup_backend_forms
from .charts import sparkline
from .import_form import setup_import_form
from .people_forms import setup_people_forms
from .render import admin_page, page
from .sessions import Session
from .usage import setup_usage_page

__all__ = ["setup_admin_pages"]


def _shares(app: web.Application) -> dict[str, Any]:
    """``mr share``'s figures for the people active now, without quotas (which no page here shows): Live and
    Groups list only those, so they read those rows and count the rest (at 10,000 users each read all: 110 ms)."""
    store = app[SERVICES].store
    share = app[SERVICES].scheduler.share(app[SERVICES].dispatcher.clock(), active=True)
    people = store.users_by_id(u.user_id for u in share.users)
    members = store.users_per_group()
    return share_view(share, people, store.list_groups(), members, lambda _kind, _key: [], backend_names(app))


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
    queue = (
        app[SERVICES].scheduler.queue_stats(app[SERVICES].dispatcher.clock()).to_dict()
    )  # not `mr queue`'s: it adds every share
    return page(
        request,
        "top.html",
        session,
        pool=status_dict(app),
        queue=queue,
        waiting=_waiting(queue),
        backends=_backends(app),
        active=active[:50],
        hidden=max(0, len(active) - 50),
        pools=_pools(share) if len(share["pools"]) > 1 else [],
        decisions=decision_rows(app[SERVICES].decisions.recent(10)),
        refresh=True,
    )


def _waiting(queue: Mapping[str, Any]) -> list[tuple[str, int, float]]:
    """(person, requests queued, the oldest one's wait in seconds), the most waiting first; at most 20."""
    oldest = queue.get("oldest_wait_by_user_model") or {}
    rows = [(name, n, max((oldest.get(name) or {}).values(), default=0.0)) for name, n in queue["by_user_name"].items()]
    return sorted(rows, key=lambda r: (-r[1], r[0]))[:20]


def _backends(app: web.Application) -> list[dict[str, Any]]:
    """Each backend as Live shows it: its row, its tokens/s over the last minutes as a sparkline, and what
    its busy figure measures (a GPU's utilization, or an engine's KV-cache fill where it has no GPU named)."""
    registry = app[SERVICES].registry
    rates = app[SERVICES].stats.throughput()
    rows = []
    for bid, entry in registry.entries.items():
        row = registry.row_dict(entry)
        series = rates.get(bid, [])
        vram = row["vram_total"] and row["vram_free"] is not None
        used = 1 - row["vram_free"] / row["vram_total"] if vram else None
        rows.append(
            {
                **row,
                "spark": sparkline(series),
                "tps_now": series[-1] if series else 0.0,
                "busy_label": "KV cache" if busy_is_cache(row) else "GPU",
                "vram_used": used,
            }
        )
    return sorted(rows, key=lambda r: str(r["name"]))


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


OUTCOMES = ("ok", "client_gone", "backend_failed", "timeout", "rejected", "error")
_FIELDS = {"model": "model", "backend": "selected_backend", "outcome": "outcome"}
SEARCHED = 5000
"""Decisions searched for a filter by model, backend or outcome: the newest this many (of the user, if named)."""


def decision_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Newest first, each with its local time and its wait in units, for the pages' decision tables."""
    return [
        {
            **r,
            "at": time.strftime("%H:%M:%S", time.localtime(r["wall_time"])) if r.get("wall_time") else "",
            "day": time.strftime("%Y-%m-%d", time.localtime(r["wall_time"])) if r.get("wall_time") else "",
            "wait": fmt_duration(r.get("queue_wait")) if r.get("queue_wait") is not None else "–",
        }
        for r in reversed(records)
    ]


@admin_page
async def decisions(request: web.Request, session: Session) -> web.StreamResponse:
    q = request.query
    wanted = {k: (q.get(k) or "").strip() for k in ("user", "model", "backend", "outcome")}
    fields = {key: wanted[name] for name, key in _FIELDS.items() if wanted[name]}
    rows = request.app[SERVICES].decisions.recent(100, user=wanted["user"] or None, fields=fields, searched=SEARCHED)
    names = sorted(backend_names(request.app).values())
    context: dict[str, Any] = {"filters": wanted, "outcomes": OUTCOMES, "backend_choices": names, "searched": SEARCHED}
    return page(request, "decisions.html", session, decisions=decision_rows(rows), **context)


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
    setup_usage_page(app)
    setup_import_form(app)
