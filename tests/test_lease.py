"""Every way a request's slot can end, on the lease alone: a fake adapter, no sockets.

Like httpx's MockTransport: ``FakeAdapter`` answers ``open(call, model)`` from a
script, and the lease runs against the real scheduler core and dispatcher. Each
test ends by checking the books: nothing queued or running, every slot freed,
exactly one settlement with the outcome and tokens the path implies.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Hashable
from typing import Any

import pytest

from mindrouter.backends._shapes import StreamFailed, Usage
from mindrouter.backends.base import BackendError, Call, Upstream
from mindrouter.daemon.request.dispatcher import Dispatcher
from mindrouter.daemon.request.lease import Lease
from mindrouter.daemon.request.moves import MOVES, LeaseError, Move, State, moved
from mindrouter.daemon.request.settlement import Outcome, Settlement
from mindrouter.errors import RequestError
from mindrouter.scheduler import Backend, Job, Scheduler, SchedulerSettings

from .harness import until

CHAT = "/v1/chat/completions"


async def turns(n: int = 20) -> None:
    """Let the loop run ``n`` rounds of what is ready: ordering by the loop's turns, never by the clock."""
    for _ in range(n):
        await asyncio.sleep(0)


def call(stream: bool = False, model: str = "m") -> Call:
    body = {"model": model, "messages": [{"role": "user", "content": "hello there"}], "stream": stream}
    return Call.from_request(CHAT, json.dumps(body).encode())


class FakeAdapter:
    """Opens calls from a script: each entry is an Upstream factory, an exception, or "hang"."""

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.opened = 0
        self.closed_streams = 0
        self.paused = 0
        """Streams now waiting at their ``pause`` event."""

    async def open(self, call: Call, model: str) -> Upstream:
        self.opened += 1
        step = self.script.pop(0) if self.script else "ok"
        if step == "hang":
            await asyncio.Event().wait()
        if isinstance(step, BaseException):
            raise step
        if step == "ok":
            usage = Usage(prompt_tokens=5, completion_tokens=3)
            return Upstream(dialect=call.dialect, body=b'{"ok": true}', usage=usage)
        return step(self)


def stream(chunks: int, *, break_after: int | None = None, pause: asyncio.Event | None = None) -> Any:
    """An Upstream factory for an SSE stream of ``chunks`` chunks (the backend reports usage at the end)."""

    def make(adapter: FakeAdapter) -> Upstream:
        usage = Usage()

        async def events() -> AsyncIterator[bytes]:
            try:
                for i in range(1, chunks):
                    if i == break_after:
                        raise StreamFailed("the backend ended the stream early")
                    if pause is not None and i == chunks // 2:
                        adapter.paused += 1
                        await pause.wait()
                        adapter.paused -= 1
                    yield f"data: {i}\n\n".encode()
                usage.prompt_tokens, usage.completion_tokens = 7, chunks
                yield b"data: [DONE]\n\n"
            finally:
                adapter.closed_streams += 1

        return Upstream(dialect="openai", first=b"data: 0\n\n", events=events(), usage=usage)

    return make


