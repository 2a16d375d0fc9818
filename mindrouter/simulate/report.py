"""Metrics of a run: the JSON object of ``mr simulate --json`` (a contract) and its rich table.

The contract's keys (issue 2, item 3) are ``users`` (each with ``name``,
``weight``, ``target_share``, ``tokens``, ``share``, ``requests``,
``wait_p50``, ``wait_p95``, ``wait_max``), ``max_service_gap``,
``max_request_cost``, ``jain_index`` and ``windows`` (``start``, ``shares``).
Everything else is an extra that may grow but is never renamed. The object
holds nothing that varies between runs of the same file and seed (no wall
time), so two runs can be compared byte for byte.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any

from ._stats import jain, percentile
from .engine import simulate
from .figures import add_pool_figures
from .perfect import perfect_figures, perfect_placement
from .pools import Pool, PoolWindow
from .runs import Run, UserRun
from .scenario import Scenario
from .targets import add_user_figures

__all__ = ["allowed_deviation", "build", "jain", "percentile", "run_scenario", "worst_window"]


def _r(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


#: Windows count toward ``worst_window`` from this many seconds after any arrival, departure or weight change.
SETTLE = 120.0
#: A window may be this far off its target ...
WINDOW_TOLERANCE = 0.05
#: ... or, while a request that outlasts the window runs in the pool, a share of the pool's slots plus this.
OUTLASTING_TOLERANCE = 0.02


def _changes(run: Run, pool: Pool) -> list[float]:
    """When the pool's competition changed: its phases starting or stopping, and every weight event."""
    times = [e.at for e in run.scenario.events]
    for phase in run.phases:
        if phase.pool is pool:
            times.append(phase.spec.start)
            if phase.stop < run.duration:
                times.append(phase.stop)
    return sorted(times)


def allowed_deviation(pool: Pool, window: PoolWindow, user: int) -> float:
    """How far below its target a window may leave ``user`` (issue 9's rule, issue 30's person).

    A request is never split, so one whose cost is a large part of what the window delivered
    moves its shares by that part, and while a request that outlasts the window runs, one slot's
    share of the pool: one long request more of someone's is a slot for the whole window, made up
    in the next. But never more than half the slots the person is owed (half its target): slots
    free within the window, and a person owed one gets it then. So a 2-slot workstation whose
    slots go to batch work while the person who asked is owed one fails (allowed 25 points of the
    50 owed, where one request's part of the window allowed 62). A prompt is counted whole when
    read, so the largest one's part of the window is always allowed.
    """
    total = sum(window.units)
    if total <= 0:
        return WINDOW_TOLERANCE
    lump = min(1.0, pool.max_request_cost / total)
    if window.outlasting:
        lump = max(lump, 1 / pool.slots + OUTLASTING_TOLERANCE)
    owed = window.targets[user] / total
    return max(WINDOW_TOLERANCE, min(1.0, pool.max_prompt_cost / total), min(lump, owed / 2))


def _window_rows(run: Run, pool: Pool) -> list[dict[str, Any]]:
    """Each window of ``pool``: shares (tokens and service units), targets, the worst user's error, whether it counts.

    Targets and the error are in service units, the unit the core charges. The error is a person's
    shortfall (target less units, over the window's units) that is the largest part of its allowance
    (``allowed_deviation``); anyone over its target is so because others are short.

        A window *counts* toward ``worst_window`` when it is full, someone was
        backlogged in it, it holds no change and starts at least ``SETTLE`` seconds
        after the last one (a phase starting or stopping, a weight event).
    """
    changes = _changes(run, pool)
    names = {u: run.users[u].name for u in pool.members}
    rows = []
    for window in pool.windows:
        tokens, total = sum(window.tokens), sum(window.units)
        last = max((t for t in changes if t <= window.start), default=None)
        error = None
        allowed = {u: allowed_deviation(pool, window, u) for u in names}
        if total > 0 and names:
            short = {u: (window.targets[u] - window.units[u]) / total for u in names}
            worst = max(names, key=lambda u: short[u] / allowed[u])
            error = (max(0.0, short[worst]), worst)
        counts = (
            error is not None
            and window.end - window.start >= run.window - 1e-9
            and window.backlogged > 0
            and (last is None or window.start >= last + SETTLE)
            and not any(window.start < t < window.end for t in changes)
        )
        rows.append(
            {
                "start": round(window.start, 6),
                "shares": {n: round(window.tokens[u] / tokens, 6) if tokens else 0.0 for u, n in names.items()},
                "unit_shares": {n: round(window.units[u] / total, 6) if total else 0.0 for u, n in names.items()},
                "targets": {n: round(window.targets[u] / total, 6) if total else 0.0 for u, n in names.items()},
                "error": None if error is None else round(error[0], 6),
                "error_user": None if error is None else names[error[1]],
                "allowed": round(allowed[error[1]] if error is not None else WINDOW_TOLERANCE, 6),
                "allowed_by_user": {n: round(allowed[u], 6) for u, n in names.items()},
                "outlasting": window.outlasting,
                "since_change": None if last is None else round(window.start - last, 6),
                "counts": counts,
            }
        )
    return rows


