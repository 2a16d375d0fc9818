"""A person's target share: the one definition every view shows (``mr share``, ``mr top``, ``/v1/me``, the web UI).

The scheduler divides each pool of backends among the people with demand there
(queued, running, or served within the fairness window), in proportion to the
weight each seat has in that pool (group shares: its part of its group's). So a
person's target is its seat's weight over the sum of those seats' weights, and
an idle person has none: dividing by every registered account's weight showed
8.6% for a student whose pool gave him 20%.

Across pools, a person's figures are summed over the pools it has demand in,
each pool counted by the service it gave: target = Σ target_p · units_p / Σ
units_p and actual = Σ own units_p / Σ units_p, so the two compare like for
like. Pure and cheap: the input is only the people with demand.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

__all__ = ["Part", "combined", "pool_targets"]

K = TypeVar("K", bound=Hashable)

Part = tuple[float, float, float]
"""(target in one pool, the person's service units there, all service units there)."""


def pool_targets(demand: Mapping[K, float]) -> dict[K, float]:
    """Each person's target in one pool, from the weights of the people with demand there (no others)."""
    total = sum(demand.values())
    return {who: weight / total for who, weight in demand.items()} if total > 0 else {}


def combined(parts: Iterable[Part]) -> tuple[float | None, float | None]:
    """(target, actual) over the pools a person (or group) has demand in; (None, None) without any.

    Pools that gave no service yet (only queued work) count alike, so a newcomer's target is shown at once.
    """
    parts = list(parts)
    if not parts:
        return None, None
    total = sum(units for _, _, units in parts)
    if total <= 0:
        return sum(t for t, _, _ in parts) / len(parts), 0.0
    return sum(t * units for t, _, units in parts) / total, sum(own for _, own, _ in parts) / total
