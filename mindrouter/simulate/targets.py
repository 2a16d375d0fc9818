"""Each user's figures against its weighted max-min target: GPU time, worst window, starvation allowance.

Shares are judged in service units, the unit the core charges; token shares are reported beside them.

The targets themselves come from ``pools.Pool`` (weighted max-min shares among
the people with work in the pool, ``maxmin.max_min``); this module only reads
them back per user for the ``users`` rows of ``mr simulate --json``.
"""

from __future__ import annotations

from typing import Any

from .runs import Run

__all__ = ["add_user_figures"]


def _r(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def _worst_windows(pools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each user's window (that counts) farthest from its target, across its pools."""
    worst: dict[str, dict[str, Any]] = {}
    for pool in pools:
        for row in pool["windows"]:
            if not row["counts"]:
                continue
            for name, share in row["unit_shares"].items():
                off = abs(share - row["targets"][name])
                if name not in worst or off > worst[name]["deviation"]:
                    worst[name] = {
                        "start": row["start"],
                        "share": row["shares"][name],
                        "unit_share": share,
                        "target": row["targets"][name],
                        "deviation": round(off, 6),
                        "allowed": row["allowed_by_user"][name],
                    }
    return worst


def add_user_figures(out: dict[str, Any], run: Run) -> None:
    """Add ``worst_window``, ``starvation_allowed_s`` and ``passed_over_allowed_s`` to each user row.

    ``passed_over_allowed_s`` is issue 18's bound, 3 x its longest request, held against
    ``max_passed_over_s``: the part of its waits the scheduler chose (``turns.py``).

    ``starvation_allowed_s`` is 3 x its longest request plus the time its pools
    take to deliver one of its largest requests at its target share: under fair
    share a request costing more than the others receive in 3 x its service time
    waits its turn for them to catch up (VTC's bound, in seconds). For requests
    that cost little next to the pool's throughput it is 3 x its longest request.
    """
    worst = _worst_windows(out["pools"])
    rate = sum(p["units"] for p in out["pools"]) / run.duration if run.duration else 0.0
    for user, row in zip(run.users, out["users"], strict=True):
        row["worst_window"] = worst.get(user.name)
        wait = 3 * user.longest_request
        if rate > 0 and row["target_share"]:
            wait += user.largest_request / (rate * row["target_share"])
        row["starvation_allowed_s"] = _r(wait, 3)
        row["passed_over_allowed_s"] = _r(3 * user.longest_request, 3)
