"""Figures of one bench_pool.py target from its requests' outcomes, and the side-by-side table.

All times are lab seconds (the benchmark multiplies wall time by the compression).
Percentiles are over requests that completed; lost ones (errors, timeouts,
unfinished when the run ends) are counted apart, as issue 17's table does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from _lab import Request
from _pools import MODELS


@dataclass(eq=False, slots=True)
class Outcome:
    req: Request
    sent: float
    first: float | None = None
    end: float | None = None
    tokens: int = 0
    error: str | None = None
    request_id: str | None = None
    """The router's ``X-Request-Id`` (mr serve's decision records are keyed by it)."""

    @property
    def ok(self) -> bool:
        return self.end is not None and self.error is None


@dataclass(slots=True)
class Figures:
    name: str
    outcomes: list[Outcome]
    arrivals: list[tuple[float, int]]
    """(lab time, tokens) of every chunk received."""
    stats: list[dict[str, Any]]
    """Each workstation's ``/bench/stats`` at the end."""
    steady_s: float
    burst_s: float
    span_s: float
    """Lab seconds from the first arrival to the end of the drain."""
    rows: dict[str, float | None] = field(default_factory=dict)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def compute(f: Figures) -> Figures:
    """Fill ``f.rows``: one figure per row label."""
    start, end = f.steady_s, f.steady_s + f.burst_s
    rows = f.rows
    rows["tokens/s at saturation (burst)"] = sum(n for t, n in f.arrivals if start <= t < end) / f.burst_s
    rows["tokens/s steady"] = sum(n for t, n in f.arrivals if t < start) / f.steady_s
    done = [o for o in f.outcomes if o.ok]
    e2e = {o: o.end - o.sent for o in done if o.end is not None}
    ttft = {o: (o.first if o.first is not None else o.end) - o.sent for o in done}  # type: ignore[operator]
    rows["E2E p95"] = pct(list(e2e.values()), 0.95)
    rows["burst E2E p95"] = pct([v for o, v in e2e.items() if o.req.phase == "burst"], 0.95)
    chat = [v for o, v in ttft.items() if o.req.phase == "steady" and MODELS[o.req.model].kind != "embedding"]
    rows["steady TTFT p95"] = pct(chat, 0.95)
    rows["later turns' TTFT p95"] = pct([v for o, v in ttft.items() if o.req.turn], 0.95)
    sent = sum(s.get("prompt_tokens", 0) for s in f.stats)
    rows["prompt computed / sent"] = sum(s.get("computed_tokens", 0) for s in f.stats) / sent if sent else None
    sent_models = {o.req.model for o in f.outcomes}
    for model in (m for m in MODELS if m in sent_models):  # the pool's own models, in one order for every target
        short = model.split(":")[0]
        mine = [o for o in done if o.req.model == model]
        for label, values in (("TTFT", ttft), ("E2E", e2e)):
            if label == "TTFT" and MODELS[model].kind == "embedding":
                continue
            data = [values[o] for o in mine]
            rows[f"{short} {label} p50"] = pct(data, 0.5)
            rows[f"{short} {label} p95"] = pct(data, 0.95)
    hours = f.span_s / 3600
    rows["model loads / h"] = sum(s["loads"] for s in f.stats) / hours
    rows["seconds loading / h"] = sum(s["load_seconds"] for s in f.stats) / hours
    rows["evictions / h"] = sum(s["evictions"] for s in f.stats) / hours
    rows["requests"] = float(len(f.outcomes))
    rows["lost"] = float(sum(not o.ok for o in f.outcomes))
    return f


RATIOS = (
    ("tokens/s at saturation (burst)", ">=", 1.05),
    ("E2E p95", "<=", 1.0),
    ("burst E2E p95", "<=", 1.0),
    ("model loads / h", "<=", 0.25),
)
"""Issue 17's targets, as ratios to the least-busy baseline."""


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}" if abs(value) >= 1 else f"{value:.2f}"


def table(figures: list[Figures], reference: str = "least-busy") -> str:
    """Figures side by side (a row per figure), then each target's ratios to ``reference``."""
    names = [f.name for f in figures]
    width = max(12, *(len(n) for n in names))
    lines = [f"{'':<32}" + "".join(f"{n:>{width + 2}}" for n in names)]
    for label in figures[0].rows:
        lines.append(f"{label:<32}" + "".join(f"{_cell(f.rows.get(label)):>{width + 2}}" for f in figures))
    ref = next((f for f in figures if f.name == reference), None)
    if ref is not None:
        lines.append(f"\nratios to {reference} (issue 17's target in brackets):")
        for f in figures:
            if f is ref:
                continue
            cells = []
            for label, sense, goal in RATIOS:
                mine, base = f.rows.get(label), ref.rows.get(label)
                ratio = f"{mine / base:.2f}x" if mine is not None and base else "-"
                cells.append(f"{label} {ratio} [{sense} {goal:g}]")
            lines.append(f"  {f.name:<{width}} " + "; ".join(cells) + f"; lost {f.rows['lost']:.0f} [0]")
    aware = next((f for f in figures if f.name == "cache-aware"), None)
    if aware is not None and aware.rows.get("later turns' TTFT p95"):
        lines.append("\nagainst cache-aware (issue 31's targets in brackets):")
        for f in figures:
            if f is aware:
                continue
            mine, base = f.rows.get("later turns' TTFT p95"), aware.rows["later turns' TTFT p95"]
            ratio = f"{mine / base:.2f}x" if mine is not None and base else "-"
            sent, theirs = f.rows.get("prompt computed / sent"), aware.rows.get("prompt computed / sent")
            gap = f"{sent - theirs:+.3f}" if sent is not None and theirs is not None else "-"
            lines.append(
                f"  {f.name:<{width}} later turns' TTFT p95 {ratio} [<= 0.8]; prompt computed / sent {gap} [<= +0.05]"
            )
    return "\n".join(lines)
