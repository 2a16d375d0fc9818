"""A request's claim on a backend slot, from the queue to its usage row.

One :class:`Lease` per request owns everything between "the client asked"
and "the books are settled": waiting in the queue, opening the answer on the
dispatched backend, failing over before the first byte (never back to a
backend that already failed this request), the backend's circuit breaker and
drain bookkeeping, and how the request ended. The HTTP handler only
translates HTTP::

    async with dispatcher.lease(job, call, user="alice") as lease:   # RequestError: rejected
        upstream = await lease.open()            # RequestError: 503 backend_failed, 504 timeout, 400
        async for chunk in lease.chunks():
            await response.write(chunk)
        lease.finish()

Leaving the block without ``finish()`` (the client went away, a write
failed, the daemon shuts down) cancels the job, closes the upstream so the
backend stops generating, and charges what was used. Every lease ends in
exactly one :class:`Settlement`, handed to the dispatcher's ``on_settled``. The per-chunk
relay (``chunks``) is in ``relay.py``.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Hashable
from enum import Enum
from typing import TYPE_CHECKING, Any

from ...backends import Fault
from ...backends.base import BackendError, Call, Upstream
from ...errors import RequestError
from ...scheduler import DecisionRecord, Dispatch, Job, Timings
from .relay import AnswerRelay
from .settlement import Attempt, Outcome, Settlement

if TYPE_CHECKING:
    from .dispatcher import Dispatcher

__all__ = ["Lease", "State", "unsupported"]


class State(Enum):
    """Where a lease is in its life; each transition has one method (named in brackets)."""

    NEW = "new"
    QUEUED = "queued"
    """The job waits for a slot [``enter``; again after a failover in ``open``]."""
    DISPATCHED = "dispatched"
    """A slot is ours; the answer is being opened there [``open``]."""
    STREAMING = "streaming"
    """The backend's answer is open [``open``]."""
    SETTLED = "settled"
    """The books are closed: one settlement went out [``_settle``: ``finish``, ``withdraw``, ``refuse``, the exit]."""


def unsupported(model: str, modality: Any, said: str) -> RequestError:
    """The 400 for a request no backend can serve because each that has the model said it lacks ``modality``."""
    message = (
        f"no backend serving {model!r} can answer {modality.value} requests ({said}); use a model served "
        "with them, or ask an admin to enable them on that backend"
    )
    return RequestError(message, status=400, type="invalid_request_error", code="unsupported")


