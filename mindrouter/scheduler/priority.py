"""The seed's priority formula, and the factor by which it deprioritizes heavy users.

The seed ranks a queued user by ``(deficit + burst) / weight``, lowered by a
factor once its share of recent usage passes a threshold, plus a bonus for
waiting. Lowering by a factor must not help a user whose priority is below
zero, so ``apply_factor`` divides there. ``Pool`` (``pools.py``) applies the
factor to heavy seats; ``seed_priority`` is the whole formula, for records and
tests.
"""

from __future__ import annotations

__all__ = ["apply_factor", "heavy_factor", "seed_priority"]


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
