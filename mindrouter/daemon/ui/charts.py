"""Server-rendered charts for the web UI: plain numbers laid out as SVG shapes, drawn by templates/charts.html.

No script and no CDN (the pages' Content-Security-Policy allows neither): a chart is rectangles
and polylines with their coordinates computed here, coloured by CSS classes from ui.css. Pure
functions of plain values, so each is tested without a daemon.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Bar", "Stacked", "burn", "sparkline", "stacked", "top_series"]

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


def stacked(days: Sequence[str], series: Sequence[tuple[str, Mapping[str, float]]], label: str) -> Stacked:
    """A bar per day, stacked by series (in legend order, drawn from the bottom).

    Args:
        days: the days along the axis, oldest first.
        series: (name, day -> amount) of each series; ``top_series`` makes them from per-subject sums.
        label: the unit in each bar's title ("tokens").
    """
    per_day = {d: [s.get(d, 0.0) for _, s in series] for d in days}
    peak = max((sum(v) for v in per_day.values()), default=0.0)
    width = 100 / max(1, len(days))
    bars = []
    for i, day in enumerate(days):
        y = 40.0
        for n, v in enumerate(per_day[day]):
            if v <= 0 or peak <= 0:
                continue
            h = v / peak * 38
            y -= h
            bars.append(Bar(i * width + width * 0.1, y, width * 0.8, h, n, f"{day} {series[n][0]}: {v:,.0f} {label}"))
    return Stacked(list(days), [name for name, _ in series], bars, peak)


def top_series(
    totals: Mapping[str, float],
    amount: Callable[[str, str], float],
    day_totals: Mapping[str, float],
    days: Sequence[str],
) -> list[tuple[str, dict[str, float]]]:
    """The ``SERIES`` subjects with the largest ``totals``, each day's ``amount(subject, day)``, then "others":
    each day's total less theirs (so only those few subjects are looked up, not every one of 1,000)."""
    top = sorted((n for n in totals if totals[n] > 0), key=lambda n: (-totals[n], n))[:SERIES]
    series = [(name, {d: amount(name, d) for d in days}) for name in top]
    if len(totals) > len(top):
        rest = {d: max(0.0, day_totals.get(d, 0.0) - sum(s[d] for _, s in series)) for d in days}
        if any(v > 0 for v in rest.values()):
            series.append(("others", rest))
    return series


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