class FakeBackends:
    """The registry's face: adapters by id, and what the lease told it."""

    def __init__(self, adapters: dict[Hashable, FakeAdapter]) -> None:
        self.adapters = adapters
        self.failures: list[tuple[Hashable, str]] = []
        self.successes: list[Hashable] = []
        self.releases: list[Hashable] = []
        self.lacked: list[tuple[Hashable, Any]] = []
        self.said = ""

    def adapter(self, backend_id: Hashable) -> FakeAdapter | None:
        return self.adapters.get(backend_id)

    def request_failed(self, backend_id: Hashable, error: str, *, fault: Any = None, user: Any = None) -> None:
        self.failures.append((backend_id, error))

    def lacks(self, backend_id: Hashable, model: str, modality: Any, said: str) -> None:
        self.lacked.append((backend_id, modality))
        self.said = said

    def lacking(self, model: str, modality: Any) -> str:
        return f"backend said: {self.said}"

    def serves(self, model: str, modality: Any, *, besides: Any = ()) -> bool:
        return any(bid not in besides and (bid, modality) not in self.lacked for bid in self.adapters)

    def request_succeeded(self, backend_id: Hashable) -> None:
        self.successes.append(backend_id)

    def released(self, backend_id: Hashable) -> None:
        self.releases.append(backend_id)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class World:
    """A core with backends, a dispatcher, and the settlements it produced."""

    def __init__(self, *adapters: FakeAdapter, queue_timeout: float = 60.0) -> None:
        self.core = Scheduler(SchedulerSettings(queue_timeout=queue_timeout))
        self.core.set_user("u", 1.0, name="alice", group="student")
        for i, _ in enumerate(adapters, start=1):  # one slot each; the first backend is preferred
            self.core.set_backend(Backend(id=i, name=f"b{i}", models=frozenset({"m"}), max_concurrent=1, priority=-i))
        self.backends = FakeBackends({i: a for i, a in enumerate(adapters, start=1)})
        self.settled: list[Settlement] = []
        self.clock = Clock()
        self.dispatcher = Dispatcher(self.core, self.backends, on_settled=self.settled.append, clock=self.clock)
        self.ids = 0

    def lease(self, c: Call | None = None) -> Any:
        c = c or call()
        self.ids += 1
        job = Job(id=f"r{self.ids}", user_id="u", model=c.model, submitted_at=self.clock(), prompt_tokens=3)
        return Lease(self.dispatcher, job, c, "alice")

    def assert_idle(self) -> None:
        assert self.core.queued_count == 0 and self.core.running_count == 0
        for bid in self.backends.adapters:
            assert self.core.load(bid).in_flight == 0
        assert self.dispatcher.waiting == 0
        self.core.check()

    def outcome(self, request: str) -> Settlement:
        found = [s for s in self.settled if s.job.id == request]
        assert len(found) == 1, found  # exactly one settlement per request
        return found[0]


async def serve(world: World, c: Call | None = None, *, write: Any = None) -> Settlement:
    """What the HTTP handler does, minus HTTP."""
    async with world.lease(c) as lease:
        upstream = await lease.open()
        if upstream.body is None:
            async for chunk in lease.chunks():
                if write is not None:
                    await write(chunk)
        lease.finish()
    return world.outcome(lease.job.id)


async def test_a_whole_answer_is_charged_with_the_backends_counts_and_frees_the_slot():
    world = World(FakeAdapter("ok"))
    settled = await serve(world)
    assert (settled.outcome, settled.status, settled.backend_id) == (Outcome.OK, 200, 1)
    assert (settled.prompt_tokens, settled.completion_tokens) == (5, 3)
    assert [a.outcome for a in settled.attempts] == [Outcome.OK]
    assert world.backends.successes == [1] and world.backends.releases == [1]
    world.assert_idle()


async def test_a_stream_that_ends_well_is_charged_its_final_usage():
    adapter = FakeAdapter(stream(20))
    world = World(adapter)
    written: list[bytes] = []

    async def write(chunk: bytes) -> None:
        written.append(chunk)

    settled = await serve(world, call(stream=True), write=write)
    assert len(written) == 21 and written[-1] == b"data: [DONE]\n\n"
    assert (settled.outcome, settled.prompt_tokens, settled.completion_tokens) == (Outcome.OK, 7, 20)
    world.assert_idle()


async def test_client_gone_while_queued_leaves_the_queue_and_settles_once():
    hold = asyncio.Event()
    world = World(FakeAdapter(stream(10, pause=hold)))
    first = asyncio.create_task(serve(world, call(stream=True)))
    await until(lambda: world.core.running_count == 1, "the first should run")
    second = asyncio.create_task(serve(world))
    await until(lambda: world.core.queued_count == 1, "the second should wait")
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    gone = world.outcome("r2")
    assert (gone.outcome, gone.backend_id, gone.attempts) == (Outcome.CLIENT_GONE, None, ())
    assert gone.prompt_tokens == gone.completion_tokens == 0
    hold.set()
    assert (await first).outcome is Outcome.OK
    world.assert_idle()


