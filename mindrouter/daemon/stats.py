"""Counters for `mr status`, `mr top` and /metrics, and the durable usage record.

Usage is written to the store when each request ends (so a SIGKILL loses
none); everything else here is in memory and costs a few additions per request.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

__all__ = ["Stats"]

BUCKET_SECONDS = 10.0
BUCKETS = 30
"""Per-backend throughput is kept in 10-second buckets for the last 5 minutes (`mr top`'s sparklines)."""


class Stats:
    def __init__(
        self,
        store: Any,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_usage: Callable[[int, str, int, float], None] | None = None,
    ) -> None:
        self.store = store
        self.on_usage = on_usage
        """Told (user id, group, tokens, wall time) of every usage row written: the quota counters."""
        self.clock = clock
        self.wall = wall
        self.started = clock()
        self.requests_total = 0
        self.prompt_tokens_total = 0
        self.completion_tokens_total = 0
        self.errors: Counter[int] = Counter()
        self.cancelled = 0
        self._recent: deque[tuple[float, int]] = deque()
        self._buckets: dict[int, dict[int, int]] = {}
        """backend id -> {bucket number: tokens completed in it}."""

    def completed(self, caller: Any, job: Any, backend_id: int, usage: Any, status: int, held: float = 0.0) -> None:
        """Count a finished request and write its usage row (``held``: seconds it held the backend slot)."""
        prompt = usage.prompt_tokens or 0
        completion = usage.completion_tokens or 0
        self.requests_total += 1
        self.prompt_tokens_total += prompt
        self.completion_tokens_total += completion
        if status >= 400:
            self.errors[status] += 1
        now = self.clock()
        recent = self._recent
        recent.append((now, prompt + completion))
        while recent and recent[0][0] < now - 60:
            recent.popleft()
        bucket = int(now // BUCKET_SECONDS)
        per = self._buckets.setdefault(backend_id, {})
        per[bucket] = per.get(bucket, 0) + completion
        if len(per) > BUCKETS + 1:
            for old in [b for b in per if b <= bucket - BUCKETS]:
                del per[old]
        if prompt or completion:
            at = self.wall()
            self.store.record_usage(
                caller.user_id,
                job.id,
                job.model,
                backend_id,
                prompt,
                completion,
                at,
                gpu_seconds=held,
                group=caller.group,
            )
            if self.on_usage is not None:
                self.on_usage(caller.user_id, caller.group, prompt + completion, at)

    def throughput(self) -> dict[int, list[float]]:
        """Completion tokens per second of each backend in each bucket of the last minutes, oldest first.

        The newest bucket is still filling, so it is left out.
        """
        now = int(self.clock() // BUCKET_SECONDS)
        return {
            bid: [per.get(b, 0) / BUCKET_SECONDS for b in range(now - BUCKETS, now)]
            for bid, per in self._buckets.items()
        }

    def count_error(self, status: int) -> None:
        self.errors[status] += 1

    def rates(self) -> tuple[float, float]:
        """Requests and tokens per second over the last minute (or since start)."""
        now = self.clock()
        recent = self._recent
        while recent and recent[0][0] < now - 60:
            recent.popleft()
        span = min(60.0, max(1.0, now - self.started))
        return len(recent) / span, sum(t for _, t in recent) / span

    @property
    def uptime(self) -> float:
        return self.clock() - self.started
