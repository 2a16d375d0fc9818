"""A request's claim on a backend slot, from the queue to its usage row.

One :class:`Lease` per request owns everything between "the client asked"
and "the books are settled": waiting in the queue, opening the answer on the
dispatched backend, failing over before the first byte (never back to a
backend that already failed this request), the backend's circuit breaker and
drain bookkeeping, and how the request ended. The HTTP handler only
translates HTTP::

    async with Lease(dispatcher, job, call, "alice") as lease:   # RequestError: rejected
        upstream = await lease.open()            # RequestError: 503 backend_failed, 504 timeout, 400
        async for chunk in lease.chunks():
            await response.write(chunk)
        lease.finish()

Leaving the block without ``finish()`` (the client went away, a write
failed, the daemon shuts down) cancels the job, closes the upstream so the
backend stops generating, and charges what was used.

Every change of ``state`` is a move of the table in ``moves.py``; a move the table lacks raises.
Every ending -- finished, failed, abandoned, requeued after a failure, shut down -- goes through
one method, ``_end``: it tells the core, closes the attempt, frees the slot (once), and either
queues the job again or hands the one :class:`Settlement` to the dispatcher's ``on_settled``.
The lease reads one clock, the dispatcher's. The stream's chunks pass through the
:class:`~.relay.Relay` the lease owns.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from typing import Any

from ...backends import Fault
from ...backends.base import BackendError, Call, Upstream
from ...errors import RequestError
from ...scheduler import DecisionRecord, Dispatch, Job, Timings
from .dispatcher import Dispatcher, backend_failed, done_or_after, unsupported
from .moves import LeaseError, Move, State, moved
from .relay import Relay
from .settlement import Attempt, Outcome, Settlement, abandoned_tokens, answer_tokens

__all__ = ["Lease"]


class Lease:
    """One request's slot: use as ``async with``.

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
        "outcome",
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
        self.outcome: Outcome | None = None
        """How the lease ended, once it has settled."""
        self._holding = False
        """A slot on ``backend_id`` is ours until released."""
        self._held_since: float | None = None
        self._future: asyncio.Future[Dispatch] | None = None
        self._record: DecisionRecord | None = None
        self._attempts: tuple[Attempt, ...] = ()
        self._failed_on: dict[Hashable, str] | None = None
        """Backends that failed this request, with their error (made on the first failure)."""
        self.state = State.NEW

    def _move(self, move: Move) -> None:
        self.state = moved(self.state, move, self.job.id)

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
                self._end(Move.ABANDON, Outcome.REJECTED, exc.message, exc.status)
                raise
            self._move(Move.QUEUE)
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
            self._move(Move.DISPATCH)
            bid = self.backend_id = dispatch.backend_id
            self._holding = True
            self._held_since = dispatcher.clock()
            self._record = dispatch.record
            failed_on = self._failed_on
            if failed_on is not None and bid in failed_on:  # the core had no other live backend: never twice
                refusal = backend_failed(failed_on[bid], len(failed_on))
                self._end(Move.FAIL, Outcome.BACKEND_FAILED, refusal.message, 503, said=failed_on[bid])
                raise refusal
            backends = dispatcher.backends
            adapter = backends.adapter(bid)
            try:
                self._reserve()
                if adapter is None:
                    raise BackendError("the backend was removed")
                upstream = await adapter.open(self.call, job.model)
            except RequestError as exc:  # the client's body or its quota, not the backend's fault
                self._end(Move.ABANDON, Outcome.REJECTED, exc.message, exc.status)
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
                unfit = exc.fault is Fault.UNSUPPORTED
                lacking = backends.lacking(job.model, job.modality) if unfit else ""
                refusal = (
                    unsupported(job.model, job.modality, lacking)
                    if unfit
                    else backend_failed(exc.message, len(failed_on))
                )
                outcome = Outcome.REJECTED if unfit else Outcome.BACKEND_FAILED
                if self._end(Move.FAIL, outcome, refusal.message, refusal.status, said=exc.message, retry=retry):
                    continue
                raise refusal from None
            if not upstream.stream:  # a stream is served once it ends whole (finish): it may yet hang
                backends.request_succeeded(bid)
            self._move(Move.ANSWER)
            self.upstream = upstream
            return upstream

    async def _dispatched(self, heartbeat: Callable[[], Awaitable[None]] | None, every: float) -> Dispatch:
        """The dispatch, once the queue has one; a cancelled handler's job stays ``queued`` (``state``).

        Without a heartbeat the future is awaited itself (the cheapest wait, for thousands waiting); a
        cancelled future is one the dispatcher skips, and the state, not the future, says the job still
        waits, so a daemon shutting down can stop it and end its stream in its dialect.
        """
        future = self._future
        assert future is not None, "use the lease in `async with` first"
        try:
            if heartbeat is None:
                return await future
            while not future.done():
                await heartbeat()
                await done_or_after(future, every)
            return future.result()
        except RequestError as exc:  # the dispatcher expired it (504)
            self._end(Move.ABANDON, Outcome.TIMEOUT, exc.message, exc.status)
            raise

    def chunks(self) -> AsyncIterator[bytes | bytearray]:
        """The open stream's chunks, through the lease's relay (``relay.py``): charged as they go.

        Raises:
            RequestError: a quota the stream outgrew is spent; the lease has ended, the handler writes
                the error tail.
        """
        upstream = self.upstream
        assert upstream is not None, "open() first"
        dispatcher = self.dispatcher
        relay = Relay(
            upstream, self.job.id, dispatcher.quotas, charge=self._charge, cut=self._cut, clock=dispatcher.clock
        )
        return relay.chunks()

    def _charge(self, sent: int) -> None:
        """Charge a stream's chunks so far, and keep them for the durable streaming usage."""
        dispatcher = self.dispatcher
        dispatcher.progress(self.job.id, sent)
        if dispatcher.on_streamed is not None:
            dispatcher.on_streamed(self, sent)

    async def _cut(self, refusal: RequestError, delivered: int) -> None:
        """End a stream the daemon stops (a spent quota): the backend stops, what was delivered is charged."""
        upstream = self.upstream
        assert upstream is not None
        await upstream.close()
        used = (answer_tokens(upstream, self.job)[0], delivered)
        self._end(Move.ABANDON, Outcome.REJECTED, refusal.message, refusal.status, used=used)

    def finish(self) -> None:
        """The whole answer reached the client: charge the backend's counts and free the slot.

        Raises:
            LeaseError: the lease has no open answer, or has ended already.
        """
        upstream = self.upstream
        if upstream is None:
            raise LeaseError(f"a {self.state.value} lease cannot finish (request {self.job.id}): open() first")
        used = answer_tokens(upstream, self.job)
        if upstream.error is not None and upstream.status < 400:  # broke after the first byte
            self.dispatcher.backends.request_failed(
                self.backend_id, upstream.error, fault=upstream.fault or Fault.DOWN, user=self.job.user_id
            )
            self._end(Move.FAIL, Outcome.BACKEND_FAILED, upstream.error, upstream.status, used=used)
            return
        if upstream.stream:
            self.dispatcher.backends.request_succeeded(self.backend_id)
        outcome = Outcome.OK if upstream.status < 400 else Outcome.REJECTED
        self._end(Move.FINISH, outcome, upstream.error, upstream.status, used=used)

    def refuse(self, refusal: RequestError) -> None:
        """Admission refused the job before it queued (a quota): settle it as rejected, so that ``mr why``
        explains the refusal's request id as it explains the core's."""
        self._end(Move.ABANDON, Outcome.REJECTED, refusal.message, refusal.status)

    def stop(self) -> bool:
        """The daemon is shutting down: a queued job leaves the queue now, and the lease ends as ``shutdown``
        at its exit. False for a lease already stopped or settled (the shutdown's second pass meets both)."""
        if self.state is State.SETTLED or self.state is State.STOPPING:
            return False
        queued = self.state is State.QUEUED
        self._move(Move.STOP)
        if queued:
            self.dispatcher.abandon(self.job.id, prompt_tokens=0)
        return True

    @property
    def stopped(self) -> bool:
        """The shutdown stopped this lease (its handler answers so), as opposed to a client gone."""
        return self.state is State.STOPPING or self.outcome is Outcome.SHUTDOWN

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        upstream = self.upstream
        if upstream is not None:
            await upstream.close()  # an unfinished backend stops generating
        if self.state is State.SETTLED:
            return
        if self.state is State.STOPPING:
            outcome, reason, status = Outcome.SHUTDOWN, "the router is shutting down", 503
        elif exc is None or isinstance(exc, (asyncio.CancelledError, ConnectionError)):
            outcome, reason, status = Outcome.CLIENT_GONE, "the client went away", 499
        else:
            outcome, reason, status = Outcome.ERROR, f"{type(exc).__name__}: {exc}", 500
        if upstream is not None:
            used = answer_tokens(upstream, self.job)
        elif self._holding:
            used = abandoned_tokens(self.job, self.dispatcher.scheduler, self.backend_id, self.held)
        else:
            used = (0, 0)
        self._end(Move.ABANDON, outcome, reason, status, used=used)

    @property
    def held(self) -> float:
        """Seconds the slot has been held so far (0 before the dispatch)."""
        return 0.0 if self._held_since is None else self.dispatcher.clock() - self._held_since

    # -- the one exit --------------------------------------------------------

    def _end(
        self,
        move: Move,
        outcome: Outcome,
        reason: str | None,
        status: int,
        *,
        used: tuple[int, int] = (0, 0),
        said: str | None = None,
        retry: bool = False,
    ) -> bool:
        """End the slot, however the request went: the core is told (``move``), the attempt closed, the slot
        freed once; then the job is queued again (True: a ``FAIL`` with ``retry`` the core took) or the lease
        settles with ``outcome``, ``reason`` and ``status``.

        Args:
            used: the prompt and completion tokens to charge.
            said: the backend's own words for the attempt's record, where ``reason`` is the client's.
            retry: a ``FAIL`` before the first byte that another backend may take.

        Raises:
            LeaseError: ``move`` is not one the lease's state allows (it has ended already, say).
        """
        settled = moved(self.state, move, self.job.id)  # an ending the state does not allow raises here
        dispatcher, job_id = self.dispatcher, self.job.id
        prompt, completion = used
        again = False
        if move is Move.FINISH:
            upstream = self.upstream
            assert upstream is not None
            usage, first = upstream.usage, upstream.first_byte_at
            dispatcher.finish(
                job_id,
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                latency=self.held if first is None else first - upstream.opened_at,
                duration=self.held,
                timings=Timings(usage.load_seconds, usage.prefill_seconds, usage.decode_seconds),
                cached_tokens=usage.cached_tokens,
            )
        elif move is Move.FAIL:
            retry = retry and self.state is not State.STOPPING
            again = dispatcher.fail(job_id, retry=retry, prompt_tokens=prompt, completion_tokens=completion)
        else:
            dispatcher.abandon(job_id, prompt_tokens=prompt, completion_tokens=completion)
        if self._record is not None:
            tried = Outcome.BACKEND_FAILED if move is Move.FAIL else outcome
            self._attempts += (Attempt(self._record, tried, reason if said is None else said),)
            self._record = None
        if self._holding:
            self._holding = False
            dispatcher.backends.released(self.backend_id)
        if again:
            self._move(Move.REQUEUE)
            self._future = dispatcher.requeued(self.job)
            return True
        self.state, self.outcome = settled, outcome
        dispatcher.on_settled(
            Settlement(
                job=self.job,
                user=self.user,
                group=self.group,
                outcome=outcome,
                reason=reason,
                status=status,
                backend_id=self.backend_id,
                answered=self.upstream is not None,
                prompt_tokens=prompt,
                completion_tokens=completion,
                held=self.held,
                attempts=self._attempts,
                waited=dispatcher.clock() - self.job.submitted_at,
                wall=dispatcher.wall(),
            )
        )
        return False

    # -- bookkeeping -------------------------------------------------------

    def _reserve(self) -> None:
        """Reserve the job's tokens against its quotas now that it runs; a whole answer may be capped there.

        Raises:
            RequestError: 429, its quota was used while it waited.
        """
        quotas = self.dispatcher.quotas
        cap = None if quotas is None else quotas.start(self.job.id)
        if cap is not None:
            self.call = self.call.capped(cap)
