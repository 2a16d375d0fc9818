"""The discrete-event loop that drives the real scheduler core with simulated users and backends.

Theory of operation. Events (arrivals, prefill ends, completions, queue
deadlines, 60 s window boundaries) sit in one heap ordered by (time, kind
order, sequence), so equal times resolve the same way on every run. All events
at one instant form a *batch*; after each batch the loop calls
``Scheduler.dispatch(now)`` once and starts what it returns. A backend decodes
each request at ``tokens_per_second`` after a prefill of
``prompt_tokens / prefill_tokens_per_second``, up to ``max_concurrent`` at once
(the core never hands it more).

Service is counted *as generated*: a request's prompt tokens count when its
prefill ends, its completion tokens continuously at the decode rate. Each
user's service is therefore a piecewise-linear function of time,
``tokens(t) = prompt + base + rate * t``, updated in O(1) per event, which
makes windows, shares and the service gap exact without per-token events.

The service gap between two users (``_gap.GapTracker``) is sampled only where
it can peak: the difference of two piecewise-linear functions reaches its
extremes at their breakpoints, so a pair is evaluated just before and just
after a batch in which one of its users' lines changed. A second tracker
counts each request's whole cost at dispatch, which measures the scheduler's
decisions alone, without the work already running when a pair became
backlogged.

All randomness comes from one ``random.Random`` per user, seeded from the
scenario seed and the user's name, so the same file and seed give the same
run, and adding a user does not change the others' draws.
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..scheduler import Backend, Job, Scheduler
from ._gap import GapTracker
from .scenario import BackendSpec, Scenario, UserSpec

__all__ = ["BackendRun", "RequestTrace", "Run", "UserRun", "WindowRun", "simulate"]

# Event kinds; the first number is the order among events at the same instant.
_WINDOW = 0  # window boundaries see the state before anything else at that instant
_PREFILL = 1
_DONE = 2
_EXPIRE = 3
_ARRIVE = 4


@dataclass(slots=True)
class RequestTrace:
    """One simulated request, start to end (times in simulated seconds; None if it never got there)."""

    id: str
    user: int
    prompt: int
    completion: int
    submitted: float
    dispatched: float | None = None
    prefill_end: float | None = None
    done: float | None = None
    backend: str | None = None
    epoch: int = 0
    """Slot-freeing batches (for its model) seen before it was submitted."""
    skipped: int = 0
    """Slot-freeing batches that passed while it waited, their slots going to others."""
    timed_out: bool = False


@dataclass(slots=True)
class UserRun:
    """What one simulated user did and received. Token amounts are as generated."""

    spec: UserSpec
    index: int
    rng: random.Random
    stop: float
    """When the user stops sending (its ``stop``, else the end of the run)."""
    # Service lines: prompt tokens done + completion tokens = c_base + c_rate * t.
    prompt_done: float = 0.0
    c_base: float = 0.0
    c_rate: float = 0.0
    touched: int = -1
    dispatched_cost: float = 0.0
    """Cost of every request dispatched so far, counted whole at dispatch."""
    submitted: int = 0
    queued: int = 0
    running: int = 0
    completed: int = 0
    completed_tokens: int = 0
    timed_out: int = 0
    rejected: int = 0
    waits: list[float] = field(default_factory=list)
    waited: int = 0
    """Requests that could not start the moment they arrived."""
    max_skipped: int = 0
    backlogged: bool = False
    backlogged_seconds: float = 0.0
    backlogged_since: float | None = None
    target: float = 0.0
    """Tokens the user was entitled to (see ``Run``), accumulated per epoch."""
    epoch_tokens: float = 0.0
    deprioritized_seconds: float = 0.0
    deprioritized_since: float | None = None
    min_factor: float = 1.0

    def tokens(self, t: float) -> float:
        return self.prompt_done + self.c_base + self.c_rate * t


@dataclass(slots=True)
class BackendRun:
    spec: BackendSpec
    busy: int = 0
    requests: int = 0
    tokens: int = 0
    slot_seconds: float = 0.0
    """Slot-seconds spent on requests, up to the end of the run."""
    full_at: float | None = None
    """First moment every slot was busy."""


@dataclass(slots=True)
class WindowRun:
    start: float
    end: float
    tokens: list[float]
    targets: list[float]
    backlogged: float
    """Seconds of the window during which someone was backlogged."""


@dataclass(slots=True)
class Run:
    """The raw outcome of one simulation (``report.build`` turns it into the JSON contract).

    ``target`` per user: while some users are backlogged (have requests waiting
    in the queue), users who are not take exactly what they ask for and the rest
    of the delivered service is owed to the backlogged ones in proportion to
    weight; summed over the run, that is the user's entitlement. With every user
    saturating the whole run, it is simply weight / total weight.
    """

    scenario: Scenario
    users: list[UserRun]
    backends: list[BackendRun]
    windows: list[WindowRun]
    window: float
    """Seconds per window."""
    duration: float
    gap: GapTracker
    """Service gap with tokens as generated (``max``, ``pair``, ``at``)."""
    dispatch_gap: GapTracker
    """The same with each request's whole cost counted when it is dispatched."""
    max_request_cost: float
    events: int
    wall_seconds: float
    scheduler: Scheduler
    trace: list[RequestTrace] | None


