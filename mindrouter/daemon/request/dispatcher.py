"""The dispatcher: connects waiting requests to the scheduler core.

The core decides; this class only keeps one future per queued job, reads the
clock, and runs ``dispatch`` whenever something changed (a job arrived or
ended, a backend changed). A timer task wakes at the core's next deadline to
expire jobs that waited too long. Handlers never call the core themselves:
each request's :class:`~.lease.Lease` (which knows the dispatcher; the
dispatcher knows no lease) takes the slot and gives it back through
``finish`` / ``fail`` / ``abandon``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import RequestError
from ...scheduler import Dispatch, Job, Scheduler, Timings
from ...tasks import background
from .settlement import Settlement, Streaming

if TYPE_CHECKING:  # protocols only: nothing of them runs
    from .ports import Backends, Reservations

__all__ = ["Dispatcher", "backend_failed", "done_or_after", "unsupported"]

log = logging.getLogger(__name__)


class Dispatcher:
    """Queues jobs in the core and hands each request its slot.

    Args:
        scheduler: the core.
        backends: opens calls and keeps the circuit breakers (the registry).
        on_settled: told once how each request ended (stats, usage, decision records).
        quotas: what each job may stream within its quota reservation (None: no quotas).
        on_streamed: told a stream's answer so far with each charge (the durable streaming usage).
        max_retries: other backends tried when one fails before its first byte.
        clock: the one clock of the queue and of every lease (seconds, monotonic).
        wall: the wall clock that stamps each settlement (its usage row and decision record).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        backends: Backends,
        *,
        on_settled: Callable[[Settlement], None],
        quotas: Reservations | None = None,
        on_streamed: Callable[[Streaming, int], None] | None = None,
        max_retries: int = 2,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.scheduler = scheduler
        self.backends = backends
        self.on_settled = on_settled
        self.quotas = quotas
        self.on_streamed = on_streamed
        self.max_retries = max_retries
        self.clock = clock
        self.wall = wall
        self._waiters: dict[str, asyncio.Future[Dispatch]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer_wake = asyncio.Event()
        self._timer_until = math.inf
        """When the timer next wakes by itself."""
        self.expired_total = 0
        self.timer_ctx = background("mindrouter-dispatch-timer", self.run_timer)
        """aiohttp ``cleanup_ctx`` generator running the timer."""

    # -- the job's life (called by Lease) ------------------------------------

    def submit(self, job: Job) -> asyncio.Future[Dispatch]:
        """Queue ``job``; the future resolves with its dispatch.

        Raises:
            RequestError: the core refused the job (404, 400, 429, 503).
        """
        rejection = self.scheduler.submit(job, self.clock())
        if rejection is not None:
            said = self.backends.lacking(job.model, job.modality) if rejection.code == "unsupported" else ""
            if said:  # routing learnt it from the backends' answers: name what they lack, as the first refusal did
                raise unsupported(job.model, job.modality, said)
            raise RequestError(
                rejection.message,
                status=rejection.status,
                type=_TYPES.get(rejection.status, "invalid_request_error"),
                code=rejection.code,
                retry_after=rejection.retry_after,
            )
        future = self._future()
        self._waiters[job.id] = future
        self.pump()
        self._deadline_moved()
        return future

    def requeued(self, job: Job) -> asyncio.Future[Dispatch]:
        """A future for a job the core queued again after a failure."""
        future = self._future()
        self._waiters[job.id] = future
        self.pump()
        return future

    def _future(self) -> asyncio.Future[Dispatch]:
        """A waiter on the daemon's loop, found once: on Python 3.11 each ``get_running_loop`` is a system call."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop.create_future()

    def finish(
        self,
        job_id: str,
        *,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        latency: float | None,
        duration: float | None,
        timings: Timings | None = None,
        cached_tokens: int | None = None,
    ) -> None:
        if self.scheduler.complete(
            job_id,
            self.clock(),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency=latency,
            duration=duration,
            timings=timings,
            cached_tokens=cached_tokens,
        ):
            self.pump()
            self._deadline_moved()

    def progress(self, job_id: str, completion_tokens: int) -> None:
        """Charge a streaming job's tokens so far (cumulative) as they are produced."""
        self.scheduler.progress(job_id, self.clock(), completion_tokens=completion_tokens)

    def fail(self, job_id: str, *, retry: bool, prompt_tokens: int = 0, completion_tokens: int = 0) -> bool:
        """The backend failed; True when the job is queued again (call ``requeued``)."""
        again = self.scheduler.fail(
            job_id, self.clock(), retry=retry, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
        )
        if not again:  # a job queued again is pumped by ``requeued``, once its waiter exists
            self.pump()
            self._deadline_moved()
        return again

    def abandon(self, job_id: str, *, prompt_tokens: int | None = None, completion_tokens: int = 0) -> None:
        """The client went away: free whatever the job holds (a no-op if it already ended)."""
        self._waiters.pop(job_id, None)
        if self.scheduler.cancel(
            job_id, self.clock(), prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
        ):
            self.pump()

    # -- deciding ----------------------------------------------------------

    def pump(self) -> None:
        """Start everything that can start now."""
        now = self.clock()
        for dispatch in self.scheduler.dispatch(now):
            future = self._waiters.pop(dispatch.job.id, None)
            if future is None or future.done():
                # Its waiter is gone (cancelled between decisions): free the slot at once.
                self.scheduler.cancel(dispatch.job.id, now, prompt_tokens=0)
                continue
            future.set_result(dispatch)
        for job, exc in self.scheduler.take_unstartable():
            log.error("request %s could not be started", job.id, exc_info=exc)
            future = self._waiters.pop(job.id, None)
            if future is not None and not future.done():
                future.set_exception(
                    RequestError(
                        "mindrouter could not start this request (an internal error, logged with its request id);"
                        " tell your admin",
                        status=500,
                        type="internal_error",
                        code="internal_error",
                    )
                )

    def expire(self) -> int:
        """Fail the jobs that waited past ``queue_timeout`` with 504."""
        expired = self.scheduler.expire(self.clock())
        for item in expired:
            future = self._waiters.pop(item.job.id, None)
            if future is not None and not future.done():
                future.set_exception(
                    RequestError(
                        f"request waited {item.waited:.0f} s in the queue without a free backend;"
                        " try again later or ask an admin to add capacity",
                        status=504,
                        type="timeout",
                        code="queue_timeout",
                    )
                )
        self.expired_total += len(expired)
        return len(expired)

    def _deadline_moved(self) -> None:
        """Wake the timer early only for a deadline before its own wake-up: a job queued with a short
        ``queue_timeout``, or a slot held for its user (anticipation) when a job ended."""
        deadline = self.scheduler.next_deadline()
        if deadline is not None and deadline < self._timer_until:
            self._timer_wake.set()

    async def run_timer(self) -> None:
        """Wake at each deadline to expire jobs, and once a second to refresh fair-share state."""
        while True:
            deadline = self.scheduler.next_deadline()
            delay = 1.0 if deadline is None else min(1.0, max(0.0, deadline - self.clock()))
            self._timer_until = self.clock() + delay
            self._timer_wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._timer_wake.wait(), timeout=delay)
            try:
                self.expire()
                self.pump()
            except Exception:  # the timer must outlive any bug in one round
                log.exception("dispatcher timer round failed")

    @property
    def waiting(self) -> int:
        return len(self._waiters)


