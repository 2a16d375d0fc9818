"""bench_pool's lab through the simulator: the same figures from ``mr simulate`` as from a live target.

Issue 17's "simulator against live": ``bench_pool.py --workload scenario`` replays
the requests the simulator submits (``mindrouter.simulate.arrivals``) against the
fake workstations, and the target ``mr simulate`` runs that scenario in the
simulator and reads its traces into the benchmark's own ``Figures``, so both go
through one ``compute``.
"""

from __future__ import annotations

import itertools

from _lab import Request, scenario
from _pool_report import Figures, Outcome, compute

from mindrouter.simulate import Scenario, arrivals, parse_scenario, simulate
from mindrouter.simulate.perfect import perfect_placement


def lab_scenario(
    seed: int,
    steady_s: float,
    burst_s: float,
    drain_s: float,
    sharing: str,
    conversations: bool = False,
    pool_name: str = "lab",
    burst: float = 1.3,
) -> Scenario:
    return parse_scenario(
        scenario(
            seed,
            steady_s,
            burst_s,
            drain_s,
            burst=burst,
            sharing=sharing,
            conversations=conversations,
            pool_name=pool_name,
        )
    )


def scenario_requests(sc: Scenario, steady_s: float) -> list[Request]:
    """The scenario's requests, as the benchmark replays them."""
    return [
        Request(
            a.at,
            a.user,
            a.model,
            a.prompt_tokens,
            a.completion_tokens,
            "steady" if a.at < steady_s else "burst",
            a.conversation,
        )
        for a in arrivals(sc)
    ]


def simulated(sc: Scenario, steady_s: float, burst_s: float, *, perfect: bool = False) -> Figures:
    """The scenario's run, in the benchmark's figures; with ``perfect``, every model placed perfectly.

    A request's completion tokens count as arriving evenly between its first token and its last
    (the simulator's decode rate changes as streams come and go; only the split between the
    steady phase, the burst and after matters to the figures).
    """
    name = "mr simulate"
    if perfect:
        name += ", perfect placement"
        sc = perfect_placement(sc) or sc
    run = simulate(sc, trace=True)
    assert run.trace is not None
    outcomes: list[Outcome] = []
    tokens: list[tuple[float, int]] = []
    edges = (0.0, steady_s, steady_s + burst_s, float("inf"))
    for t in run.trace:
        phase = "steady" if t.submitted < steady_s else "burst"
        req = Request(
            t.submitted, run.users[t.user].name, t.model, t.prompt, t.completion, phase, t.conversation, t.turn
        )
        o = Outcome(req, t.submitted)
        outcomes.append(o)
        if t.done is None or t.prefill_end is None:
            o.error = "timed out" if t.timed_out else "unfinished"
            continue
        o.first, o.end, o.tokens = t.prefill_end, t.done, t.completion
        span = max(t.done - t.prefill_end, 1e-9)
        for lo, hi in itertools.pairwise(edges):
            share = max(0.0, min(hi, t.done) - max(lo, t.prefill_end)) / span
            if share > 0 and t.completion:
                tokens.append((max(lo, t.prefill_end), round(t.completion * share)))
    stats: list[dict[str, float]] = [
        {"loads": b.loads, "load_seconds": b.load_seconds, "evictions": b.evictions} for b in run.backends
    ]
    stats[0]["prompt_tokens"] = sum(m.prompt_tokens for m in run.models.values())  # the pool's, as one figure
    stats[0]["computed_tokens"] = sum(m.computed_tokens for m in run.models.values())
    span_s = max((o.end for o in outcomes if o.end is not None), default=sc.duration)
    return compute(Figures(name, outcomes, tokens, stats, steady_s, burst_s, span_s))
