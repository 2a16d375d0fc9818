"""Counters for `mr status`, `mr top` and /metrics: in memory, a few additions per request.

The durable usage rows are ``writer.UsageWriter``'s.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable

from ..request.settlement import Outcome, Settlement

__all__ = ["Stats"]

BUCKET_SECONDS = 10.0
BUCKETS = 30
"""Per-backend throughput is kept in 10-second buckets for the last 5 minutes (`mr top`'s sparklines)."""


class Stats:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self.requests_total = 0
        self.prompt_tokens_total = 0
        self.completion_tokens_total = 0
        self.errors: Counter[str] = Counter()
        """Error answers by the status the client got, and "stream" for a stream ended by an error after its
        first byte: counted where every answer is prepared and where a stream ends (``count_error``)."""
        self.cancelled = 0
        self._recent: deque[tuple[float, int]] = deque()
        self._buckets: dict[int, dict[int, int]] = {}
        """backend id -> {bucket number: tokens completed in it}."""

    def settled(self, s: Settlement) -> None:
        """Count a request that ended."""
        if s.outcome is Outcome.CLIENT_GONE:
            self.cancelled += 1
        if not s.answered:
            return  # no backend answered: the handler counted its error status
        prompt, completion = s.prompt_tokens, s.completion_tokens
        self.requests_total += 1
        self.prompt_tokens_total += prompt
        self.completion_tokens_total += completion
        now = self.clock()
        recent = self._recent
        recent.append((now, prompt + completion))
        while recent and recent[0][0] < now - 60:
            recent.popleft()
        bucket = int(now // BUCKET_SECONDS)
        per = self._buckets.setdefault(s.backend_id, {})  # type: ignore[arg-type]
        per[bucket] = per.get(bucket, 0) + completion
        if len(per) > BUCKETS + 1:
            for old in [b for b in per if b <= bucket - BUCKETS]:
                del per[old]

    def throughput(self) -> dict[int, list[float]]:
        """Completion tokens per second of each backend in each bucket of the last minutes, oldest first.

        The newest bucket is still filling, so it is left out.
        """
        now = int(self.clock() // BUCKET_SECONDS)
        return {
            bid: [per.get(b, 0) / BUCKET_SECONDS for b in range(now - BUCKETS, now)]
            for bid, per in self._buckets.items()
        }

    def count_error(self, status: int | str) -> None:
        """One error answer: its status, or "stream" for a stream that ended in an error after its first byte."""
        self.errors[str(status)] += 1

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