async def test_client_gone_while_streaming_closes_the_backend_and_charges_what_was_sent():
    hold = asyncio.Event()
    adapter = FakeAdapter(stream(10, pause=hold))
    world = World(adapter)
    task = asyncio.create_task(serve(world, call(stream=True)))
    await until(lambda: adapter.paused == 1, "the stream should pause after five chunks")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gone = world.outcome("r1")
    assert gone.outcome is Outcome.CLIENT_GONE and gone.backend_id == 1
    # The backend reported nothing yet: the prompt estimate, and one token per chunk sent (0..4).
    assert (gone.prompt_tokens, gone.completion_tokens) == (3, 5)
    assert [a.outcome for a in gone.attempts] == [Outcome.CLIENT_GONE]
    assert adapter.closed_streams == 1  # the upstream was closed: the backend stops generating
    assert world.backends.releases == [1]
    world.assert_idle()


async def test_a_write_that_fails_because_the_client_left_counts_as_client_gone():
    world = World(FakeAdapter(stream(10)))

    async def write(chunk: bytes) -> None:
        raise ConnectionResetError("Cannot write to closing transport")

    with pytest.raises(ConnectionResetError):
        await serve(world, call(stream=True), write=write)
    gone = world.outcome("r1")
    assert gone.outcome is Outcome.CLIENT_GONE and gone.completion_tokens == 1
    world.assert_idle()


async def test_backend_error_before_the_first_byte_fails_over_and_counts_once():
    bad, good = FakeAdapter(BackendError("the backend answered HTTP 500: boom", status=500)), FakeAdapter("ok")
    world = World(bad, good)
    settled = await serve(world)
    assert settled.outcome is Outcome.OK and settled.backend_id == 2
    assert [(a.record.selected_backend_id, a.outcome) for a in settled.attempts] == [
        (1, Outcome.BACKEND_FAILED),
        (2, Outcome.OK),
    ]
    assert [bid for bid, _ in world.backends.failures] == [1]
    assert world.backends.releases == [1, 2]
    world.assert_idle()


async def test_a_failed_backend_is_never_tried_again_for_the_same_request():
    """With one backend, a failure before the first byte ends in 503 after one try, not three."""
    adapter = FakeAdapter(BackendError("the backend did not answer in time"))
    world = World(adapter)
    with pytest.raises(RequestError) as caught:
        await serve(world)
    assert caught.value.status == 503 and caught.value.code == "backend_failed"
    assert adapter.opened == 1
    assert len(world.backends.failures) == 1  # one request, one count toward the breaker
    settled = world.outcome("r1")
    assert settled.outcome is Outcome.BACKEND_FAILED and "did not answer in time" in settled.reason
    assert [a.outcome for a in settled.attempts] == [Outcome.BACKEND_FAILED]  # no other backend: no wait, no retry
    world.assert_idle()


async def test_retries_stop_after_max_retries_other_backends():
    adapters = [FakeAdapter(BackendError(f"down {i}")) for i in range(4)]
    world = World(*adapters)
    with pytest.raises(RequestError) as caught:
        await serve(world)
    assert "3 backends failed" in caught.value.message  # the first try and max_retries=2 others
    assert sum(a.opened for a in adapters) == 3
    world.assert_idle()


async def test_backend_error_after_the_first_byte_ends_the_stream_in_dialect_and_counts_against_it():
    world = World(FakeAdapter(stream(10, break_after=4)))
    written: list[bytes] = []

    async def write(chunk: bytes) -> None:
        written.append(chunk)

    settled = await serve(world, call(stream=True), write=write)
    assert written[-1].startswith(b'data: {"error"') and written[-1].endswith(b"data: [DONE]\n\n")
    assert settled.outcome is Outcome.BACKEND_FAILED and settled.status == 200
    assert settled.completion_tokens == 4  # four chunks reached the client
    assert [bid for bid, _ in world.backends.failures] == [1]
    world.assert_idle()


