"""Counters for `mr status`, `mr top` and /metrics, and the durable usage record.

Usage rows are written in a group commit: the rows of every request that ended
in one turn of the event loop are written together, in one transaction, as soon
as that turn is over (``call_soon``). A SIGKILL therefore loses at most the rows
of the turn it interrupts, well under a millisecond of usage, while a busy
daemon pays one commit for many requests. Everything else here is in memory and
costs a few additions per request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from .lease import Outcome, Settlement

__all__ = ["Stats"]

log = logging.getLogger(__name__)

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
        on_usage: Callable[[Any, str, int, float, int], None] | None = None,
    ) -> None:
        self.store = store
        self.on_usage = on_usage
        """Told (user id, group, tokens, wall time, completion tokens) of every usage row: the quota counters."""
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
        self._unwritten: list[tuple[Any, str, str, Any, int, int, float, float, str]] = []

    def write_usage(self) -> None:
        """Write the usage rows not yet in the store (called after each loop turn that ended requests)."""
        rows, self._unwritten = self._unwritten, []
        try:
            self.store.record_usages(rows)
        except Exception:
            log.exception("could not store %d usage rows", len(rows))

    def settled(self, s: Settlement) -> None:
        """Count a request that ended, and write its usage row (every request that used tokens has one)."""
        if s.outcome is Outcome.CLIENT_GONE:
            self.cancelled += 1
        prompt, completion = s.prompt_tokens, s.completion_tokens
        if prompt or completion:
            job = s.job
            if not self._unwritten:
                asyncio.get_running_loop().call_soon(self.write_usage)
            self._unwritten.append(
                (job.user_id, job.id, job.model, s.backend_id, prompt, completion, s.wall, s.held, s.group)
            )
            if self.on_usage is not None:
                self.on_usage(job.user_id, s.group, prompt + completion, s.wall, completion)
        if not s.answered:
            return  # no backend answered: the handler counted its error status
        self.requests_total += 1
        self.prompt_tokens_total += prompt
        self.completion_tokens_total += completion
        if s.status >= 400 and s.outcome is not Outcome.CLIENT_GONE:
            self.errors[s.status] += 1
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
