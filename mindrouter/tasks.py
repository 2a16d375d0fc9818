"""Background tasks that start with an aiohttp app and stop with it, in one place.

Every loop the daemon and ``mr agent`` keep running (the dispatch timer, probes,
GPU polls, the decision flush) is a task that must be cancelled and awaited on
shutdown, and must outlive a bug in one round. ``background`` makes the
``cleanup_ctx`` generator for such a task, ``repeat`` the loop, ``stop`` the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

__all__ = ["background", "repeat", "stop"]

log = logging.getLogger(__name__)


async def stop(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def background(name: str, run: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[Any], AsyncIterator[None]]:
    """An aiohttp ``cleanup_ctx`` generator that runs ``run()`` as a task while the app runs."""

    async def ctx(_app: Any) -> AsyncIterator[None]:
        task = asyncio.create_task(run(), name=name)
        try:
            yield
        finally:
            await stop(task)

    return ctx


async def repeat(
    interval: float, step: Callable[[], Awaitable[None] | None], what: str, *, wait_first: bool = False
) -> None:
    """Run ``step`` (sync or async) every ``interval`` seconds, forever; a failed round is logged, not fatal."""
    if wait_first:
        await asyncio.sleep(interval)
    while True:
        try:
            result = step()
            if result is not None:
                await result
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s failed", what)
        await asyncio.sleep(interval)