class Lease(AnswerRelay):
    """One request's slot: create with :meth:`Dispatcher.lease`, use as ``async with``.

    Slotted, and its attempt list and failure map made only when a dispatch needs them: thousands
    of leases may wait at once (issue 20's memory target).
    """

    __slots__ = (
        "_attempts",
        "_failed_on",
        "_future",
        "_held_since",
        "_holding",
        "_record",
        "backend_id",
        "call",
        "dispatcher",
        "group",
        "job",
        "state",
        "upstream",
        "user",
    )

    def __init__(self, dispatcher: Dispatcher, job: Job, call: Call, user: str, group: str = "") -> None:
        self.dispatcher = dispatcher
        self.job = job
        self.call = call
        self.user = user
        self.group = group
        self.upstream: Upstream | None = None
        self.backend_id: Hashable | None = None
        """The backend dispatched to last."""
        self._holding = False
        """A slot on ``backend_id`` is ours until released."""
        self._held_since: float | None = None
        self._future: asyncio.Future[Dispatch] | None = None
        self._record: DecisionRecord | None = None
        self._attempts: tuple[Attempt, ...] = ()
        self._failed_on: dict[Hashable, str] | None = None
        """Backends that failed this request, with their error (made on the first failure)."""
        self.state = State.NEW

    # -- the request's life ------------------------------------------------

    def enter(self) -> Lease:
        """Queue the job, once: admission does it, so that a refusal comes before the handler goes on.

        Raises:
            RequestError: the core refused the job (the lease has settled as rejected).
        """
        if self.state is State.NEW:
            try:
                self._future = self.dispatcher.submit(self.job)
            except RequestError as exc:
                self._settle(Outcome.REJECTED, exc.message, exc.status)
                raise
            self.state = State.QUEUED
        return self

    async def __aenter__(self) -> Lease:
        return self.enter()

    @property
    def queued(self) -> bool:
        """The job is waiting for a slot (a streaming handler may send headers now).

        The queue may have resolved the job (a slot, or its time ran out) before ``open`` takes it;
        a future cancelled with its handler leaves the job waiting.
        """
        future = self._future
        return self.state is State.QUEUED and (future is None or not future.done() or future.cancelled())

    def position(self) -> tuple[int, int] | None:
        """The job's place in the queue and the queue's length, while it waits."""
        return self.dispatcher.scheduler.queue_position(self.job.id) if self.state is State.QUEUED else None

    async def open(self, heartbeat: Callable[[], Awaitable[None]] | None = None, every: float = 2.0) -> Upstream:
        """Wait for a slot and open the answer there, failing over before the first byte.

        Args:
            heartbeat: awaited at once and then every ``every`` seconds while queued.

        Raises:
            RequestError: 504 the queue timed out; 503 every backend tried failed;
                400 the call cannot be sent to the backend it got.
        """
        dispatcher, job = self.dispatcher, self.job
        while True:
            dispatch = await self._dispatched(heartbeat, every)
            self.state = State.DISPATCHED
            bid = self.backend_id = dispatch.backend_id
            self._holding = True
            self._held_since = dispatcher.clock()
            self._record = dispatch.record
            failed_on = self._failed_on
            if failed_on is not None and bid in failed_on:  # the core had no other live backend: never twice
                self._end_attempt(Outcome.BACKEND_FAILED, failed_on[bid])
                dispatcher.fail(job.id, retry=False)
                self._released()
                raise self._backend_failed(failed_on[bid])
            backends = dispatcher.backends
            adapter = backends.adapter(bid)
            try:
                self._reserve()
                if adapter is None:
                    raise BackendError("the backend was removed")
                upstream = await adapter.open(self.call, job.model)
            except RequestError as exc:  # the client's body or its quota, not the backend's fault
                self._end_attempt(Outcome.REJECTED, exc.message)
                dispatcher.abandon(job.id, prompt_tokens=0)
                self._released()
                self._settle(Outcome.REJECTED, exc.message, exc.status)
                raise
            except BackendError as exc:
                if failed_on is None:
                    failed_on = self._failed_on = {}
                failed_on[bid] = exc.message
                if exc.fault is Fault.UNSUPPORTED:  # routing learns it
                    backends.lacks(bid, job.model, job.modality, exc.message)
                elif adapter is not None:
                    backends.request_failed(bid, exc.message, fault=exc.fault, user=job.user_id)
                # Only another live backend may serve it: waiting for none would hold the client to its timeout.
                retry = len(failed_on) <= dispatcher.max_retries and backends.serves(
                    job.model, job.modality, besides=failed_on
                )
                self._end_attempt(Outcome.BACKEND_FAILED, exc.message)
                again = dispatcher.fail(job.id, retry=retry)
                self._released()
                if not again and exc.fault is Fault.UNSUPPORTED:
                    raise self._unsupported() from None
                if not again:
                    raise self._backend_failed(exc.message) from None
                self._future = dispatcher.requeued(job)
                self.state = State.QUEUED
                continue
            if not upstream.stream:  # a stream is served once it ends whole (finish): it may yet hang
                backends.request_succeeded(bid)
            self.state = State.STREAMING
            self.upstream = upstream
            return upstream

    async def _dispatched(self, heartbeat: Callable[[], Awaitable[None]] | None, every: float) -> Dispatch:
        """The dispatch, once the queue has one; a cancelled handler's job stays ``queued`` (``state``).

        Without a heartbeat the future is awaited itself (the cheapest wait, for thousands waiting); a
        cancelled future is one the dispatcher skips, and the state, not the future, says the job still
        waits, so a daemon shutting down can withdraw it and end its stream in its dialect.
        """
        future = self._future
        assert future is not None, "use the lease in `async with` first"
        try:
            if heartbeat is None:
                return await future
            while not future.done():
                await heartbeat()
                await _done_or_after(future, every)
            return future.result()
        except RequestError as exc:  # the dispatcher expired it (504)
            self._settle(Outcome.TIMEOUT, exc.message, exc.status)
            raise

    def finish(self) -> None:
        """The whole answer reached the client: charge the backend's counts and free the slot."""
        upstream = self.upstream
        assert upstream is not None and self.backend_id is not None, "open() first"
        dispatcher, bid, usage = self.dispatcher, self.backend_id, upstream.usage
        now = time.monotonic()
        if upstream.error is not None and upstream.status < 400:  # broke after the first byte
            prompt, completion = self._used()
            dispatcher.backends.request_failed(
                bid, upstream.error, fault=upstream.fault or Fault.DOWN, user=self.job.user_id
            )
            dispatcher.fail(self.job.id, retry=False, prompt_tokens=prompt, completion_tokens=completion)
            self._end_attempt(Outcome.BACKEND_FAILED, upstream.error)
            self._released()
            self._settle(Outcome.BACKEND_FAILED, upstream.error, upstream.status, prompt, completion)
            return
        if upstream.stream:
            dispatcher.backends.request_succeeded(bid)
        first = upstream.first_byte_at if upstream.first_byte_at is not None else now
        dispatcher.finish(
            self.job.id,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            latency=first - upstream.opened_at,
            duration=now - upstream.opened_at,
            timings=Timings(usage.load_seconds, usage.prefill_seconds, usage.decode_seconds),
        )
        self._released()
        outcome = Outcome.OK if upstream.status < 400 else Outcome.REJECTED
        self._end_attempt(outcome, upstream.error)
        prompt, completion = self._used()
        self._settle(outcome, upstream.error, upstream.status, prompt, completion)

    def refuse(self, refusal: RequestError) -> None:
        """Admission refused the job before it queued (a quota): settle it as rejected, so that ``mr why``
        explains the refusal's request id as it explains the core's."""
        self._settle(Outcome.REJECTED, refusal.message, refusal.status)

    def withdraw(self, refusal: RequestError) -> None:
        """The daemon ends a request that is still queued (it is shutting down); the client gets ``refusal``."""
        if self.state is State.SETTLED:
            return
        assert self.upstream is None, "an opened lease ends in `async with`"
        self.dispatcher.abandon(self.job.id, prompt_tokens=0)
        self._settle(Outcome.REJECTED, refusal.message, refusal.status)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        upstream = self.upstream
        if upstream is not None:
            await upstream.close()  # an unfinished backend stops generating
        if self.state is State.SETTLED:
            return
        gone = exc is None or isinstance(exc, (asyncio.CancelledError, ConnectionError))
        outcome = Outcome.CLIENT_GONE if gone else Outcome.ERROR
        reason = "the client went away" if gone else f"{type(exc).__name__}: {exc}"
        prompt, completion = self._used() if upstream is not None else self._abandoned()
        self.dispatcher.abandon(self.job.id, prompt_tokens=prompt, completion_tokens=completion)
        if self._record is not None:
            self._end_attempt(outcome, reason)
        self._released()
        self._settle(outcome, reason, 499 if gone else 500, prompt, completion)

    @property
    def held(self) -> float:
        """Seconds the slot has been held so far (0 before the dispatch)."""
        return 0.0 if self._held_since is None else self.dispatcher.clock() - self._held_since

    # -- bookkeeping -------------------------------------------------------

    def _used(self) -> tuple[int, int]:
        """Tokens to charge: the backend's counts, else the prompt estimate and one token per chunk."""
        upstream = self.upstream
        if upstream is None:
            return 0, 0
        usage = upstream.usage
        prompt = usage.prompt_tokens if usage.prompt_tokens is not None else self.job.prompt_tokens
        completion = usage.completion_tokens if usage.completion_tokens is not None else upstream.chunks
        return prompt, completion

    def _reserve(self) -> None:
        """Reserve the job's tokens against its quotas now that it runs; a whole answer may be capped there.

        Raises:
            RequestError: 429, its quota was used while it waited.
        """
        quotas = self.dispatcher.quotas
        cap = None if quotas is None else quotas.start(self.job.id)
        if cap is not None:
            self.call = self.call.capped(cap)

    def _abandoned(self) -> tuple[int, int]:
        """Tokens to charge for an answer left while a backend was opening it (a whole answer the client
        did not wait for, a stream before its first chunk): the backend had the prompt, so its estimate;
        and a whole answer is taken to have produced what one answer of that model on that backend was
        seen to produce a second (``ModelSpeed.observed``) for each second it was held, up to its
        ``max_tokens``: the clock the scheduler charges a running whole answer by (scheduler/ledger.py)."""
        if self.state is not State.DISPATCHED:
            return 0, 0
        job = self.job
        if job.stream:
            return job.prompt_tokens, 0
        load = self.dispatcher.scheduler.load(self.backend_id) if self.backend_id is not None else None
        speed = load.speeds.get(job.model) if load is not None else None
        rate = speed.observed if speed is not None and speed.observed is not None else 0.0
        produced = int(rate * self.held)
        return job.prompt_tokens, produced if job.max_tokens is None else min(produced, job.max_tokens)

    def _released(self) -> None:
        if self._holding:
            self._holding = False
            self.dispatcher.backends.released(self.backend_id)

    def _end_attempt(self, outcome: Outcome, reason: str | None) -> None:
        if self._record is not None:
            self._attempts += (Attempt(self._record, outcome, reason),)
            self._record = None

    def _backend_failed(self, error: str) -> RequestError:
        tried = len(self._failed_on or ())
        message = (
            f"the backend failed ({error}) and no other backend could take the request; try again shortly"
            if tried == 1
            else f"{tried} backends failed (last: {error}); try again shortly"
        )
        self._settle(Outcome.BACKEND_FAILED, message, 503)
        return RequestError(message, status=503, type="service_unavailable", code="backend_failed", retry_after=5)

    def _unsupported(self) -> RequestError:
        """No backend left offers what the request needs: say what the backend lacks, not "try again"."""
        job = self.job
        refusal = unsupported(job.model, job.modality, self.dispatcher.backends.lacking(job.model, job.modality))
        self._settle(Outcome.REJECTED, refusal.message, 400)
        return refusal

    def _settle(
        self, outcome: Outcome, reason: str | None, status: int, prompt_tokens: int = 0, completion_tokens: int = 0
    ) -> None:
        if self.state is State.SETTLED:
            return
        self.state = State.SETTLED
        now = self.dispatcher.clock()
        self.dispatcher.on_settled(
            Settlement(
                job=self.job,
                user=self.user,
                group=self.group,
                outcome=outcome,
                reason=reason,
                status=status,
                backend_id=self.backend_id,
                answered=self.upstream is not None,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                held=self.held,
                attempts=self._attempts,
                waited=now - self.job.submitted_at,
                wall=time.time(),
            )
        )


def _wake(waiter: asyncio.Future[None], *_: object) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _done_or_after(future: asyncio.Future[Any], seconds: float) -> None:
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