async def test_waiting_past_the_queue_timeout_is_504_with_a_timeout_record():
    hold = asyncio.Event()
    world = World(FakeAdapter(stream(10, pause=hold)), queue_timeout=30)
    first = asyncio.create_task(serve(world, call(stream=True)))
    await until(lambda: world.core.running_count == 1, "the first should run")
    second = asyncio.create_task(serve(world))
    await until(lambda: world.core.queued_count == 1, "the second should wait")
    world.clock.now += 31
    assert world.dispatcher.expire() == 1
    with pytest.raises(RequestError) as caught:
        await second
    assert caught.value.status == 504
    timed_out = world.outcome("r2")
    assert timed_out.outcome is Outcome.TIMEOUT and timed_out.waited == 31
    hold.set()
    await first
    world.assert_idle()


@pytest.mark.parametrize(("queue_timeout", "woken"), [(60.0, False), (0.5, True)])
async def test_the_timer_wakes_for_a_queued_job_only_when_its_timeout_comes_before_its_own_wake_up(
    queue_timeout: float, woken: bool
) -> None:
    """At 2,000 requests/s a wake-up per request cost a timer round each; the timer wakes once a second anyway."""
    hold = asyncio.Event()
    world = World(FakeAdapter(stream(10, pause=hold)), queue_timeout=queue_timeout)
    rounds = 0
    expire = world.dispatcher.expire

    def counted() -> int:
        nonlocal rounds
        rounds += 1
        return expire()

    world.dispatcher.expire = counted  # type: ignore[method-assign]
    timer = asyncio.create_task(world.dispatcher.run_timer())
    first = asyncio.create_task(serve(world, call(stream=True)))  # holds the one slot
    await until(lambda: world.core.running_count == 1, "the first should hold the slot")
    await turns()
    rounds = 0
    waiting = [world.lease().enter() for _ in range(20)]
    await turns()  # a timer woken for them has run its round; its once-a-second round is far off
    assert (rounds > 0) is woken, rounds
    timer.cancel()
    for lease in waiting:
        await lease.__aexit__(None, None, None)
    hold.set()
    await first
    world.assert_idle()


async def test_a_body_the_backend_cannot_be_sent_is_the_clients_400_and_spares_the_backend():
    world = World(FakeAdapter(RequestError('tool_calls[0] needs a "function"', status=400)))
    with pytest.raises(RequestError) as caught:
        await serve(world)
    assert caught.value.status == 400
    settled = world.outcome("r1")
    assert settled.outcome is Outcome.REJECTED and world.backends.failures == []
    assert world.core.load(1).failed == 0
    world.assert_idle()


async def test_a_job_the_core_refuses_is_settled_as_rejected():
    world = World(FakeAdapter())
    with pytest.raises(RequestError) as caught:
        await serve(world, call(model="nope"))
    assert caught.value.status == 404
    settled = world.outcome("r1")
    assert (settled.outcome, settled.status) == (Outcome.REJECTED, 404)
    world.assert_idle()


async def test_shutdown_while_the_backend_hangs_frees_the_slot():
    adapter = FakeAdapter("hang")
    world = World(adapter)
    task = asyncio.create_task(serve(world))
    await until(lambda: adapter.opened == 1, "the request should reach the backend")
    assert world.core.running_count == 1
    task.cancel()  # what aiohttp does to handlers when the grace period ends
    with pytest.raises(asyncio.CancelledError):
        await task
    settled = world.outcome("r1")
    assert settled.outcome is Outcome.CLIENT_GONE and not settled.answered
    assert world.backends.releases == [1]
    world.assert_idle()


async def test_a_backend_removed_while_the_job_waited_fails_over_without_counting_against_it():
    world = World(FakeAdapter(), FakeAdapter("ok"))
    del world.backends.adapters[1]
    settled = await serve(world)
    assert settled.outcome is Outcome.OK
    assert [a.record.selected_backend_id for a in settled.attempts] == [1, 2]
    assert world.backends.failures == []
    world.assert_idle()


