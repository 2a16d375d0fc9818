"""Pools of contention from the models backends serve: backends joined when one model is served by both.

A union-find over the backends, each given by its models; the core's pools (``fairness/pools.py``), the
classes' candidate sets (``routing/classes.py``) and the simulator's pools all group backends by it: the
one rule, shared by both parts of the core.

Invariant: every candidate set of a job class lies inside one group, and candidate sets that overlap lie
in the same one; a pool is named by its group (``PoolKey``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

__all__ = ["PoolKey", "joined"]

#: A pool is named by the backend ids that can serve its jobs.
PoolKey = frozenset[Hashable]


def joined(models: Sequence[Iterable[str]]) -> list[list[int]]:
    """Backends (by index, each given by its models) grouped when one model is served by both, transitively.

    These groups are the pools: every candidate set of a job lies inside one, and
    two candidate sets that overlap lie in the same one, so a person has one
    standing wherever its jobs could meet another's.
    """
    owner = list(range(len(models)))

    def root(i: int) -> int:
        while owner[i] != i:
            owner[i] = owner[owner[i]]
            i = owner[i]
        return i

    first: dict[str, int] = {}
    for i, served in enumerate(models):
        for model in served:
            owner[root(i)] = root(first.setdefault(model, i))
    groups: dict[int, list[int]] = {}
    for i in range(len(models)):
        groups.setdefault(root(i), []).append(i)
    return list(groups.values())