class _Sim:
    def __init__(self, scenario: Scenario, *, trace: bool, window: float) -> None:
        self.sc = scenario
        self.sched = Scheduler(scenario.settings)
        self.settings = scenario.settings
        self.users = [
            UserRun(
                spec,
                i,
                random.Random(f"{scenario.seed}/{spec.name}"),
                scenario.duration if spec.stop is None else spec.stop,
            )
            for i, spec in enumerate(scenario.users)
        ]
        self.backends = {b.name: BackendRun(b) for b in scenario.backends}
        for spec in scenario.backends:
            self.sched.set_backend(
                Backend(
                    id=spec.name,
                    name=spec.name,
                    models=frozenset(spec.models),
                    loaded_models=frozenset(spec.loaded_models),
                    max_concurrent=spec.max_concurrent,
                    priority=spec.priority,
                )
            )
        for user in self.users:
            self.sched.set_user(user.index, user.spec.weight, name=user.spec.name, group=user.spec.group)
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.reqs: dict[str, RequestTrace] = {}
        self.trace: list[RequestTrace] | None = [] if trace else None
        self.next_id = 0
        self.batch = 0
        self.touched: list[UserRun] = []
        self.freed_models: set[str] = set()
        self.free_epoch: dict[str, int] = {m: 0 for b in scenario.backends for m in b.models}
        self.expire_at: float | None = None
        self.window = window
        self.windows: list[WindowRun] = []
        self.win_start = 0.0
        self.win_tokens = [0.0] * len(self.users)
        self.win_targets = [0.0] * len(self.users)
        self.win_backlogged = 0.0
        # Epochs: intervals with a constant backlogged set.
        self.epoch_start = 0.0
        self.backlogged: list[UserRun] = []
        self.backlog_weight = 0.0
        self.gap = GapTracker(len(self.users))
        """Service as generated."""
        self.dispatch_gap = GapTracker(len(self.users))
        """Service counted whole at dispatch: the scheduler's decisions alone."""
        self.max_cost = 0.0
        self.last_heavy: object = None
        self.last_heavy_ids: frozenset[object] = frozenset()
        self.events = 0
        cost = self.settings
        self.pc, self.cc = cost.prompt_token_cost, cost.completion_token_cost

    # -- events -------------------------------------------------------------

    def push(self, t: float, kind: int, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, payload))

    def run(self, progress: Callable[[float], None] | None) -> None:
        for user in self.users:
            spec = user.spec
            if spec.concurrency is not None:
                for _ in range(spec.concurrency):
                    self.push(spec.start, _ARRIVE, user)
            else:
                assert spec.rate is not None
                self.push(spec.start + user.rng.expovariate(spec.rate), _ARRIVE, user)
        k = 1
        while k * self.window <= self.sc.duration:
            self.push(k * self.window, _WINDOW, None)
            k += 1
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
                    self.arrive(payload, now)  # type: ignore[arg-type]
                elif kind == _EXPIRE:
                    self.on_expire(now)
                else:
                    self.on_window(now)
            self.end_batch(now)
            if progress is not None and not self.batch & 4095:
                progress(now)
        self.finish(duration)
        if progress is not None:
            progress(duration)

    def set_line(self, user: UserRun) -> None:
        """Hand ``user``'s service over weight, in cost units, to the gap tracker."""
        w = user.spec.weight
        self.gap.set(user.index, (self.pc * user.prompt_done + self.cc * user.c_base) / w, self.cc * user.c_rate / w)

    def touch(self, user: UserRun) -> None:
        if user.touched != self.batch:
            user.touched = self.batch
            self.touched.append(user)

    def arrive(self, user: UserRun, now: float) -> None:
        spec = user.spec
        if now >= user.stop or (spec.requests is not None and user.submitted >= spec.requests):
            return
        if spec.rate is not None:
            nxt = now + user.rng.expovariate(spec.rate)
            if nxt < user.stop:
                self.push(nxt, _ARRIVE, user)
        rng = user.rng
        low, high = spec.prompt_tokens
        prompt = low if low == high else rng.randint(low, high)
        low, high = spec.completion_tokens
        completion = low if low == high else rng.randint(low, high)
        if spec.max_tokens is not None:
            completion = min(completion, spec.max_tokens)
        self.next_id += 1
        job_id = str(self.next_id)
        job = Job(job_id, user.index, spec.model, now, prompt_tokens=prompt, max_tokens=spec.max_tokens)
        user.submitted += 1
        rejection = self.sched.submit(job, now)
        if rejection is not None:
            user.rejected += 1
            if spec.concurrency is not None:
                self.push(now + max(1.0, rejection.retry_after or 1.0), _ARRIVE, user)
            return
        req = RequestTrace(job_id, user.index, prompt, completion, now, epoch=self.free_epoch[spec.model])
        self.reqs[job_id] = req
        if self.trace is not None:
            self.trace.append(req)
        user.queued += 1
        self.touch(user)

    def on_prefill(self, req: RequestTrace, now: float) -> None:
        user = self.users[req.user]
        rate = self.backends[req.backend].spec.tokens_per_second  # type: ignore[index]
        user.prompt_done += req.prompt
        user.c_rate += rate
        user.c_base -= rate * now
        self.set_line(user)

    def on_done(self, req: RequestTrace, now: float) -> None:
        user = self.users[req.user]
        backend = self.backends[req.backend]  # type: ignore[index]
        rate = backend.spec.tokens_per_second
        user.c_rate -= rate
        user.c_base += rate * now
        if user.c_rate < 1e-9:  # no decode left: drop rounding so the line stays exact
            user.c_rate = 0.0
        self.set_line(user)
        req.done = now
        del self.reqs[req.id]
        user.running -= 1
        user.completed += 1
        user.completed_tokens += req.prompt + req.completion
        backend.busy -= 1
        backend.tokens += req.prompt + req.completion
        self.freed_models.update(backend.spec.models)
        assert req.dispatched is not None and req.prefill_end is not None
        self.sched.complete(
            req.id,
            now,
            prompt_tokens=req.prompt,
            completion_tokens=req.completion,
            latency=now - req.dispatched,
            duration=now - req.prefill_end,
        )
        self.next_request(user, now)

    def next_request(self, user: UserRun, now: float) -> None:
        spec = user.spec
        if spec.concurrency is None:
            return
        if spec.think_time:
            self.push(now + spec.think_time, _ARRIVE, user)
        else:
            self.arrive(user, now)

    def on_expire(self, now: float) -> None:
        self.expire_at = None
        for expired in self.sched.expire(now):
            req = self.reqs.pop(expired.job.id)
            req.timed_out = True
            user = self.users[req.user]
            user.queued -= 1
            user.timed_out += 1
            self.touch(user)
            self.next_request(user, now)

    def on_window(self, now: float) -> None:
        self.close_epoch(now)
        self.windows.append(WindowRun(self.win_start, now, self.win_tokens, self.win_targets, self.win_backlogged))
        self.win_start = now
        self.win_tokens = [0.0] * len(self.users)
        self.win_targets = [0.0] * len(self.users)
        self.win_backlogged = 0.0

    # -- after each batch ---------------------------------------------------

    def end_batch(self, now: float) -> None:
        for d in self.sched.dispatch(now):
            self.start(d.job.id, d.backend_id, now)  # type: ignore[arg-type]
        for m in self.freed_models:
            self.free_epoch[m] += 1
        self.freed_models.clear()
        self.update_backlog(now)
        self.touched.clear()
        deadline = self.sched.next_deadline()
        if deadline is not None and (self.expire_at is None or deadline < self.expire_at):
            self.expire_at = deadline
            self.push(max(deadline, now), _EXPIRE, None)
        heavy = self.sched.fair.heavy
        if heavy is not self.last_heavy or heavy != self.last_heavy_ids:
            self.last_heavy = heavy
            self.last_heavy_ids = frozenset(heavy)
            self.track_heavy(now)

    def start(self, job_id: str, backend_id: str, now: float) -> None:
        req = self.reqs[job_id]
        user = self.users[req.user]
        backend = self.backends[backend_id]
        spec = backend.spec
        req.dispatched = now
        req.backend = backend_id
        wait = now - req.submitted
        user.waits.append(wait)
        if wait > 0:
            user.waited += 1
        skipped = self.free_epoch[user.spec.model] - req.epoch
        req.skipped = skipped
        if skipped > user.max_skipped:
            user.max_skipped = skipped
        cost = self.pc * req.prompt + self.cc * req.completion
        if cost > self.max_cost:
            self.max_cost = cost
        user.dispatched_cost += cost
        self.dispatch_gap.set(user.index, user.dispatched_cost / user.spec.weight, 0.0)
        user.queued -= 1
        user.running += 1
        self.touch(user)
        backend.busy += 1
        backend.requests += 1
        if backend.full_at is None and backend.busy >= spec.max_concurrent:
            backend.full_at = now
        prefill_end = now + req.prompt / spec.prefill_tokens_per_second
        done = prefill_end + req.completion / spec.tokens_per_second
        req.prefill_end = prefill_end
        backend.slot_seconds += min(done, self.sc.duration) - now
        self.push(prefill_end, _PREFILL, req)
        self.push(done, _DONE, req)

    def update_backlog(self, now: float) -> None:
        """Move users in or out of the backlog (requests waiting in the queue) and sample the gaps."""
        joined: list[int] = []
        left: list[int] = []
        flips = [u for u in self.touched if (u.queued > 0) != u.backlogged]
        if flips:
            self.close_epoch(now)
            for user in flips:
                if user.queued > 0:
                    user.backlogged = True
                    user.backlogged_since = now
                    self.backlogged.append(user)
                    self.backlog_weight += user.spec.weight
                    joined.append(user.index)
                else:
                    user.backlogged = False
                    assert user.backlogged_since is not None
                    user.backlogged_seconds += now - user.backlogged_since
                    user.backlogged_since = None
                    self.backlogged.remove(user)
                    self.backlog_weight -= user.spec.weight
                    left.append(user.index)
            if not self.backlogged:
                self.backlog_weight = 0.0
        backlogged = [u.index for u in self.backlogged] if joined else []
        self.gap.settle(now, joined, left, backlogged)
        self.dispatch_gap.settle(now, joined, left, backlogged)

    def close_epoch(self, now: float) -> None:
        """Share out the service delivered since the last epoch boundary (see ``Run``)."""
        span = now - self.epoch_start
        users = self.users
        total = 0.0
        free = 0.0
        for user in users:
            tokens = user.tokens(now)
            delta = tokens - user.epoch_tokens
            user.epoch_tokens = tokens
            self.win_tokens[user.index] += delta
            total += delta
            if not user.backlogged:
                user.target += delta
                self.win_targets[user.index] += delta
                free += delta
        if self.backlogged:
            owed = total - free
            weight = self.backlog_weight
            for user in self.backlogged:
                share = owed * user.spec.weight / weight
                user.target += share
                self.win_targets[user.index] += share
            self.win_backlogged += span
        self.epoch_start = now

    def track_heavy(self, now: float) -> None:
        heavy = self.sched.fair.heavy
        for user in self.users:
            state = self.sched.user(user.index)
            assert state is not None
            if user.index in heavy and state.factor < 1.0:
                if user.deprioritized_since is None:
                    user.deprioritized_since = now
                user.min_factor = min(user.min_factor, state.factor)
            elif user.deprioritized_since is not None:
                user.deprioritized_seconds += now - user.deprioritized_since
                user.deprioritized_since = None

    def finish(self, end: float) -> None:
        self.gap.finish(end)
        self.dispatch_gap.finish(end)
        self.close_epoch(end)
        if end > self.win_start:
            self.windows.append(WindowRun(self.win_start, end, self.win_tokens, self.win_targets, self.win_backlogged))
        for user in self.users:
            if user.backlogged_since is not None:
                user.backlogged_seconds += end - user.backlogged_since
            if user.deprioritized_since is not None:
                user.deprioritized_seconds += end - user.deprioritized_since


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
        backends=list(sim.backends.values()),
        windows=sim.windows,
        window=window,
        duration=scenario.duration,
        gap=sim.gap,
        dispatch_gap=sim.dispatch_gap,
        max_request_cost=sim.max_cost,
        events=sim.events,
        wall_seconds=time.perf_counter() - began,
        scheduler=sim.sched,
        trace=sim.trace,
    )
