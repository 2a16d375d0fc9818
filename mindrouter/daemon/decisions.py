"""Decision records: kept by the core, written to the store in batches, followed live.

Turning a record into JSON costs more than making the decision, so it happens
off the request path: in the flush task, or when a follower is listening.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..scheduler import DecisionRecord, Dispatch

__all__ = ["DecisionLog"]

log = logging.getLogger(__name__)


class DecisionLog:
    def __init__(self, store: Any, backend_name: Callable[[Any], str | None], *, flush_interval: float = 0.5) -> None:
        self.store = store
        self.backend_name = backend_name
        self.flush_interval = flush_interval
        self._pending: list[tuple[DecisionRecord, float]] = []
        self._followers: set[asyncio.Queue[bytes]] = set()

    def on_dispatch(self, dispatch: Dispatch) -> None:
        wall = time.time()
        self._pending.append((dispatch.record, wall))
        if self._followers:
            line = json.dumps(self._materialize(dispatch.record, wall)).encode() + b"\n"
            for queue in self._followers:
                if queue.qsize() < 1000:  # a stalled follower misses records rather than growing memory
                    queue.put_nowait(line)

    def _materialize(self, record: DecisionRecord, wall: float) -> dict[str, Any]:
        data = record.to_dict()
        data["wall_time"] = wall
        data["selected_backend"] = self.backend_name(record.selected_backend_id)
        return data

    def flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        try:
            self.store.add_decisions([self._materialize(record, wall) for record, wall in pending])
        except Exception:
            log.exception("could not store %d decision records", len(pending))

    async def flush_ctx(self, _app: Any) -> AsyncIterator[None]:
        async def loop() -> None:
            while True:
                await asyncio.sleep(self.flush_interval)
                self.flush()

        task = asyncio.create_task(loop(), name="mindrouter-decision-flush")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self.flush()

    def recent(self, limit: int, user: str | None = None) -> list[dict[str, Any]]:
        self.flush()
        return self.store.recent_decisions(limit, user=user)

    def get(self, request_id: str) -> dict[str, Any] | None:
        self.flush()
        return self.store.get_decision(request_id)

    def follow(self) -> asyncio.Queue[bytes]:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._followers.add(queue)
        return queue

    def unfollow(self, queue: asyncio.Queue[bytes]) -> None:
        self._followers.discard(queue)