async def test_a_waiting_stream_is_told_again_until_its_slot_frees_and_then_goes_at_once():
    """The heartbeat comes at once and then again every ``every`` seconds; a freed slot wakes the lease
    before the next one is due (here an hour away), and leaves nothing behind."""
    hold = asyncio.Event()
    world = World(FakeAdapter(stream(3, pause=hold), stream(3)))
    first = asyncio.create_task(serve(world, call(stream=True)))
    await until(lambda: world.core.running_count == 1, "the first request never ran")
    beats: list[str] = []
    thrice = asyncio.Event()

    async def heartbeat() -> None:
        beats.append("tick")
        if len(beats) == 3:
            thrice.set()

    async def waiting(every: float) -> Settlement:
        async with world.lease(call(stream=True)) as lease:
            await lease.open(heartbeat=heartbeat, every=every)
            async for _ in lease.chunks():
                pass
            lease.finish()
        return world.outcome(lease.job.id)

    second = asyncio.create_task(waiting(0.001))
    await asyncio.wait_for(thrice.wait(), 30)  # told again while it waits
    hold.set()
    assert (await first).outcome is Outcome.OK
    assert (await asyncio.wait_for(second, 30)).outcome is Outcome.OK
    world.assert_idle()

    hold.clear()
    world = World(FakeAdapter(stream(3, pause=hold), stream(3)))
    first = asyncio.create_task(serve(world, call(stream=True)))
    await until(lambda: world.core.running_count == 1, "the first request never ran")
    beats.clear()
    second = asyncio.create_task(waiting(3600.0))
    await until(lambda: beats == ["tick"], "no heartbeat at once")  # then none for an hour
    hold.set()
    await first
    assert (await asyncio.wait_for(second, 30)).outcome is Outcome.OK  # the dispatch woke it
    assert beats == ["tick"]
    world.assert_idle()


# -- the one exit: the transition table and every ending's books (issue 29) ------------------------------


@pytest.mark.parametrize("state", list(State))
def test_every_move_the_table_lacks_is_refused(state: State) -> None:
    for move in Move:
        if move in MOVES[state]:
            assert moved(state, move, "r1") is MOVES[state][move]
        else:
            with pytest.raises(LeaseError, match=f"a {state.value} lease cannot {move.value}"):
                moved(state, move, "r1")


async def test_a_second_ending_is_refused_and_leaves_one_settlement_and_one_release():
    world = World(FakeAdapter("ok"))
    async with world.lease() as lease:
        with pytest.raises(LeaseError, match="a queued lease cannot finish"):
            lease.finish()  # no answer yet
        assert lease.state is State.QUEUED
        await lease.open()
        lease.finish()
        with pytest.raises(LeaseError, match="a settled lease cannot finish"):
            lease.finish()
        assert lease.state is State.SETTLED
    with pytest.raises(LeaseError, match="a settled lease cannot abandon"):
        lease.refuse(RequestError("late"))
    assert world.outcome("r1").outcome is Outcome.OK  # exactly one settlement
    assert world.backends.releases == [1]
    world.assert_idle()


async def test_a_failover_is_one_attempt_and_one_release_per_backend_and_one_settlement():
    world = World(FakeAdapter(BackendError("down")), FakeAdapter(BackendError("down too")), FakeAdapter("ok"))
    settled = await serve(world)
    assert [(a.record.selected_backend_id, a.outcome, a.reason) for a in settled.attempts] == [
        (1, Outcome.BACKEND_FAILED, "down"),
        (2, Outcome.BACKEND_FAILED, "down too"),
        (3, Outcome.OK, None),
    ]
    assert world.backends.releases == [1, 2, 3]
    assert (settled.outcome, settled.prompt_tokens, settled.completion_tokens) == (Outcome.OK, 5, 3)
    world.assert_idle()


