"""Decision records, with how each request ended: written to the store in batches, followed live.

The core makes one record per dispatch; a request's lease hands them all over
once it has settled, each with its attempt's outcome (``ok``, ``client_gone``,
``backend_failed``, ``timeout``, ``rejected``, ``error``) and reason. A request
that never left the queue (refused, timed out, its client gone) gets a record
too, without a backend. Turning a record into JSON costs more than making the
decision, so it happens off the request path: in the flush task, or when a
follower is listening. Every 0.1 s the task encodes what has ended a slice
at a time (``SLICE`` requests, about half a millisecond), letting requests run
between slices, then writes it all in one commit. Encoding a round's records
at once stalled the loop for 7-25 ms at 2,000 requests/s, and every request in
flight waited that long: it was the largest part of the p99 latency
(docs/performance.md). This is the records' one home until the store has them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from ...scheduler import DecisionRecord
from ...store import DecisionRow, Store, decision_row, encode_record
from ...tasks import background, repeat
from .settlement import Settlement

__all__ = ["DecisionLog"]

log = logging.getLogger(__name__)

SLICE = 16
"""Requests whose records the flush task encodes in one turn of the event loop (about 0.5 ms)."""


class DecisionLog:
    def __init__(self, store: Store, backend_name: Callable[[Any], str | None], *, flush_interval: float = 0.1) -> None:
        self.store = store
        self.backend_name = backend_name
        self.flush_interval = flush_interval
        self._pending: deque[Settlement] = deque()
        self._rows: list[DecisionRow] = []
        """Records encoded for the store, not yet written."""
        self._followers: set[asyncio.Queue[bytes]] = set()
        self.flush_ctx = background(
            "mindrouter-decision-flush", lambda: repeat(flush_interval, self._drain, "decision flush", wait_first=True)
        )
        """aiohttp ``cleanup_ctx`` generator writing records every ``flush_interval`` seconds."""

    def settled(self, settlement: Settlement) -> None:
        """A request ended: keep its records (cheap); materialize them now only for followers."""
        self._pending.append(settlement)
        if self._followers:
            for data in self._materialize(settlement):
                line = encode_record(data).encode() + b"\n"
                for queue in self._followers:
                    if queue.qsize() < 1000:  # a stalled follower misses records rather than growing memory
                        queue.put_nowait(line)

    def _materialize(self, s: Settlement) -> list[dict[str, Any]]:
        out = [self._attempt(a.record, s.wall, a.outcome.value, a.reason) for a in s.attempts]
        if not out:
            out.append(_undispatched(s))
        out[-1].update(outcome=s.outcome.value, reason=s.reason, status=s.status)
        return out

    def _attempt(self, record: DecisionRecord, wall: float, outcome: str, reason: str | None) -> dict[str, Any]:
        data = record.to_dict()
        data.update(
            wall_time=wall,
            selected_backend=self.backend_name(record.selected_backend_id),
            outcome=outcome,
            reason=reason,
        )
        return data

    def flush(self) -> None:
        """Write every record now: a reader wants them, or the daemon stops."""
        self._encode(len(self._pending))
        self._write()

    async def _drain(self) -> None:
        """The flush task's round: encode what has ended a slice at a time, then write it in one commit.

        Requests that end meanwhile wait for the next round, so a round always ends.
        """
        for _ in range(-(-len(self._pending) // SLICE)):
            self._encode(SLICE)
            await asyncio.sleep(0)
        self._write()

    def _encode(self, count: int) -> None:
        """Encode the records of the ``count`` requests that ended first."""
        pending = self._pending
        for _ in range(min(count, len(pending))):
            self._rows.extend(decision_row(data) for data in self._materialize(pending.popleft()))

    def _write(self) -> None:
        rows, self._rows = self._rows, []
        try:
            self.store.add_decision_rows(rows)
        except Exception:
            log.exception("could not store %d decision records", len(rows))

    def recent(
        self, limit: int, user: str | None = None, fields: Mapping[str, str] | None = None, searched: int = 0
    ) -> list[dict[str, Any]]:
        """The newest records, oldest first (``Store.recent_decisions``: ``fields`` among the newest ``searched``)."""
        self.flush()
        return self.store.recent_decisions(limit, user=user, fields=fields, searched=searched)

    def get(self, request_id: str) -> dict[str, Any] | None:
        self.flush()
        return self.store.get_decision(request_id)

    def follow(self) -> asyncio.Queue[bytes]:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._followers.add(queue)
        return queue

    def unfollow(self, queue: asyncio.Queue[bytes]) -> None:
        self._followers.discard(queue)


def _undispatched(s: Settlement) -> dict[str, Any]:
    """The record of a request no backend was chosen for (refused, timed out, its client gone): DESIGN §7's
    fields all there, the priority terms null (no pick was made), the reason added by ``_materialize``."""
    job = s.job
    return {
        "request_id": job.id,
        "selected_backend_id": None,
        "selected_backend": None,
        "candidate_backends": [],
        "scores": {},
        "user_deficit": None,
        "user_weight": None,
        "user_group": s.group,
        "user_recent_usage": None,
        "user_id": job.user_id,
        "user": s.user,
        "model": job.model,
        "queue_wait": round(s.waited, 6),
        "attempt": 0,
        "wall_time": s.wall,
    }
