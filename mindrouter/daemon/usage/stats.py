"""Counters for `mr status`, `mr top` and /metrics, and the durable usage record.

Usage rows are written in a group commit: the rows of every request that ended
in one turn of the event loop are written together, in one transaction, as soon
as that turn is over (``call_soon``). What each running stream has delivered so
far is written too, once a second (``STREAM_WRITE_SECONDS``), in the same kind
of commit, and becomes the request's usage row at the next start if the daemon
is killed. A SIGKILL therefore loses the rows of the turn it interrupts, well
under a millisecond of usage, and at most the last second of each running
stream, while a busy daemon pays one commit for many requests. Everything else
here is in memory and costs a few additions per request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from ...store import Store
from ..request.settlement import Outcome, Settlement, Streaming

__all__ = ["Stats"]

log = logging.getLogger(__name__)

STREAM_WRITE_SECONDS = 1.0
"""How often what running streams have delivered is written (what a SIGKILL may lose of each)."""
BUCKET_SECONDS = 10.0
BUCKETS = 30
"""Per-backend throughput is kept in 10-second buckets for the last 5 minutes (`mr top`'s sparklines)."""


class Stats:
    def __init__(
        self,
        store: Store,
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
        self.errors: Counter[str] = Counter()
        """Error answers by the status the client got, and "stream" for a stream ended by an error after its
        first byte: counted where every answer is prepared and where a stream ends (``count_error``)."""
        self.cancelled = 0
        self._recent: deque[tuple[float, int]] = deque()
        self._buckets: dict[int, dict[int, int]] = {}
        """backend id -> {bucket number: tokens completed in it}."""
        self._unwritten: list[tuple[Any, str, str, Any, int, int, float, float, str]] = []
        self._streaming: dict[str, tuple[Any, str, str, Any, int, int, float, float, str]] = {}
        """Running streams' rows changed since the last write, by request id."""
        self._stored_open: set[str] = set()
        """Request ids with a streaming row in the store."""
        self._ended: list[str] = []
        self._stream_timer: asyncio.TimerHandle | None = None

    def write_usage(self) -> None:
        """Write the usage rows not yet in the store (called after each loop turn that ended requests)."""
        rows, self._unwritten = self._unwritten, []
        streaming, self._streaming = self._streaming, {}
        ended, self._ended = self._ended, []
        try:
            self.store.record_usages(rows, streaming=list(streaming.values()), ended=ended)
        except Exception:
            log.exception("could not store %d usage rows", len(rows) + len(streaming))
            return
        self._stored_open.update(streaming)

    def _write_streams(self) -> None:
        self._stream_timer = None
        self.write_usage()

    def streamed(self, lease: Streaming, completion: int) -> None:
        """A running stream's answer so far: kept for the next write, so a kill loses at most that second."""
        job = lease.job
        self._streaming[job.id] = (
            job.user_id,
            job.id,
            job.model,
            lease.backend_id,
            job.prompt_tokens,
            completion,
            self.wall(),
            lease.held,
            lease.group,
        )
        if self._stream_timer is None:
            self._stream_timer = asyncio.get_running_loop().call_later(STREAM_WRITE_SECONDS, self._write_streams)

    def settled(self, s: Settlement) -> None:
        """Count a request that ended, and write its usage row (every request that used tokens has one)."""
        if s.outcome is Outcome.CLIENT_GONE:
            self.cancelled += 1
        job = s.job
        self._streaming.pop(job.id, None)
        if job.id in self._stored_open:  # its streaming row goes in the commit that writes its usage row
            self._stored_open.discard(job.id)
            if not (self._unwritten or self._ended):
                asyncio.get_running_loop().call_soon(self.write_usage)
            self._ended.append(job.id)
        prompt, completion = s.prompt_tokens, s.completion_tokens
        if prompt or completion:
            if not (self._unwritten or self._ended):
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
