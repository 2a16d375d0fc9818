"""The discrete-event loop that drives the real scheduler core with simulated users and backends.

Theory of operation. Events (arrivals, prefill ends, completions, queue
deadlines, weight changes, 60 s window boundaries) sit in one heap ordered by
(time, kind order, sequence), so equal times resolve the same way on every run.
All events at one instant form a *batch*; after each batch the loop calls
``Scheduler.dispatch(now)`` once and starts what it returns. A backend decodes
each request at ``tokens_per_second`` after a prefill of
``prompt_tokens / prefill_tokens_per_second``, up to ``max_concurrent`` at once
(the core never hands it more). What happens on a backend (its queue, loads,
evictions, keep_alive, per-model slots, streams slowing each other) is
``workstation.Workstation``'s; the engine tells the core what the daemon would
poll from it (at once, or every ``poll_interval``) and completes each job with
the timings Ollama's last chunk carries.

A user is an account (one weight, one name in the core) with one or more
*phases*, the scenario's ``[[users]]`` entries of that name, each sending its
own workload to its own model between its ``start`` and ``stop``; its weight
lives in ``accounts.Accounts``, and its stretches (backlogged, starved,
deprioritized) in its ``runs.UserRun``. Service is
accounted per pool of contention (``pools.Pool``): a request counts in the pool
of the backends that serve its model, prompt tokens when its prefill ends and
completion tokens continuously at the decode rate.

All randomness comes from one ``random.Random`` per phase, seeded from the
scenario seed, the user's name and the phase's place among that user's
entries, so the same file and seed give the same run, and adding a user does
not change the others' draws.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable

from ..scheduler import Scheduler
from .accounts import Accounts
from .conversations import Conversation
from .jobs import job_for
from .lifecycle import _DONE, _POLL, _PREFILL, _PROGRESS, Lifecycle
from .pools import Pool, find_pools
from .runs import BackendRun, ModelRun, PhaseRun, RequestTrace, Run, UserRun
from .scenario import EventSpec, Scenario
from .slots import SlotSets
from .turns import Turns
from .workload import draw_conversation, draw_seconds, draw_sizes, expected_sizes, phase_rngs
from .workstation import Workstation

__all__ = ["simulate"]

# Event kinds; the first number is the order among events at the same instant.
_WINDOW = 0  # window boundaries see the state before anything else at that instant
_EVENT = 1  # weight changes apply before what else happens at their instant
# _PREFILL = 2, _DONE = 3, _PROGRESS = 6 and _POLL = 9 are lifecycle.py's
_EXPIRE = 4
_ARRIVE = 5
_LOADED = 7
_UNLOAD = 8
#: The workstations' event names, as engine kinds.
_KINDS = {"prefill": _PREFILL, "done": _DONE, "loaded": _LOADED, "expire": _UNLOAD}


class _Sim(Lifecycle):
    """One run in progress: the core, its backends and pools, the phases, and the event heap."""

    def __init__(self, scenario: Scenario, *, trace: bool, window: float) -> None:
        self.sc = scenario
        settings = scenario.settings
        self.sched = Scheduler(settings)
        self.backends = {b.name: BackendRun(b) for b in scenario.backends}
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.stations: dict[str, Workstation[RequestTrace]] = {
            b.name: Workstation(b, scenario.model, self.push_named, self.decode_rate_changed) for b in scenario.backends
        }
        for station in self.stations.values():
            self.publish(station)
        self.models = {m: ModelRun(m, scenario.model(m).kind) for b in scenario.backends for m in b.models}
        self.queued_total = 0
        self.saturated: list[tuple[float, float]] = []
        self.saturated_since: float | None = None
        self.saturated_tokens = 0.0
        self.tokens_at_saturation = 0.0
        self.accounts = Accounts(scenario, self.sched)
        self.users = self.accounts.users
        n = len(self.users)
        self.pools = [
            Pool(
                i,
                backends,
                SlotSets(backends, scenario.model),
                n,
                self.accounts.entitlement,
                prompt_cost=self.sched.prompt_weight,
                completion_cost=settings.completion_token_cost,
                window=window,
            )
            for i, backends in enumerate(find_pools(scenario.backends))
        ]
        pool_of = {m: pool for pool in self.pools for m in pool.models}
        self.phases: list[PhaseRun] = []
        for spec, rng in zip(scenario.users, phase_rngs(scenario), strict=True):
            user = self.accounts.by_name[spec.name]
            pool = pool_of[spec.model]
            if pool not in user.pools:
                user.pools.append(pool)
            stop = scenario.duration if spec.stop is None else spec.stop
            size = expected_sizes(spec, scenario.apps.get(spec.app or "", 0))
            self.phases.append(PhaseRun(len(self.phases), spec, user, pool, rng, stop, size))
        for pool in self.pools:
            models: dict[int, set[str]] = {}
            for phase in self.phases:
                if phase.pool is pool:
                    models.setdefault(phase.user.index, set()).add(phase.spec.model)
            pool.compete(models)
        self.reqs: dict[str, RequestTrace] = {}
        self.trace: list[RequestTrace] | None = [] if trace else None
        self.next_id = 0
        self.batch = 0
        self.touched: list[UserRun] = []
        self.touched_batch = [-1] * n
        self.freed_models: set[str] = set()
        self.free_epoch: dict[str, int] = {m: 0 for b in scenario.backends for m in b.models}
        self.expire_at: float | None = None
        self.window = window
        self.next_heavy_check = 0.0
        self.last_heavy_ids: frozenset[object] = frozenset()
        self.events = 0
        self.turns = Turns(self.pools, self.users, self.backends, self.stations, settings.anticipation)

    # -- events -------------------------------------------------------------

    def push(self, t: float, kind: int, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, payload))

    def push_named(self, t: float, kind: str, payload: object) -> None:
        self.push(t, _KINDS[kind], payload)

    def run(self, progress: Callable[[float], None] | None) -> None:
        for phase in self.phases:
            spec = phase.spec
            if spec.concurrency is not None:
                for _ in range(spec.concurrency):
                    self.push(spec.start, _ARRIVE, phase)
            else:
                assert spec.rate is not None
                self.push(spec.start + phase.rng.expovariate(spec.rate), _ARRIVE, phase)
        for event in self.sc.events:
            self.push(event.at, _EVENT, event)
        k = 1
        while k * self.window <= self.sc.duration:
            self.push(k * self.window, _WINDOW, None)
            k += 1
        for station in self.stations.values():
            if station.spec.poll_interval:
                self.push(station.spec.poll_interval, _POLL, station)
        heap = self.heap
        duration = self.sc.duration
        pop = heapq.heappop
        while heap and heap[0][0] <= duration:
            now = heap[0][0]
            self.batch += 1
            while heap and heap[0][0] == now:
                _, kind, _, payload = pop(heap)
                self.events += 1
                if kind == _DONE:
                    self.on_done(payload, now)  # type: ignore[arg-type]
                elif kind == _PREFILL:
                    self.on_prefill(payload, now)  # type: ignore[arg-type]
                elif kind == _ARRIVE:
                    if isinstance(payload, PhaseRun):
                        self.arrive(payload, now)
                    else:
                        self.next_turn(*payload, now)  # type: ignore[call-arg, misc]
                elif kind == _EXPIRE:
                    self.on_expire(now)
                elif kind == _EVENT:
                    self.on_event(payload, now)  # type: ignore[arg-type]
                elif kind == _PROGRESS:
                    self.on_progress(payload, now)  # type: ignore[arg-type]
                elif kind == _LOADED:
                    self.on_loaded(payload, now)  # type: ignore[arg-type]
                elif kind == _UNLOAD:
                    self.on_unload(payload, now)  # type: ignore[arg-type]
                elif kind == _POLL:
                    self.on_poll(payload, now)  # type: ignore[arg-type]
                else:
                    for pool in self.pools:
                        pool.close_window(now)
            self.end_batch(now)
            if progress is not None and not self.batch & 4095:
                progress(now)
        self.finish(duration)
        if progress is not None:
            progress(duration)

    def touch(self, user: UserRun) -> None:
        if self.touched_batch[user.index] != self.batch:
            self.touched_batch[user.index] = self.batch
            self.touched.append(user)

    def arrive(self, phase: PhaseRun, now: float) -> None:
        """A phase sends a request, or starts a conversation, and draws when its next one (open loop) comes."""
        spec = phase.spec
        if now >= phase.stop or (spec.requests is not None and phase.started >= spec.requests):
            return
        rng = phase.rng
        if spec.rate is not None:
            nxt = now + rng.expovariate(spec.rate)
            if nxt < phase.stop:
                self.push(nxt, _ARRIVE, phase)
        phase.started += 1
        if spec.converses:
            key = f"{phase.index}/{phase.started}"
            self.next_turn(phase, draw_conversation(spec, rng, key, self.sc.apps.get(spec.app or "", 0)), 0, now)
        else:
            self.submit(phase, now, *draw_sizes(spec, rng))

    def next_turn(self, phase: PhaseRun, conv: Conversation, turn: int, now: float) -> None:
        """Turn ``turn`` of ``conv`` leaves (a conversation begun before its phase's ``stop`` goes on after it)."""
        self.submit(phase, now, conv.prompt_tokens(turn), conv.turns[turn].completion, conv, turn)

    def submit(
        self, phase: PhaseRun, now: float, prompt: int, completion: int, conv: Conversation | None = None, turn: int = 0
    ) -> None:
        """Submit a request to the core (turn ``turn`` of ``conv`` where it is one)."""
        spec = phase.spec
        user = phase.user
        self.next_id += 1
        job_id = str(self.next_id)
        stats = self.models[spec.model]
        job = job_for(job_id, user.index, spec, stats.kind, now, prompt, conv, turn)
        user.submitted += 1
        phase.submitted += 1
        stats.submitted += 1
        stats.arrivals.append((now, prompt, completion))
        rejection = self.sched.submit(job, now)
        if rejection is not None:
            user.rejected += 1
            stats.rejected += 1
            if spec.concurrency is not None or conv is not None:  # a person tries again
                again = now + max(1.0, rejection.retry_after or 1.0)
                self.push(again, _ARRIVE, phase if conv is None else (phase, conv, turn))
            return
        req = RequestTrace(
            job_id,
            user.index,
            prompt,
            completion,
            now,
            phase=phase.index,
            epoch=self.free_epoch[spec.model],
            model=spec.model,
            stream=spec.stream,
            conversation=conv,
            turn=turn,
        )
        if not user.queued:
            gap, backlogged = phase.pool.gap, phase.pool.backlogged
            others = [gap.counter(u, now) for u in backlogged if u != user.index]
            req.owed = bool(others) and gap.counter(user.index, now) < min(others)
        self.queued_total += 1
        self.reqs[job_id] = req
        if self.trace is not None:
            self.trace.append(req)
        user.queued += 1
        self.turns.queued(user.index, spec.model, 1)
        phase.pool.submitted(user.index, spec.model, phase.size)
        self.touch(user)

    def next_request(self, phase: PhaseRun, now: float, req: RequestTrace | None = None) -> None:
        """``req`` ended (answered, or timed out when ``req`` is None or unanswered): the client goes on."""
        conv = None if req is None else req.conversation
        if conv is not None and req is not None and req.done is not None and req.turn + 1 < len(conv.turns):
            self.push(now + conv.turns[req.turn + 1].think, _ARRIVE, (phase, conv, req.turn + 1))
            return
        spec = phase.spec
        if spec.concurrency is None:
            return
        think = draw_seconds(spec.think_time, phase.rng)
        if think:
            self.push(now + think, _ARRIVE, phase)
        else:
            self.arrive(phase, now)

    def on_expire(self, now: float) -> None:
        self.expire_at = None
        for expired in self.sched.expire(now):
            req = self.reqs.pop(expired.job.id)
            req.timed_out = True
            user = self.users[req.user]
            user.queued -= 1
            self.turns.queued(user.index, req.model, -1)
            user.timed_out += 1
            self.queued_total -= 1
            self.models[req.model].timed_out += 1
            self.phases[req.phase].pool.expired(user.index, req.model, self.phases[req.phase].size)
            self.touch(user)
            self.next_request(self.phases[req.phase], now, req)

    def on_event(self, event: EventSpec, now: float) -> None:
        """Change weights in the live core, as ``mr user/group set-weight`` would.

        Each pool closes its epoch under the old weights first, then re-weighs.
        """
        for pool in self.pools:
            pool.close_epoch(now)
        self.accounts.set_weight(event)
        for pool in self.pools:
            pool.reweigh(now)

    # -- after each batch ---------------------------------------------------

    def end_batch(self, now: float) -> None:
        for station in self.stations.values():
            if station.dirty and not station.spec.poll_interval:
                self.publish(station)
        for d in self.sched.dispatch(now):
            self.start(d.job.id, d.backend_id, now)  # type: ignore[arg-type]
        if (self.queued_total > 0) != (self.saturated_since is not None):
            self.saturation_changed(now)
        for m in self.freed_models:
            self.free_epoch[m] += 1
        self.freed_models.clear()
        for user in self.touched:
            user.update_backlog(now)
        self.touched.clear()
        for pool in self.pools:
            pool.end_batch(now)
        self.turns.check_free(now)
        deadline = self.sched.next_deadline()
        if deadline is not None and (self.expire_at is None or deadline < self.expire_at):
            self.expire_at = deadline
            self.push(max(deadline, now), _EXPIRE, None)
        heavy = self.sched.heavy
        if heavy != self.last_heavy_ids or (heavy and now >= self.next_heavy_check):
            self.next_heavy_check = now + 1.0
            self.last_heavy_ids = heavy
            self.track_heavy(now)

    def track_heavy(self, now: float) -> None:
        heavy = self.sched.heavy
        for user in self.users:
            state = self.sched.user(user.index)
            assert state is not None
            user.note_factor(state.factor if user.index in heavy else 1.0, now)

    def finish(self, end: float) -> None:
        if self.saturated_since is not None:
            self.saturation_changed(end)
        for req in self.reqs.values():
            if req.dispatched is not None:
                self.backends[req.backend].slot_seconds += end - req.dispatched  # type: ignore[index]
                self.users[req.user].gpu_seconds += end - req.dispatched
        for name, station in self.stations.items():
            backend = self.backends[name]
            backend.loads, backend.load_seconds = station.loads, station.load_seconds
            backend.evictions, backend.expirations = station.evictions, station.expirations
        for pool in self.pools:
            pool.finish(end)
        for user in self.users:
            user.finish(end)


def simulate(
    scenario: Scenario, *, trace: bool = False, window: float = 60.0, progress: Callable[[float], None] | None = None
) -> Run:
    """Run ``scenario`` once and return what happened.

    Args:
        trace: keep every request's timeline in ``Run.trace`` (tests use it for exact event checks).
        window: seconds per share window. Defaults to 60.
        progress: called with the simulated time every few thousand batches.
    """
    began = time.perf_counter()
    sim = _Sim(scenario, trace=trace, window=window)
    sim.run(progress)
    return Run(
        scenario=scenario,
        users=sim.users,
        phases=sim.phases,
        pools=sim.pools,
        backends=list(sim.backends.values()),
        window=window,
        duration=scenario.duration,
        events=sim.events,
        wall_seconds=time.perf_counter() - began,
        scheduler=sim.sched,
        trace=sim.trace,
        models=sim.models,
        saturated=sim.saturated,
        saturated_tokens=sim.saturated_tokens,
    )
