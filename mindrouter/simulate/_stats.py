"""Order statistics and Jain's index, shared by the fairness and the pool figures."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["jain", "percentile"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1) of unsorted ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def jain(values: Sequence[float]) -> float | None:
    """Jain's fairness index: 1 when all values are equal, 1/n when one takes everything."""
    if not values:
        return None
    total = sum(values)
    squares = sum(v * v for v in values)
    return 1.0 if squares == 0 else total * total / (len(values) * squares)
