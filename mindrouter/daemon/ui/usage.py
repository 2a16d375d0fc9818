"""The usage page: tokens, requests and GPU time per person, group, model or backend over days, as SVG
charts (``charts.py``), and each quota's burn-down: how much is used, how much of its period is gone,
and when it runs out at the pace so far.

It reads ``mr usage``'s report (``Store.usage_report``) and the quotas' own counters, so the page,
``mr usage`` and a refused request agree. The days before today are read once per grouping and kept
for ``PAST_TTL`` (a finished day's totals do not change): with 1,000 users over 30 days that report
took a second of SQLite's time, and only today's rows are read on each load.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ...localtime import day_key, day_start, month_start
from ..edge.services import SERVICES
from .charts import burn, stacked, top_series
from .render import admin_page, page
from .sessions import Session

__all__ = ["setup_usage_page"]

BY = ("user", "group", "model", "backend")
PAST_TTL = 600.0
"""Seconds the days before today are kept per grouping before they are read again (a renamed user shows then)."""
PAST = web.AppKey("ui_usage_past", dict)
"""(grouping, first day) -> (today's start, when read, ``Sums`` of the days before today)."""
METRICS = {"tokens": "tokens", "requests": "requests", "gpu_seconds": "GPU seconds"}
SPANS = (7, 30, 90)
DAY = 86400.0


def _choice(request: web.Request, key: str, allowed: Any, default: Any) -> Any:
    raw = request.query.get(key)
    for value in allowed:
        if str(value) == raw:
            return value
    return default


Cells = dict[tuple[str, str], list[float]]
"""(subject, day) -> [requests, tokens, GPU seconds]."""
Sums = tuple[Cells, dict[str, list[float]], dict[str, list[float]]]
"""(cells, subject -> the same over the span, day -> the same over every subject)."""


def _add(sums: Sums, rows: list[tuple[str, str, int, int, float]]) -> Sums:
    cells, totals, days = sums
    for name, day, *amounts in rows:
        cell = cells.setdefault((name, day), [0.0, 0.0, 0.0])
        total = totals.setdefault(name, [0.0, 0.0, 0.0])
        daily = days.setdefault(day, [0.0, 0.0, 0.0])
        for i, amount in enumerate(amounts):
            cell[i] += amount
            total[i] += amount
            daily[i] += amount
    return sums


def _merged(a: dict[str, list[float]], b: dict[str, list[float]]) -> dict[str, list[float]]:
    out = {k: list(v) for k, v in a.items()}
    for k, v in b.items():
        out[k] = [x + y for x, y in zip(out.get(k, [0.0, 0.0, 0.0]), v, strict=True)]
    return out


def _sums(app: web.Application, by: str, since: float, now: float) -> tuple[Sums, Sums]:
    """Usage per subject and day from ``since`` to now: (the days before today as summed when last read,
    at most ``PAST_TTL`` ago; today's, read now). Today's day is none of the past's, so their cells never meet."""
    store, today = app[SERVICES].store, day_start(now)

    def read(start: float, until: float) -> list[tuple[str, str, int, int, float]]:
        if until <= start:
            return []
        report = store.usage_report([by, "day"], start, until)
        return [
            (str(r[by]), str(r["day"]), r["requests"], r["prompt_tokens"] + r["completion_tokens"], r["gpu_seconds"])
            for r in report.rows
        ]

    key = (by, since)
    past = app[PAST].get(key)
    if past is None or past[0] != today or now - past[1] > PAST_TTL:
        for stale in [k for k, v in app[PAST].items() if v[0] != today]:  # yesterday's spans are never asked again
            del app[PAST][stale]
        past = app[PAST][key] = (today, now, _add(({}, {}, {}), read(since, today)))
    return past[2], _add(({}, {}, {}), read(today, now + 1e-3))


def burn_downs(app: web.Application, now: float) -> list[dict[str, Any]]:
    """Every token quota with its burn-down, the nearest to its limit first."""
    rows = []
    for limit in app[SERVICES].quotas.overview():
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
    now = app[SERVICES].quotas.wall()
    since = day_start(now - (span - 1) * DAY)
    column = {"requests": 0, "tokens": 1, "gpu_seconds": 2}[metric]
    (cells, past_totals, past_days), (fresh, today_totals, today_days) = _sums(app, by, since, now)
    sums = _merged(past_totals, today_totals)
    totals = {name: dict(zip(("requests", "tokens", "gpu_seconds"), t, strict=True)) for name, t in sums.items()}
    days = [day_key(since + (i + 0.5) * DAY) for i in range(span)]
    days = list(dict.fromkeys(days))  # a day of 23 or 25 hours may repeat or skip a key: keep each once
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][metric])

    def amount(name: str, day: str) -> float:
        cell = cells.get((name, day)) or fresh.get((name, day))
        return cell[column] if cell else 0.0

    series = top_series(
        {n: t[column] for n, t in sums.items()},
        amount,
        {d: v[column] for d, v in _merged(past_days, today_days).items()},
        days,
    )
    return page(
        request,
        "usage.html",
        session,
        by=by,
        metric=metric,
        span=span,
        choices={"by": BY, "metric": METRICS, "days": SPANS},
        chart=stacked(days, series, METRICS[metric]),
        rows=ranked[:50],
        hidden=max(0, len(ranked) - 50),
        total={k: sum(t[k] for t in totals.values()) for k in ("requests", "tokens", "gpu_seconds")},
        quotas=burn_downs(app, now)[:30],
    )


def setup_usage_page(app: web.Application) -> None:
    app[PAST] = {}
    app.router.add_get("/ui/admin/usage", usage)
