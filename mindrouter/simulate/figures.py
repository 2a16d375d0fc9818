"""What a pool delivers: per model latency, tokens per second at saturation, model loads, lost requests, the bound.

These are the figures issue 17 compares routers by, kept apart from the
fairness figures of ``report.py``. Time to first token (TTFT) and end to end
(E2E) run from a request's submission to the end of its prefill and to its
last token, so they include its wait in the core's queue, on its backend and
for its model's load. *Saturation* is every stretch during which some request
waited in the core's queue; tokens per second are completion tokens, as
generated. The offline bound is ``bound.py``'s: over the run, for what the
users sent over the run; at saturation, the fastest the pool could serve the
mix of models they sent during the saturated stretches (which is what a
stretch, ending when the queue empties, has to serve).
"""

from __future__ import annotations

import bisect
from typing import Any

from rich.console import Console

from ._stats import percentile
from .bound import Offer, offline_bound
from .runs import Run

__all__ = ["add_pool_figures", "render_pool", "throughput"]


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def add_pool_figures(out: dict[str, Any], run: Run) -> None:
    """Add ``models``, ``prompt_cache``, ``throughput``, ``loads``, ``lost`` and ``offline_bound`` to the
    report ``out``, and each backend's loads to its row."""
    hours = run.duration / 3600
    out["models"] = {
        name: {
            "kind": m.kind,
            "submitted": m.submitted,
            "completed": m.completed,
            "timed_out": m.timed_out,
            "rejected": m.rejected,
            "completion_tokens": m.completion_tokens,
            "ttft_p50": _r(percentile(m.ttft, 0.50)),
            "ttft_p95": _r(percentile(m.ttft, 0.95)),
            "e2e_p50": _r(percentile(m.e2e, 0.50)),
            "e2e_p95": _r(percentile(m.e2e, 0.95)),
            "prompt_tokens": m.prompt_tokens,
            "prompt_tokens_computed": m.computed_tokens,
            "later_turn_ttft_p50": _r(percentile(m.later_ttft, 0.50)),
            "later_turn_ttft_p95": _r(percentile(m.later_ttft, 0.95)),
        }
        for name, m in sorted(run.models.items())
    }
    sent = sum(m.prompt_tokens for m in run.models.values())
    computed = sum(m.computed_tokens for m in run.models.values())
    out["prompt_cache"] = {
        "sent": sent,
        "computed": computed,
        "computed_over_sent": _r(computed / sent, 4) if sent else None,
    }
    out["throughput"] = throughput(run)
    for row, b in zip(out["backends"], run.backends, strict=True):
        row.update(loads=b.loads, load_seconds=_r(b.load_seconds), evictions=b.evictions, expirations=b.expirations)
    loads = sum(b.loads for b in run.backends)
    seconds = sum(b.load_seconds for b in run.backends)
    out["loads"] = {
        "count": loads,
        "seconds": _r(seconds),
        "per_hour": _r(loads / hours),
        "seconds_per_hour": _r(seconds / hours),
        "evictions": sum(b.evictions for b in run.backends),
        "expirations": sum(b.expirations for b in run.backends),
    }
    timed_out = sum(m.timed_out for m in run.models.values())
    rejected = sum(m.rejected for m in run.models.values())
    out["lost"] = {"requests": timed_out + rejected, "timed_out": timed_out, "rejected": rejected}
    whole = offline_bound(run.scenario, offers(run, [(0.0, run.duration)]))
    bound = offline_bound(run.scenario, offers(run, run.saturated), mix=True) if run.saturated else None
    out["offline_bound"] = {
        "tokens_per_second_at_saturation": bound and bound["tokens_per_second"],
        "tokens_per_second": whole["tokens_per_second"],
        "offered_tokens_per_second": _r(sum(c for m in run.models.values() for _, _, c in m.arrivals) / run.duration),
        "backends_at_saturation": bound and bound["backends"],
    }


