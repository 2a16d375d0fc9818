"""A small dense simplex: maximize ``c @ x`` subject to ``A @ x <= b``, ``x >= 0``, with ``b >= 0``.

The offline bound (``bound.py``) is a linear program of a few dozen variables;
a dependency for that would weigh more than these lines. With ``b >= 0`` the
origin is feasible, so no first phase is needed; Bland's rule (lowest index
enters and leaves) guarantees termination.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["maximize"]

_EPS = 1e-12


def maximize(c: Sequence[float], a: Sequence[Sequence[float]], b: Sequence[float]) -> tuple[float, list[float]]:
    """The optimum of the program and a point that reaches it.

    Raises:
        ValueError: a bound is negative, or the program is unbounded.
    """
    m, n = len(a), len(c)
    if any(v < 0 for v in b):
        raise ValueError("every bound must be at least 0")
    rows = [[float(v) for v in a[i]] + [1.0 if j == i else 0.0 for j in range(m)] + [float(b[i])] for i in range(m)]
    z = [-float(v) for v in c] + [0.0] * (m + 1)
    basis = [n + i for i in range(m)]
    while True:
        col = next((j for j in range(n + m) if z[j] < -_EPS), None)
        if col is None:
            break
        row = None
        best = 0.0
        for i in range(m):
            if rows[i][col] > _EPS:
                ratio = rows[i][-1] / rows[i][col]
                if row is None or ratio < best - _EPS or (ratio <= best + _EPS and basis[i] < basis[row]):
                    row, best = i, ratio
        if row is None:
            raise ValueError("the program is unbounded")
        pivot = rows[row][col]
        rows[row] = [v / pivot for v in rows[row]]
        for i in range(m):
            if i != row and rows[i][col]:
                f = rows[i][col]
                rows[i] = [v - f * p for v, p in zip(rows[i], rows[row], strict=True)]
        f = z[col]
        z = [v - f * p for v, p in zip(z, rows[row], strict=True)]
        basis[row] = col
    x = [0.0] * n
    for i, j in enumerate(basis):
        if j < n:
            x[j] = rows[i][-1]
    return z[-1], x
