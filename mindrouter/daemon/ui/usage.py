"""The usage page: tokens, requests and GPU time per person, group, model or backend over days, as SVG
charts (``charts.py``), and each quota's burn-down: how much is used, how much of its period is gone,
and when it runs out at the pace so far.

It reads ``mr usage``'s report (``Store.usage_report``) and the quotas' own counters, so the page,
``mr usage`` and a refused request agree.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ...localtime import day_key, day_start, month_start
from ..edge.services import QUOTAS, STORE
from .charts import burn, stacked
from .render import admin_page, page
from .sessions import Session

__all__ = ["setup_usage_page"]

BY = ("user", "group", "model", "backend")
METRICS = {"tokens": "tokens", "requests": "requests", "gpu_seconds": "GPU seconds"}
SPANS = (7, 30, 90)
DAY = 86400.0


def _choice(request: web.Request, key: str, allowed: Any, default: Any) -> Any:
    raw = request.query.get(key)
    for value in allowed:
        if str(value) == raw:
            return value
    return default


def _amount(row: dict[str, Any], metric: str) -> float:
    if metric == "tokens":
        return float(row["prompt_tokens"] + row["completion_tokens"])
    return float(row[metric])


def burn_downs(app: web.Application, now: float) -> list[dict[str, Any]]:
    """Every token quota with its burn-down, the nearest to its limit first."""
    rows = []
    for limit in app[QUOTAS].overview():
        if limit.kind == "requests_per_minute":
            continue
        start = day_start(now) if limit.kind == "tokens_per_day" else month_start(now)
        rows.append({**limit.to_dict(), **burn(limit.used, limit.limit, start, limit.resets, now)})
    rows.sort(key=lambda r: -float(r["used"] / r["limit"] if r["limit"] else 0))
    return rows


@admin_page
async def usage(request: web.Request, session: Session) -> web.StreamResponse:
    app = request.app
    by = _choice(request, "by", BY, "user")
    metric = _choice(request, "metric", METRICS, "tokens")
    span = _choice(request, "days", SPANS, 30)
    now = app[QUOTAS].wall()
    since = day_start(now - (span - 1) * DAY)
    report = app[STORE].usage_report([by, "day"], since, now + 1e-3)
    days = [day_key(since + (i + 0.5) * DAY) for i in range(span)]
    days = list(dict.fromkeys(days))  # a day of 23 or 25 hours may repeat or skip a key: keep each once
    values: dict[tuple[str, str], float] = {}
    totals: dict[str, dict[str, float]] = {}
    for row in report.rows:
        name = str(row[by])
        values[(name, str(row["day"]))] = values.get((name, str(row["day"])), 0.0) + _amount(row, metric)
        total = totals.setdefault(name, {"requests": 0, "tokens": 0, "gpu_seconds": 0.0})
        total["requests"] += row["requests"]
        total["tokens"] += row["prompt_tokens"] + row["completion_tokens"]
        total["gpu_seconds"] += row["gpu_seconds"]
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][metric])
    return page(
        request,
        "usage.html",
        session,
        by=by,
        metric=metric,
        span=span,
        choices={"by": BY, "metric": METRICS, "days": SPANS},
        chart=stacked(days, values, METRICS[metric]),
        rows=ranked[:50],
        hidden=max(0, len(ranked) - 50),
        total=report.total,
        quotas=burn_downs(app, now)[:30],
    )


def setup_usage_page(app: web.Application) -> None:
    app.router.add_get("/ui/admin/usage", usage)
