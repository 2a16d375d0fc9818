"""Queued jobs: a FIFO per user and job class, and per class a heap of queue heads.

Invariants (``Queues.check()``):

- A queued job is in exactly one deque, its user's queue for its class, and in
  ``jobs``; ``live[key]`` counts the non-empty queues of class ``key``;
  ``via[proxy]`` counts the queued jobs a proxy sent (for its people or itself).
- A heap entry is ``(key, seq, user_id, version)``. It is valid while the user's
  queue for that class is non-empty and ``version`` is still the seat's; stale
  entries are dropped lazily when they reach the top, or all at once when they
  outnumber the valid ones four to one.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field

from ..jobs import ClassKey, Job

__all__ = ["Entry", "Queues"]

#: (sort key, sequence number, user id, seat version)
Entry = tuple[float, int, Hashable, int]


@dataclass(slots=True)
class _Heads:
    heap: list[Entry] = field(default_factory=list)
    live: int = 0
    """Number of (user, class) queues that are non-empty: the valid entries."""


class Queues:
    """Per-user, per-class FIFO queues with a heap of heads per class."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self._queues: dict[Hashable, dict[ClassKey, deque[Job]]] = {}
        self._heads: dict[ClassKey, _Heads] = {}
        self.counts: dict[ClassKey, int] = {}
        """Jobs queued per class."""
        self.via: dict[Hashable, int] = {}
        """Jobs queued per proxy that sent them (``Job.via``)."""
        self._seq = 0

    def __len__(self) -> int:
        return len(self.jobs)

    def add(self, job: Job, key: ClassKey, *, front: bool) -> bool:
        """Queue ``job``; True when it is now the head of its (user, class) queue."""
        queues = self._queues.setdefault(job.user_id, {})
        queue = queues.get(key)
        if queue is None:
            queue = queues[key] = deque()
        was_empty = not queue
        if front:
            queue.appendleft(job)
        else:
            queue.append(job)
        self.jobs[job.id] = job
        self.counts[key] = self.counts.get(key, 0) + 1
        if job.via is not None:
            self.via[job.via] = self.via.get(job.via, 0) + 1
        if was_empty:
            self._heads.setdefault(key, _Heads()).live += 1
        return was_empty or front

    def remove(self, job: Job, key: ClassKey) -> None:
        """Take ``job`` out of its queue (the head, usually)."""
        queues = self._queues[job.user_id]
        queue = queues[key]
        if queue[0] is job:
            queue.popleft()
        else:
            for index, queued in enumerate(queue):
                if queued is job:
                    del queue[index]
                    break
        if not queue:
            del queues[key]
            self._heads[key].live -= 1
        del self.jobs[job.id]
        self.counts[key] -= 1
        if job.via is not None:
            left = self.via[job.via] - 1
            if left:
                self.via[job.via] = left
            else:
                del self.via[job.via]

    def head(self, user_id: Hashable, key: ClassKey) -> Job:
        return self._queues[user_id][key][0]

    def classes_of(self, user_id: Hashable) -> dict[ClassKey, deque[Job]]:
        """``user_id``'s non-empty queues by class."""
        return self._queues.get(user_id) or {}

    def position(self, job: Job, key: ClassKey) -> int | None:
        for index, queued in enumerate(self._queues[job.user_id][key]):
            if queued is job:
                return index + 1
        return None

    # -- heads -------------------------------------------------------------

    def push(self, key: ClassKey, sort_key: float, user_id: Hashable, version: int, valid: Callable[..., bool]) -> None:
        self._seq += 1
        heads = self._heads[key]
        heapq.heappush(heads.heap, (sort_key, self._seq, user_id, version))
        if len(heads.heap) > 64 and len(heads.heap) > 4 * heads.live:
            heads.heap = [e for e in heads.heap if valid(e, key)]
            heapq.heapify(heads.heap)

    def top(self, key: ClassKey, valid: Callable[[Entry, ClassKey], bool]) -> Entry | None:
        """The best valid entry of class ``key`` (stale ones above it are dropped)."""
        heads = self._heads.get(key)
        if heads is None or not heads.live:
            return None
        heap = heads.heap
        while heap and not valid(heap[0], key):
            heapq.heappop(heap)
        return heap[0] if heap else None

    def live_classes(self) -> Iterator[ClassKey]:
        return (key for key, heads in self._heads.items() if heads.live)

    def clear_heads(self) -> None:
        for heads in self._heads.values():
            heads.heap.clear()

    def has_queue(self, user_id: Hashable, key: ClassKey) -> bool:
        queues = self._queues.get(user_id)
        return bool(queues and queues.get(key))

    def check(self) -> None:
        """Assert the invariants (for tests)."""
        assert sum(len(q) for qs in self._queues.values() for q in qs.values()) == len(self.jobs)
        vias: dict[Hashable, int] = {}
        for job in self.jobs.values():
            if job.via is not None:
                vias[job.via] = vias.get(job.via, 0) + 1
        assert vias == self.via, (vias, self.via)
        for key, heads in self._heads.items():
            assert heads.live == sum(1 for qs in self._queues.values() if qs.get(key)), key