def unsupported(model: str, modality: Any, said: str) -> RequestError:
    """The 400 for a request no backend can serve because each that has the model said it lacks ``modality``."""
    message = (
        f"no backend serving {model!r} can answer {modality.value} requests ({said}); use a model served "
        "with them, or ask an admin to enable them on that backend"
    )
    return RequestError(message, status=400, type="invalid_request_error", code="unsupported")


def backend_failed(error: str, tried: int) -> RequestError:
    """The 503 once ``tried`` backends failed the request before its first byte, ``error`` the last one's."""
    message = (
        f"the backend failed ({error}) and no other backend could take the request; try again shortly"
        if tried == 1
        else f"{tried} backends failed (last: {error}); try again shortly"
    )
    return RequestError(message, status=503, type="service_unavailable", code="backend_failed", retry_after=5)


def _wake(waiter: asyncio.Future[None], *_: object) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def done_or_after(future: asyncio.Future[Any], seconds: float) -> None:
    """Return once ``future`` is done or ``seconds`` have passed, leaving it as it is.

    ``asyncio.wait({future}, timeout=seconds)`` for one future, without its two sets, its
    closure and its second coroutine: a waiting stream sits in this between heartbeats.
    """
    loop = future.get_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    wake = functools.partial(_wake, waiter)
    timer = loop.call_later(seconds, wake)
    future.add_done_callback(wake)
    try:
        await waiter
    finally:
        timer.cancel()
        future.remove_done_callback(wake)


_TYPES = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout",
}