def worst_window(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Of a pool's window rows that count, the one whose error is the largest part of its allowance,
    as ``start``, ``user``, ``share`` (tokens), ``unit_share``, ``target``, ``deviation`` and ``allowed``
    (service units)."""
    counted = [r for r in rows if r["counts"]]
    if not counted:
        return None
    row = max(counted, key=lambda r: r["error"] / r["allowed"])
    user = row["error_user"]
    return {
        "start": row["start"],
        "user": user,
        "share": row["shares"][user],
        "unit_share": row["unit_shares"][user],
        "target": row["targets"][user],
        "deviation": row["error"],
        "allowed": row["allowed"],
    }


def _pool_jain(run: Run, pool: Pool) -> float | None:
    """Jain's index of share / target share over the users ever backlogged in the pool.

    With targets by weight (everyone saturating throughout) this is Jain's
    index of service units / weight, i.e. of weight-normalized throughput.
    """
    ratios = [
        pool.service(u, run.duration) / pool.target[u]
        for u in pool.members
        if pool.ever_backlogged[u] and pool.target[u] > 0
    ]
    return _r(jain(ratios))


def _pair(run: Run, pair: tuple[int, int] | None) -> list[str] | None:
    return [run.users[pair[0]].name, run.users[pair[1]].name] if pair else None


def _pool_row(run: Run, pool: Pool) -> dict[str, Any]:
    names = {u: run.users[u].name for u in pool.members}
    tokens = {u: pool.tokens(u, run.duration) for u in pool.members}
    units = {u: pool.service(u, run.duration) for u in pool.members}
    total, unit_total = sum(tokens.values()), sum(units.values())
    windows = _window_rows(run, pool)
    return {
        "backends": [b.name for b in pool.backends],
        "models": sorted(pool.models),
        "slots": pool.slots,
        "users": list(names.values()),
        "tokens": round(total),
        "units": round(unit_total),
        "shares": {names[u]: _r(t / total if total else 0.0) for u, t in tokens.items()},
        "unit_shares": {names[u]: _r(c / unit_total if unit_total else 0.0) for u, c in units.items()},
        "target_shares": {names[u]: _r(pool.target[u] / unit_total if unit_total else 0.0) for u in pool.members},
        "max_service_gap": _r(pool.gap.max, 3),
        "max_service_gap_pair": _pair(run, pool.gap.pair),
        "max_service_gap_at": _r(pool.gap.at, 3),
        "max_service_gap_beyond_head_start": _r(pool.gap.beyond, 3),
        "max_service_gap_beyond_head_start_pair": _pair(run, pool.gap.beyond_pair),
        "max_dispatch_gap": _r(pool.dispatch_gap.max, 3),
        "max_dispatch_gap_pair": _pair(run, pool.dispatch_gap.pair),
        "max_request_cost": _r(pool.max_request_cost, 3),
        "gap_bound": _r(pool.gap_bound, 3),
        "jain_index": _pool_jain(run, pool),
        "worst_window": worst_window(windows),
        "windows": windows,
    }


def _user_row(user: UserRun, run: Run, total: float, units: float, gpu: float) -> dict[str, Any]:
    """One user's row; ``total``, ``units`` and ``gpu`` are everyone's tokens, service units and GPU seconds."""
    tokens = user.tokens(run.duration)
    service = user.service_units(run.duration)
    return {
        "name": user.name,
        "group": user.group,
        "weight": user.weight,
        "target_share": _r(user.target() / units if units else 0.0),
        "tokens": round(tokens),
        "share": _r(tokens / total if total else 0.0),
        "requests": user.completed,
        "wait_p50": _r(percentile(user.waits, 0.50), 3),
        "wait_p95": _r(percentile(user.waits, 0.95), 3),
        "wait_max": _r(max(user.waits) if user.waits else None, 3),
        "owed_wait_p50": _r(percentile(user.owed_waits, 0.50), 3),
        "owed_waits": len(user.owed_waits),
        "owed_wait_allowed_s": _r(3 * (percentile(user.durations, 0.50) or 0.0), 3) if user.durations else None,
        "max_starved_s": _r(user.max_starved, 3),
        "max_passed_over_s": _r(user.max_passed_over, 3),
        "longest_request_s": _r(user.longest_request, 3),
        "timeouts": user.timed_out,
        "submitted": user.submitted,
        "dispatched": len(user.waits),
        "timed_out": user.timed_out,
        "rejected": user.rejected,
        "waited_requests": user.waited,
        "max_slots_skipped": user.max_skipped,
        "backlogged_seconds": _r(user.backlogged_seconds, 3),
        "deprioritized_seconds": _r(user.deprioritized_seconds, 3),
        "min_factor": _r(user.min_factor, 4),
        "service_units": round(service),
        "service_share": _r(service / units if units else 0.0),
        "gpu_seconds": _r(user.gpu_seconds, 3),
        "gpu_share": _r(user.gpu_seconds / gpu if gpu else 0.0),
    }


def _worst(rows: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """The pool row with the largest ``key`` (the first among equals), or None without pools."""
    return max(rows, key=lambda r: r[key] or 0.0, default=None)


def build(run: Run, baseline: Run | None = None, perfect: Run | None = None) -> dict[str, Any]:
    """The JSON object for ``run``.

    Args:
        baseline: the same run without heavy-user deprioritization.
        perfect: the same run with every model placed perfectly (``perfect.perfect_placement``); without
            it, ``perfect_placement`` is null unless the scenario's placement is perfect already.
    """
    total = sum(u.tokens(run.duration) for u in run.users)
    units = sum(u.service_units(run.duration) for u in run.users)
    gpu = sum(u.gpu_seconds for u in run.users)
    names = [u.name for u in run.users]
    windows = []
    for k, first in enumerate(run.pools[0].windows):
        tokens = [sum(p.windows[k].tokens[u] for p in run.pools) for u in range(len(names))]
        spent = [sum(p.windows[k].units[u] for p in run.pools) for u in range(len(names))]
        wtotal, utotal = sum(tokens), sum(spent)
        windows.append(
            {
                "start": round(first.start, 6),
                "shares": {n: round(t / wtotal, 6) if wtotal else 0.0 for n, t in zip(names, tokens, strict=True)},
                "unit_shares": {n: round(c / utotal, 6) if utotal else 0.0 for n, c in zip(names, spent, strict=True)},
            }
        )
    pools = [_pool_row(run, p) for p in run.pools]
    gap = _worst(pools, "max_service_gap")
    beyond = _worst(pools, "max_service_gap_beyond_head_start")
    dgap = _worst(pools, "max_dispatch_gap")
    jains = [p["jain_index"] for p in pools if p["jain_index"] is not None]
    worst_windows = [p["worst_window"] for p in pools if p["worst_window"] is not None]
    out: dict[str, Any] = {
        "scenario": run.scenario.name,
        "seed": run.scenario.seed,
        "duration": run.duration,
        "counting": "as_generated",
        "shares": run.scenario.settings.shares,
        "users": [_user_row(u, run, total, units, gpu) for u in run.users],
        "pools": pools,
        "max_service_gap": gap and gap["max_service_gap"],
        "max_service_gap_pair": gap and gap["max_service_gap_pair"],
        "max_service_gap_at": gap and gap["max_service_gap_at"],
        "max_service_gap_beyond_head_start": beyond and beyond["max_service_gap_beyond_head_start"],
        "max_service_gap_beyond_head_start_pair": beyond and beyond["max_service_gap_beyond_head_start_pair"],
        "max_dispatch_gap": dgap and dgap["max_dispatch_gap"],
        "max_dispatch_gap_pair": dgap and dgap["max_dispatch_gap_pair"],
        "max_request_cost": _r(run.max_request_cost, 3),
        "gap_bound": _r(max(p.gap_bound for p in run.pools), 3),
        "jain_index": min(jains, default=None),
        "window_seconds": run.window,
        "settle_seconds": SETTLE,
        "worst_window": max(worst_windows, key=lambda w: w["deviation"], default=None),
        "windows": windows,
        "backends": [
            {
                "name": b.spec.name,
                "max_concurrent": b.spec.max_concurrent,
                "requests": b.requests,
                "tokens": b.tokens,
                "utilization": _r(b.slot_seconds / (b.spec.max_concurrent * run.duration), 4),
                "full_at": _r(b.full_at, 6),
            }
            for b in run.backends
        ],
        "tokens": round(total),
        "events": run.events,
        "deprioritization": _deprioritization(run, baseline, total),
    }
    add_pool_figures(out, run)
    if perfect is None and perfect_placement(run.scenario) is None:
        perfect = run
    out["perfect_placement"] = None if perfect is None else perfect_figures(run, perfect)
    add_user_figures(out, run)
    return out


def _deprioritization(run: Run, baseline: Run | None, total: float) -> dict[str, Any]:
    """How long each user was deprioritized and, when anyone was, what the run looks like without it."""
    seconds = {u.name: _r(u.deprioritized_seconds, 3) for u in run.users}
    info: dict[str, Any] = {
        "threshold": run.scenario.settings.deprioritize_threshold,
        "seconds": seconds,
        "in_play": any(u.deprioritized_seconds > 0 for u in run.users),
        "without": None,
    }
    if baseline is not None:
        btotal = sum(u.tokens(baseline.duration) for u in baseline.users)
        shares = {u.name: u.tokens(baseline.duration) / btotal if btotal else 0.0 for u in baseline.users}
        shift = (
            max((abs(u.tokens(run.duration) / total - shares[u.name]) for u in run.users), default=0.0)
            if total
            else 0.0
        )
        info["without"] = {
            "shares": {n: round(s, 6) for n, s in shares.items()},
            "max_share_shift": round(shift, 6),
            "max_service_gap": _r(max(p.gap.max for p in baseline.pools), 3),
            "max_dispatch_gap": _r(max(p.dispatch_gap.max for p in baseline.pools), 3),
            "jain_index": min((j for p in baseline.pools if (j := _pool_jain(baseline, p)) is not None), default=None),
        }
    return info


def run_scenario(
    scenario: Scenario, *, compare: bool = True, progress: Callable[[str, float], None] | None = None
) -> tuple[dict[str, Any], Run]:
    """Simulate ``scenario``, again with every model placed perfectly where loads or placement are in play,
    and, if heavy-user deprioritization was in play, again without it to show its effect.

    Args:
        compare: allow the second run. Defaults to True.
        progress: called with ("run", "perfect" or "baseline", simulated time) now and then.

    Returns the JSON object and the main run.
    """
    run = simulate(scenario, progress=None if progress is None else partial(progress, "run"))
    baseline = None
    if (
        compare
        and any(u.deprioritized_seconds > 0 for u in run.users)
        and scenario.settings.deprioritize_threshold < 1.0
    ):
        off = scenario.replace(settings=dataclasses.replace(scenario.settings, deprioritize_threshold=1.0))
        baseline = simulate(off, progress=None if progress is None else partial(progress, "baseline"))
    placed = perfect_placement(scenario)
    perfect = None
    if placed is not None:
        perfect = simulate(placed, progress=None if progress is None else partial(progress, "perfect"))
    return build(run, baseline, perfect), run
