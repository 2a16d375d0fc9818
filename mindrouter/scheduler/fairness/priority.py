"""The seed's priority formula, and the factor by which it deprioritizes heavy users.

The seed ranks a queued user by ``(deficit + burst) / weight``, lowered by a
factor once its share of recent usage passes a threshold, plus a bonus for
waiting. Lowering by a factor must not help a user whose priority is below
zero, so ``apply_factor`` divides there. ``Pool`` (``pools.py``) applies the
factor to heavy seats; ``seed_priority`` is the whole formula, for records and
tests.

Invariant: ``apply_factor(base, factor)`` is never above ``base`` for a factor
in (0, 1]: deprioritization never helps a heavy user.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PriorityTerms", "apply_factor", "heavy_factor", "seed_priority"]


def heavy_factor(usage_fraction: float, threshold: float, floor: float = 0.1) -> float:
    """The seed's deprioritization factor: 1 up to the threshold, then falling to ``floor``."""
    if usage_fraction <= threshold:
        return 1.0
    return max(floor, 1.0 - (usage_fraction - threshold) * 2.0)


def apply_factor(base: float, factor: float) -> float:
    """Lower ``base`` by ``factor`` (0 < factor <= 1) whatever its sign.

    Multiplying a negative number by 0.1 would raise it, helping the heavy user;
    below zero we divide instead, so the result is never above ``base``.
    """
    return base * factor if base >= 0 else base / factor


def seed_priority(deficit: float, burst: float, weight: float, factor: float, wait_bonus: float) -> float:
    """The seed's priority formula with the sign correction, for records and tests."""
    return apply_factor((deficit + burst) / weight, factor) + wait_bonus


@dataclass(frozen=True, slots=True)
class PriorityTerms:
    """The terms of a job's priority at its decision (what ``mr why`` explains)."""

    deficit: float
    """Cost owed relative to the pool's most-owed waiting user (0 = that user), in-flight charges included."""
    inflight_charge: float
    """Cost charged so far for the user's running jobs in this pool (part of ``deficit``)."""
    weight: float
    """The weight the pool used (group shares: the user's part of its group's)."""
    factor: float
    usage_fraction: float
    """Recent tokens per unit of weight, as a part of the pool's sum of that."""
    reference: float
    """The most-owed waiting user's lag (cost per unit of weight), from which priorities are measured."""
    credit: float
    """One typical request in this pool: the bound on placement and the unit of the heavy handicap."""
    wait_bonus: float
    priority: float

    def to_dict(self) -> dict[str, float]:
        return {name: round(getattr(self, name), 4) for name in self.__slots__}