async def test_the_shutdown_is_told_from_a_client_gone_by_the_leases_state_not_a_message():
    """A queued and a running lease stopped by the shutdown end as ``shutdown``; the same cancel
    without ``stop`` is a client gone. The running one is charged what it streamed; each slot freed once."""
    hold = asyncio.Event()
    adapter = FakeAdapter(stream(10, pause=hold), stream(10, pause=hold))
    world = World(adapter)
    leases: dict[str, Lease] = {}

    async def handler(c: Call) -> None:
        async with world.lease(c) as lease:
            leases[lease.job.id] = lease
            await lease.open()
            async for _ in lease.chunks():
                pass
            lease.finish()

    running = asyncio.create_task(handler(call(stream=True)))
    await until(lambda: adapter.paused == 1, "the first stream should pause after five chunks")
    waiting = asyncio.create_task(handler(call(stream=True)))
    await until(lambda: world.core.queued_count == 1, "the second should wait")
    gone = asyncio.create_task(handler(call(stream=True)))
    await until(lambda: world.core.queued_count == 2, "the third should wait")
    assert leases["r2"].stop() and leases["r2"].state is State.STOPPING
    assert not leases["r2"].stop()  # the shutdown's second pass, before the handler has run, stops nothing twice
    assert world.core.queued_count == 1  # a stopped job leaves the queue at once
    assert leases["r1"].stop()
    for task in (running, waiting, gone):
        task.cancel()  # the same cancel for all three: only the lease's state tells them apart
    for task in (running, waiting, gone):
        with pytest.raises(asyncio.CancelledError):
            await task
    cut, withdrawn, left = world.outcome("r1"), world.outcome("r2"), world.outcome("r3")
    assert (cut.outcome, cut.status, cut.prompt_tokens, cut.completion_tokens) == (Outcome.SHUTDOWN, 503, 3, 5)
    assert [a.outcome for a in cut.attempts] == [Outcome.SHUTDOWN]
    assert (withdrawn.outcome, withdrawn.attempts, withdrawn.completion_tokens) == (Outcome.SHUTDOWN, (), 0)
    assert (left.outcome, left.status) == (Outcome.CLIENT_GONE, 499)
    assert leases["r1"].stopped and leases["r2"].stopped and not leases["r3"].stopped
    assert not leases["r1"].stop()  # a settled lease has nothing to stop
    assert world.backends.releases == [1] and adapter.closed_streams == 1
    world.assert_idle()


async def test_a_quota_cut_ends_the_lease_once_with_what_was_delivered():
    class Allow:
        def start(self, job_id: str) -> None:
            return None

        def allowance(self, job_id: str) -> float:
            return 3

        def outgrow(self, job_id: str, completion_tokens: int) -> RequestError:
            return RequestError("your quota is spent", status=429, code="quota_exceeded")

    world = World(FakeAdapter(stream(10)))
    world.dispatcher.quotas = Allow()
    written: list[bytes] = []
    with pytest.raises(RequestError, match="quota is spent"):
        async with world.lease(call(stream=True)) as lease:
            await lease.open()
            async for chunk in lease.chunks():
                written.append(chunk)
    settled = world.outcome("r1")
    assert (settled.outcome, settled.status, settled.completion_tokens) == (Outcome.REJECTED, 429, 3)
    assert len(written) == 3 and world.backends.releases == [1]
    world.assert_idle()


async def test_a_bug_in_the_handler_ends_the_lease_as_an_error_charging_what_streamed():
    world = World(FakeAdapter(stream(10)))
    with pytest.raises(RuntimeError, match="a bug"):
        async with world.lease(call(stream=True)) as lease:
            await lease.open()
            async for chunk in lease.chunks():
                if chunk.startswith(b"data: 2"):
                    raise RuntimeError("a bug")
    settled = world.outcome("r1")
    assert (settled.outcome, settled.status, settled.reason) == (Outcome.ERROR, 500, "RuntimeError: a bug")
    assert (settled.prompt_tokens, settled.completion_tokens) == (3, 3)  # three chunks had gone out
    assert [a.outcome for a in settled.attempts] == [Outcome.ERROR] and world.backends.releases == [1]
    world.assert_idle()
