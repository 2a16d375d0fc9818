"""The durable usage record: one row for each request that used tokens, written in group commits.

Usage rows are written in a group commit: the rows of every request that ended
in one turn of the event loop are written together, in one transaction, as soon
as that turn is over (``call_soon``). What each running stream has delivered so
far is written too, once a second (``STREAM_WRITE_SECONDS``), in the same kind
of commit, and becomes the request's usage row at the next start if the daemon
is killed. A SIGKILL therefore loses the rows of the turn it interrupts, well
under a millisecond of usage, and at most the last second of each running
stream, while a busy daemon pays one commit for many requests.

The loop never waits for the write lock: while the store's worker thread is in
a transaction of its own (retention's deletes, a report's roll-up), the rows
wait in memory and go in the first commit after it (``RETRY_SECONDS``), so a
delete that runs long holds up no request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from ...store import Store
from ...store.errors import Busy
from ..request.settlement import Settlement, Streaming

__all__ = ["UsageWriter"]

log = logging.getLogger(__name__)

RETRY_SECONDS = 0.001
"""How soon a write that found another thread writing tries again."""
STREAM_WRITE_SECONDS = 1.0
"""How often what running streams have delivered is written (what a SIGKILL may lose of each)."""

_Row = tuple[Any, str, str, Any, int, int, float, float, str]
"""(user id, request id, model, backend id, prompt tokens, completion tokens, wall time, held, group)."""


class UsageWriter:
    def __init__(
        self,
        store: Store,
        *,
        wall: Callable[[], float] = time.time,
        on_usage: Callable[[Any, str, int, float, int], None] | None = None,
    ) -> None:
        self.store = store
        self.on_usage = on_usage
        """Told (user id, group, tokens, wall time, completion tokens) of every usage row: the quota counters."""
        self.wall = wall
        self._unwritten: list[_Row] = []
        self._streaming: dict[str, _Row] = {}
        """Running streams' rows changed since the last write, by request id."""
        self._stored_open: set[str] = set()
        """Request ids with a streaming row in the store."""
        self._ended: list[str] = []
        self._stream_timer: asyncio.TimerHandle | None = None
        self._retry: asyncio.TimerHandle | None = None

    def write(self) -> None:
        """Write the usage rows not yet in the store (called after each loop turn that ended requests)."""
        rows, self._unwritten = self._unwritten, []
        streaming, self._streaming = self._streaming, {}
        ended, self._ended = self._ended, []
        try:
            self.store.record_usages(rows, streaming=list(streaming.values()), ended=ended, wait=False)
        except Busy:  # the worker writes: these go in the first commit after its transaction
            self._unwritten[:0] = rows
            self._streaming = streaming | self._streaming
            self._ended[:0] = ended
            if self._retry is None:
                self._retry = asyncio.get_running_loop().call_later(RETRY_SECONDS, self._write_again)
            return
        except Exception:
            log.exception("could not store %d usage rows", len(rows) + len(streaming))
            return
        self._stored_open.update(streaming)

    def _write_again(self) -> None:
        self._retry = None
        self.write()

    def _write_streams(self) -> None:
        self._stream_timer = None
        self.write()

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
        """Write the usage row of a request that ended (every request that used tokens has one)."""
        job = s.job
        self._streaming.pop(job.id, None)
        if job.id in self._stored_open:  # its streaming row goes in the commit that writes its usage row
            self._stored_open.discard(job.id)
            if not (self._unwritten or self._ended):
                asyncio.get_running_loop().call_soon(self.write)
            self._ended.append(job.id)
        prompt, completion = s.prompt_tokens, s.completion_tokens
        if prompt or completion:
            if not (self._unwritten or self._ended):
                asyncio.get_running_loop().call_soon(self.write)
            self._unwritten.append(
                (job.user_id, job.id, job.model, s.backend_id, prompt, completion, s.wall, s.held, s.group)
            )
            if self.on_usage is not None:
                self.on_usage(job.user_id, s.group, prompt + completion, s.wall, completion)
