"""Server-rendered charts for the web UI: plain numbers laid out as SVG shapes, drawn by templates/charts.html.

No script and no CDN (the pages' Content-Security-Policy allows neither): a chart is rectangles
and polylines with their coordinates computed here, coloured by CSS classes from ui.css. Pure
functions of plain values, so each is tested without a daemon.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Bar", "Stacked", "burn", "sparkline", "stacked"]

SERIES = 7
"""Subjects drawn in a colour of their own; the rest are summed as "others"."""


@dataclass(frozen=True, slots=True)
class Bar:
    """One rectangle of a stacked bar chart, in the chart's 0..100 by 0..40 view box."""

    x: float
    y: float
    width: float
    height: float
    series: int
    title: str


@dataclass(frozen=True, slots=True)
class Stacked:
    days: list[str]
    names: list[str]
    """The legend: series i is ``names[i]`` (the last may be "others")."""
    bars: list[Bar]
    peak: float
    """The tallest day's total: the top of the chart."""


def stacked(days: Sequence[str], values: Mapping[tuple[str, str], float], label: str) -> Stacked:
    """A bar per day, stacked by subject: the ``SERIES`` largest subjects over all days, then the others together.

    Args:
        days: the days along the axis, oldest first.
        values: (subject, day) -> amount.
        label: the unit in each bar's title ("tokens").
    """
    totals: dict[str, float] = {}
    for (name, _), v in values.items():
        totals[name] = totals.get(name, 0.0) + v
    ranked = sorted(totals, key=lambda n: (-totals[n], n))
    names = ranked[:SERIES]
    series = {n: i for i, n in enumerate(names)}
    if len(ranked) > SERIES:
        names.append("others")
    per_day: dict[str, list[float]] = {d: [0.0] * len(names) for d in days}
    for (name, day), v in values.items():
        if day in per_day:
            per_day[day][series.get(name, len(names) - 1)] += v
    peak = max((sum(v) for v in per_day.values()), default=0.0)
    width = 100 / max(1, len(days))
    bars = []
    for i, day in enumerate(days):
        y = 40.0
        for s, v in enumerate(per_day[day]):
            if v <= 0 or peak <= 0:
                continue
            h = v / peak * 38
            y -= h
            bars.append(Bar(i * width + width * 0.1, y, width * 0.8, h, s, f"{day} {names[s]}: {v:,.0f} {label}"))
    return Stacked(list(days), names, bars, peak)


def sparkline(values: Sequence[float]) -> str:
    """``points`` of a polyline over a 0..100 by 0..20 view box (0 at the bottom); empty for no values."""
    if not values:
        return ""
    peak = max(values) or 1.0
    step = 100 / max(1, len(values) - 1)
    return " ".join(f"{i * step:.1f},{20 - v / peak * 18:.1f}" for i, v in enumerate(values))


def burn(used: float, limit: float, start: float, end: float, now: float) -> dict[str, float | None]:
    """A quota's burn-down: the share used, the share of its period gone, and when it runs out at this pace.

    Returns:
        ``used`` and ``elapsed`` as fractions, and ``runs_out`` (epoch seconds) when the pace so far
        reaches the limit before the period ends, else None.
    """
    elapsed = min(1.0, max(0.0, (now - start) / (end - start))) if end > start else 1.0
    share = used / limit if limit > 0 else 0.0
    runs_out = None
    if used > 0 and now > start and share < 1:
        at = start + (now - start) * limit / used
        runs_out = at if at < end else None
    return {"used": share, "elapsed": elapsed, "runs_out": runs_out}
