"""Retention, once a minute and at start: old usage rows and decision records go, on the store's worker thread.

The deletes run in short transactions there (``StoreWorker``), so no request waits behind a batch of
them on the event loop; a backlog (a shorter ``usage_retention_days``, a first start after an upgrade)
drains in the background at full speed. On a shared PostgreSQL store only the leader deletes, fenced by
its epoch (a leader that was frozen and resumes deletes nothing), and a new leader starts within a
second of taking over.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from ...store.worker import StoreWorker

__all__ = ["RETAIN_SECONDS", "retention_ctx"]

log = logging.getLogger(__name__)

RETAIN_SECONDS = 60.0
LOOK_SECONDS = 1.0
"""How often a standby looks whether it leads now."""


def retention_ctx(
    worker: StoreWorker,
    leading: Callable[[], bool] = lambda: True,
    epoch: Callable[[], int | None] = lambda: None,
    wall: Callable[[], float] = time.time,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup context that runs retention until the daemon stops, then closes the worker.

    Args:
        leading: whether this router leads its pool (always on SQLite).
        epoch: the leader epoch it leads in on PostgreSQL, else None.
    """

    async def retain() -> None:
        last = -float("inf")
        while True:
            if leading() and time.monotonic() - last >= RETAIN_SECONDS:
                last = time.monotonic()
                try:
                    usage, decisions = await asyncio.wrap_future(worker.retain(wall(), epoch()))
                except Exception:  # a locked or full disk, a lost leadership: the next round tries again
                    log.exception("could not delete old usage rows and decision records")
                else:
                    if usage or decisions:
                        log.info("retention deleted %d usage rows and %d decision records", usage, decisions)
            await asyncio.sleep(LOOK_SECONDS)

    async def ctx(_app: web.Application) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(retain())
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await asyncio.get_running_loop().run_in_executor(None, worker.close)

    return ctx