def throughput(run: Run) -> dict[str, float | None]:
    """Completion tokens per second over the run, the saturated seconds, and tokens per second during them."""
    decoded = sum(pool.decoded(run.duration) for pool in run.pools)
    saturated = sum(end - start for start, end in run.saturated)
    return {
        "tokens_per_second": _r(decoded / run.duration),
        "saturated_seconds": _r(saturated),
        "tokens_per_second_at_saturation": _r(run.saturated_tokens / saturated) if saturated else None,
    }


def offers(run: Run, stretches: list[tuple[float, float]]) -> dict[str, Offer]:
    """Per model, what the users sent during ``stretches`` (sorted, disjoint): requests per second, mean sizes.

    A stretch includes its start: the arrival that made the core queue something opens it.
    """
    seconds = sum(end - start for start, end in stretches)
    starts = [start for start, _ in stretches]
    out = {}
    for name, m in run.models.items():
        sent = [
            (p, c) for t, p, c in m.arrivals if (i := bisect.bisect_right(starts, t) - 1) >= 0 and t <= stretches[i][1]
        ]
        if sent:
            n = len(sent)
            out[name] = Offer(n / seconds, sum(p for p, _ in sent) / n, sum(c for _, c in sent) / n)
    return out


def _sec(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render_pool(result: dict[str, Any], console: Console) -> None:
    """The pool's figures under the fairness table, when a backend loads models or a model has a kind."""
    models = result["models"]
    for name, m in models.items():
        console.print(
            f"{name} ({m['kind']}): {m['completed']:,} of {m['submitted']:,} answered, {m['timed_out']:,} timed out;"
            f" TTFT p50/p95 {_sec(m['ttft_p50'])}/{_sec(m['ttft_p95'])} s,"
            f" E2E p50/p95 {_sec(m['e2e_p50'])}/{_sec(m['e2e_p95'])} s"
            + (
                ""
                if m["later_turn_ttft_p95"] is None
                else f"; later turns' TTFT p50/p95 {_sec(m['later_turn_ttft_p50'])}/{_sec(m['later_turn_ttft_p95'])} s"
            )
            + "."
        )
    cache = result["prompt_cache"]
    if cache["sent"] and cache["computed"] < cache["sent"]:
        console.print(
            f"Prompt tokens computed {cache['computed']:,} of {cache['sent']:,} sent"
            f" ({cache['computed_over_sent']:.2f}; the rest the backends' prompt caches held)."
        )
    t, loads, bound = result["throughput"], result["loads"], result["offline_bound"]
    at = t["tokens_per_second_at_saturation"]
    line = f"Completion tokens/s {t['tokens_per_second']:,.1f} over the run"
    line += f" (offline bound {bound['tokens_per_second']:,.1f})"
    if at is not None:
        line += (
            f", {at:,.1f} at saturation ({t['saturated_seconds']:,.0f} s with requests queued;"
            f" offline bound {bound['tokens_per_second_at_saturation']:,.1f})"
        )
    console.print(line + ".")
    perfect = result["perfect_placement"]
    if perfect is not None and perfect["second_run"]:
        line = f"With every model placed perfectly (no loads): {perfect['tokens_per_second']:,.1f} over the run"
        if perfect["tokens_per_second_at_saturation"] is not None:
            line += f", {perfect['tokens_per_second_at_saturation']:,.1f} at saturation"
        ratio = perfect["run_over_perfect_at_saturation"]
        line += "" if ratio is None else f"; this run reaches {ratio:.2f} of it at saturation"
        console.print(line + ".")
    console.print(
        f"Model loads {loads['count']:,} ({loads['per_hour']:,.0f}/h, {loads['seconds_per_hour']:,.0f} s loading/h),"
        f" {loads['evictions']:,} evictions, {loads['expirations']:,} keep_alive expiries;"
        f" lost requests {result['lost']['requests']:,}."
    )
