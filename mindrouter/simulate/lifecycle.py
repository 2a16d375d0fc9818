"""A request's life on its backend, for the engine: dispatch, prefill, streamed progress, completion.

A mixin of ``engine._Sim`` (as ``JobOutcomes`` is of the core's ``Scheduler``):
the half of the loop that follows a request once the core has dispatched it,
and what the engine tells the core about each backend. The workstation
(``workstation.py``) decides when things happen there; this module accounts
for them: the pools' service lines, per-model latencies, the core's progress
and completion calls, and the stretches of saturation.
"""

from __future__ import annotations

from collections.abc import Callable

from ..scheduler import Scheduler, Timings
from .conversations import single
from .pools import Pool
from .runs import BackendRun, ModelRun, PhaseRun, RequestTrace, UserRun
from .scenario import Scenario
from .turns import Turns
from .workstation import DECODE, Options, Runner, Stream, Workstation

__all__ = ["Lifecycle"]

# Event kinds of the engine's heap that this module pushes (the order among equal times, with the others in
# ``engine.py``).
_PREFILL = 2
_DONE = 3
_PROGRESS = 6
_POLL = 9
#: Streamed tokens between two progress reports, as the daemon batches them.
PROGRESS_TOKENS = 32


class Lifecycle:
    sc: Scenario
    sched: Scheduler
    users: list[UserRun]
    phases: list[PhaseRun]
    pools: list[Pool]
    backends: dict[str, BackendRun]
    stations: dict[str, Workstation[RequestTrace]]
    models: dict[str, ModelRun]
    reqs: dict[str, RequestTrace]
    free_epoch: dict[str, int]
    freed_models: set[str]
    queued_total: int
    saturated: list[tuple[float, float]]
    saturated_since: float | None
    saturated_tokens: float
    tokens_at_saturation: float
    turns: Turns
    push: Callable[[float, int, object], None]
    touch: Callable[[UserRun], None]
    next_request: Callable[[PhaseRun, float, RequestTrace], None]

    def publish(self, station: Workstation[RequestTrace]) -> None:
        """Tell the core what the daemon's poll of ``station`` would report."""
        self.sched.set_backend(station.snapshot())
        station.dirty = False

    def decode_rate_changed(self, stream: Stream[RequestTrace], old: float, now: float) -> None:
        self.phases[stream.tag.phase].pool.decode_rate_changed(stream.tag.user, old, stream.rate, now)

    def start(self, job_id: str, backend_id: str, now: float) -> None:
        req = self.reqs[job_id]
        user = self.users[req.user]
        phase = self.phases[req.phase]
        backend = self.backends[backend_id]
        spec = backend.spec
        req.dispatched = now
        req.backend = backend_id
        wait = now - req.submitted
        user.waits.append(wait)
        if req.owed:
            user.owed_waits.append(wait)
        if wait > 0:
            user.waited += 1
        skipped = self.free_epoch[phase.spec.model] - req.epoch
        req.skipped = skipped
        if skipped > user.max_skipped:
            user.max_skipped = skipped
        user.queued -= 1
        self.turns.queued(user.index, req.model, -1)
        self.turns.started(phase.pool, user.index, backend_id, req.model, now)
        user.running += 1
        user.request_started(now)
        self.touch(user)
        backend.busy += 1
        backend.requests += 1
        self.queued_total -= 1
        if backend.full_at is None and backend.busy >= spec.max_concurrent:
            backend.full_at = now
        conv = req.conversation
        prompt, answer = single(req.id, req.prompt) if conv is None else (conv.prompt(req.turn), conv.answer(req.turn))
        options = Options(phase.spec.keep_alive, phase.spec.num_ctx)
        station = self.stations[backend_id]
        stream = station.accept(req, phase.spec.model, prompt, req.completion, now, answer, options)
        req.expected = station.expected_seconds(stream, now)
        phase.pool.started(user.index, self.sched.cost(req.model, req.prompt, req.completion), req.expected)

    def saturation_changed(self, now: float) -> None:
        """Open or close a stretch during which some request waited in the core's queue."""
        decoded = sum(pool.decoded(now) for pool in self.pools)
        if self.saturated_since is None:
            self.saturated_since = now
            self.tokens_at_saturation = decoded
        else:
            self.saturated.append((self.saturated_since, now))
            self.saturated_tokens += decoded - self.tokens_at_saturation
            self.saturated_since = None

    def on_prefill(self, event: tuple[Stream[RequestTrace], int], now: float) -> None:
        stream, version = event
        if not stream.due(version, "prefill"):
            return  # re-timed since
        req = stream.tag
        rate = self.stations[req.backend].prefilled(stream, now)  # type: ignore[index]
        req.prefill_end = now
        req.cached = stream.cached
        self.models[req.model].ttft.append(now - req.submitted)
        if req.turn:
            self.models[req.model].later_ttft.append(now - req.submitted)
        self.phases[req.phase].pool.prefill_done(req.user, req.prompt, rate, now, req.model)
        if req.stream and req.completion > PROGRESS_TOKENS:
            self.push(now + PROGRESS_TOKENS / rate, _PROGRESS, stream)

    def on_progress(self, stream: Stream[RequestTrace], now: float) -> None:
        """Report what ``stream`` has streamed so far to the core, every ``PROGRESS_TOKENS`` tokens."""
        if stream.phase != DECODE:
            return
        req = stream.tag
        self.sched.progress(req.id, now, completion_tokens=min(req.completion, round(stream.tokens(now))))
        if now + PROGRESS_TOKENS / stream.rate < stream.done:
            self.push(now + PROGRESS_TOKENS / stream.rate, _PROGRESS, stream)

    def on_done(self, event: tuple[Stream[RequestTrace], int], now: float) -> None:
        stream, version = event
        if not stream.due(version, "done"):
            return  # re-timed since
        req = stream.tag
        user = self.users[req.user]
        backend = self.backends[req.backend]  # type: ignore[index]
        station = self.stations[req.backend]  # type: ignore[index]
        pool = self.phases[req.phase].pool
        pool.decode_done(req.user, stream.rate, now)
        assert req.dispatched is not None and req.prefill_end is not None
        pool.finished(req.user, req.model, req.expected, self.phases[req.phase].size)
        user.longest_request = max(user.longest_request, now - req.dispatched)
        user.durations.append(now - req.dispatched)
        user.largest_request = max(user.largest_request, self.sched.cost(req.model, req.prompt, req.completion))
        req.done = now
        del self.reqs[req.id]
        user.running -= 1
        user.completed += 1
        user.completed_tokens += req.prompt + req.completion
        stats = self.models[req.model]
        stats.completed += 1
        stats.e2e.append(now - req.submitted)
        stats.completion_tokens += req.completion
        stats.prompt_tokens += req.prompt
        stats.computed_tokens += req.prompt - req.cached
        backend.busy -= 1
        self.turns.ended(pool, req.backend, req.model)  # type: ignore[arg-type]
        backend.tokens += req.prompt + req.completion
        held = min(now, self.sc.duration) - req.dispatched
        backend.slot_seconds += held
        user.gpu_seconds += held
        self.freed_models.update(backend.spec.models)
        station.finish(stream, now)
        if (
            backend.spec.engine == "ollama"
        ):  # as Ollama's last chunk: load_duration, prompt_eval_duration, eval_duration
            latency, duration = req.prefill_end - req.dispatched, now - req.dispatched
            timings = Timings(stream.load, req.prefill_end - stream.began, now - req.prefill_end)
        else:  # as the daemon's clock: to the first byte (a stream's first token, else the whole answer), to the end
            latency = (req.prefill_end if req.stream else now) - req.dispatched
            duration, timings = now - req.dispatched, None
        self.sched.complete(
            req.id,
            now,
            prompt_tokens=req.prompt,
            completion_tokens=req.completion,
            latency=latency,
            duration=duration,
            timings=timings,
            # vLLM's and llama-server's usage say what their cache held; Ollama's does not
            cached_tokens=req.cached if backend.spec.engine in ("vllm", "llamacpp") else None,
        )
        self.next_request(self.phases[req.phase], now, req)

    def on_loaded(self, event: tuple[Workstation[RequestTrace], Runner[RequestTrace]], now: float) -> None:
        station, runner = event
        station.loaded(runner, now)

    def on_unload(self, event: tuple[Workstation[RequestTrace], Runner[RequestTrace], int], now: float) -> None:
        station, runner, version = event
        station.expire(runner, version, now)

    def on_poll(self, station: Workstation[RequestTrace], now: float) -> None:
        if station.dirty:
            self.publish(station)
        self.push(now + station.spec.poll_interval, _POLL, station)
