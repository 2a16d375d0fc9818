"""Queue deadlines: when each queued job times out, in a heap (as trio's ``Deadlines``).

Invariant: an entry is (when, sequence, job id); the sequence keeps jobs due at
the same instant in the order they were submitted. An entry whose job is no
longer queued is stale: ``due`` hands it out all the same (the caller skips
it), ``next`` drops it when it reaches the top.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator

__all__ = ["Deadlines"]


class Deadlines:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []
        self._seq = 0

    def add(self, at: float, job_id: str) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, job_id))

    def due(self, now: float) -> Iterator[str]:
        """The jobs whose time is up at ``now``, each taken out (queued or not)."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            yield heapq.heappop(heap)[2]

    def next(self, queued: Callable[[str], bool]) -> float | None:
        """The next deadline of a job still ``queued``, if any."""
        heap = self._heap
        while heap and not queued(heap[0][2]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None
