"""Weighted max-min fair allocation of backend slots, with demands and candidate backends.

This is what the simulator's targets are computed from (issue 18, case 4):
each person with work in the system (queued or running) is owed its weighted
max-min share of the slots, found from the workload alone (how many requests
it has outstanding, its weight, which backends serve its models), never from
the scheduler's counters. The targets share service units, and a slot
delivers units at the rate of whoever holds it: ``pools.Pool`` passes each
person's weight over its units per slot-second, which makes this the same
water-filling in units (at level t a person holds weight x t / rate slots and
receives weight x t units a second).

The allocation is progressive filling (water-filling, Bertsekas and Gallager,
*Data Networks*, 6.5.2): a common level rises; every unfrozen person holds
``weight x level``; a person freezes when it reaches its demand, or when a set
of backends it can use is full. With candidate sets the capacity constraints
are Hall's: for every union ``S`` of candidate sets, the people confined to
``S`` hold at most ``S``'s slots. Only unions of candidate sets need checking
(shrinking a set to the union of the candidate sets inside it only lowers its
capacity), so a pool with k distinct candidate sets costs 2^k per step.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from itertools import combinations
from typing import TypeVar

__all__ = ["max_min", "max_min_units"]

K = TypeVar("K", bound=Hashable)

_EPS = 1e-12


def _unions(sets: list[frozenset[str]]) -> list[frozenset[str]]:
    """Every union of one or more of ``sets`` (distinct)."""
    out: set[frozenset[str]] = set()
    for r in range(1, len(sets) + 1):
        for combo in combinations(sets, r):
            out.add(frozenset().union(*combo))
    return list(out)


def max_min(
    weights: Mapping[K, float],
    demands: Mapping[K, float],
    candidates: Mapping[K, frozenset[str]],
    capacity: Mapping[str, float],
) -> dict[K, float]:
    """Each person's weighted max-min allocation of ``capacity`` (slots per backend).

    Args:
        weights: each person's weight (> 0).
        demands: how much each person could use (its outstanding requests; at most one slot each).
        candidates: the backends each person's work can run on.
        capacity: each backend's slots.

    Returns the allocation of every person in ``demands`` (0 for one without demand or backends).
    """
    alloc: dict[K, float] = dict.fromkeys(demands, 0.0)
    cands = {u: frozenset(b for b in candidates[u] if capacity.get(b, 0) > 0) for u in demands}
    unfrozen = {u for u, d in demands.items() if d > 0 and weights[u] > 0 and cands[u]}
    sets = _unions(sorted({cands[u] for u in unfrozen}, key=sorted))
    cap = {s: sum(capacity[b] for b in s) for s in sets}
    inside = {s: [u for u in unfrozen if cands[u] <= s] for s in sets}
    while unfrozen:
        level = min(demands[u] / weights[u] for u in unfrozen)
        tight: list[frozenset[str]] = []
        for s in sets:
            free = [u for u in inside[s] if u in unfrozen]
            weight = sum(weights[u] for u in free)
            if weight <= 0:
                continue
            room = cap[s] - sum(alloc[u] for u in inside[s] if u not in unfrozen)
            at = max(room, 0.0) / weight
            if at < level - _EPS:
                level, tight = at, [s]
            elif at <= level + _EPS:
                tight.append(s)
        done = {u for u in unfrozen if demands[u] / weights[u] <= level + _EPS}
        for s in tight:
            done.update(u for u in inside[s] if u in unfrozen)
        for u in done:
            alloc[u] = min(demands[u], weights[u] * level)
        unfrozen -= done
    return alloc


def max_min_units(
    weights: Mapping[K, float],
    rates: Mapping[K, float],
    demand: Mapping[K, float],
    candidates: Mapping[K, frozenset[str]],
    capacity: Mapping[str, float],
) -> dict[K, float]:
    """Weighted max-min in units a second, each person held to its slots x its ``rates`` (units per slot-second).

    The same water-filling over slots with weight / rate as the weight: at level t a
    person receives weight x t units a second on weight x t / rate slots.
    """
    slot_weights = {u: weights[u] / rates[u] if rates[u] > 0 else 0.0 for u in demand}
    return {u: a * rates[u] for u, a in max_min(slot_weights, demand, candidates, capacity).items()}
