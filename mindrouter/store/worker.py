"""A thread with a Store of its own: reports, listings and retention run there, off the daemon's event loop.

At 10 M usage rows a `mr usage` took about 0.5 s and retention's 8,192-row deletes 140-280 ms, on the
loop, and every request waited (issue 33). Here they run on a second connection to the same database
(WAL: readers never block the loop's writes). Deletes run in short transactions, each sized to take
about ``batch_seconds``, with a pause (``PAUSE``) between them, so a commit of the loop waits at most
about one of them for the write lock (``schema.transaction``'s lock hands it over at once). The sqlite3
module lets go of the GIL while SQLite works; between its statements the worker needs the GIL back,
so while the loop is busy with Python a 1 ms delete can take 5-15 ms (the interpreter's switch interval).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..localtime import day_start

__all__ = ["StoreWorker", "json_bytes", "sorted_in_slices"]

log = logging.getLogger(__name__)

T = TypeVar("T")
DAY = 86_400.0
PAUSE = 0.005
"""Seconds at least between two deletes, so the loop's commits (``schema.transaction``) go in between."""


SLICE = 500
"""Items of a list ``json_bytes`` encodes, or ``sorted_in_slices`` sorts, at a time."""


def json_bytes(value: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """``value`` as JSON, a long list a ``SLICE`` of items at a time, for an answer built on the worker.

    One ``json.dumps`` holds the GIL from start to end: 20-30 ms for 10,000 rows, and the event loop
    stood still that long. Between slices the loop gets its turn.
    """
    return _encoded(value, default).encode()


def sorted_in_slices(items: list[T], key: Callable[[T], Any]) -> list[T]:
    """``sorted(items, key=key)`` (stable), a ``SLICE`` at a time, merged in Python, for rows sorted on the worker.

    One sort compares in C with the GIL held from start to end: 7-11 ms for a report's 30,000 rows on a slow
    core, and the event loop stood still that long (a 27.6 ms stall in 40 reports at 10,000 users). Between
    the slices' sorts and the merge's steps the loop gets its turn.
    """
    if len(items) <= SLICE:
        return sorted(items, key=key)
    runs = [sorted(items[i : i + SLICE], key=key) for i in range(0, len(items), SLICE)]
    return list(heapq.merge(*runs, key=key))


def _encoded(value: Any, default: Callable[[Any], Any] | None) -> str:
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{_encoded(v, default)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple) and len(value) > SLICE:
        parts = (json.dumps(list(value[i : i + SLICE]), default=default)[1:-1] for i in range(0, len(value), SLICE))
        return "[" + ",".join(parts) + "]"
    return json.dumps(value, default=default)


class StoreWorker:
    """One thread, one connection; calls run in the order they were handed in.

    Args:
        path: the daemon's SQLite file.
        usage_retention: seconds per-request usage rows are kept.
        decision_days: days decision records are kept (whole local days: records go a day at a time).
        batch_seconds: about how long one delete transaction may hold the write lock.
        url: the daemon's ``[store] url`` (PostgreSQL), else empty: ``path``.
    """

    def __init__(
        self,
        path: Path,
        *,
        usage_retention: float,
        decision_days: float,
        batch_seconds: float = 0.001,
        url: str = "",
    ) -> None:
        self.path = path
        self.url = url
        self.usage_retention = usage_retention
        self.decision_days = decision_days
        self.batch_seconds = batch_seconds
        self.batch = 256
        """Rows a delete takes at a time, adjusted so that one takes about ``batch_seconds``."""
        self._local = threading.local()
        self._epoch: int | None = None
        """The epoch the worker's store is fenced by (its thread alone reads and sets it)."""
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mindrouter-store")

    def _store(self) -> Any:
        store = getattr(self._local, "store", None)
        if store is None:
            from .db import Store

            store = self._local.store = Store(
                self.path, usage_retention=self.usage_retention, prune_inline=False, url=self.url
            )
            store.checkpoint_elsewhere()  # the daemon's Checkpointer: a delete's commit, lock held, never fsyncs
        return store

    def submit(self, fn: Callable[[Any], T]) -> concurrent.futures.Future[T]:
        """Run ``fn(store)`` on the worker's thread with its own ``Store``."""
        return self._pool.submit(lambda: fn(self._store()))

    async def run(self, fn: Callable[[Any], T]) -> T:
        """``submit`` for a coroutine: the event loop serves others while ``fn`` runs."""
        return await asyncio.wrap_future(self.submit(fn))

    def retain(self, now: float, epoch: int | None = None) -> concurrent.futures.Future[tuple[int, int]]:
        """Delete what retention lets go, in short transactions; returns (usage rows, decision records) deleted.

        Args:
            epoch: on PostgreSQL, the leader epoch the router leads in: the deletes are fenced by it, so a
                leader that was frozen and resumes deletes nothing (``Store.fence``).
        """
        return self.submit(lambda store: self._retain(store, now, epoch))

    def _retain(self, store: Any, now: float, epoch: int | None) -> tuple[int, int]:
        if epoch is not None and epoch != self._epoch:
            store.fence(epoch)
            self._epoch = epoch
        usage = self._batches(lambda limit: store.prune_usage(now, limit=limit))
        before = day_start(now - self.decision_days * DAY)
        return usage, self._batches(lambda limit: store.prune_decisions(before, limit=limit))

    def _batches(self, delete: Callable[[int], int]) -> int:
        total = 0
        while True:
            limit = self.batch
            began = time.perf_counter()
            deleted = delete(limit)
            took = time.perf_counter() - began
            total += deleted
            if deleted < limit:
                return total
            self.batch = max(16, min(4096, int(limit * min(2.0, self.batch_seconds / max(took, 1e-5)))))
            time.sleep(max(PAUSE, 4 * took))  # the loop's commits go in between: at most a fifth of the time is ours

    def close(self) -> None:
        """Finish what was handed in, then close the connection."""

        def closing() -> None:
            store = getattr(self._local, "store", None)
            if store is not None:
                store.close()

        self._pool.submit(closing)
        self._pool.shutdown(wait=True)
