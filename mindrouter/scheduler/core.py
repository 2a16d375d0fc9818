"""The scheduler: queues jobs, decides what runs where, and accounts for what ran.

Theory of operation. Jobs wait in FIFO queues per user and job class
(``queues.py``); a class's candidate backends (``classes.py``) lie in one pool
of contention (``pools.py``: backends joined by shared models), where the user
has one seat with one lag, whichever of the pool's classes its jobs are in. For
every class there is a heap of queue heads keyed by

    key = wait_rate * submitted_at - (V + priority(seat, V))

which is ``-lag`` plus a constant for plain seats, so it orders heads exactly
as the seed's priority plus ``wait_rate * waited`` does at any instant, yet
never changes as time passes. A key changes only when its seat is charged or
placed, or (for the at most one heavy seat of a pool) when V or the weight
moves; then the seat's heads are pushed again and stale entries are dropped
lazily. Heads of different classes are compared by ``key + V`` of their own
pool (the same V for classes whose candidates overlap, so there they compare
by lag alone: weighted max-min across the pool), so a decision costs O(log n)
in queued jobs, plus a constant per class and per candidate backend.

``dispatch(now)`` repeatedly takes the highest-priority head whose class has
an open backend and routes it to the open backend where it is expected to
finish first (``estimate.py``), until nothing more can start. The caller performs the I/O, reports streamed tokens
with ``progress`` and the end with ``complete``, ``fail`` or ``cancel``.

Invariants: a job is in exactly one of queued / running / finished; a backend's
in-flight count equals the running jobs routed to it and never exceeds its
``max_concurrent``; ``check()`` asserts these.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable

from .fairness.fairshare import FairShare
from .fairness.holds import Holds
from .fairness.ledger import Ledger
from .fairness.pools import Pool, Seat
from .fairness.priority import PriorityTerms
from .fairness.queues import Entry, Queues
from .jobs import ClassKey, Job, Modality, Rejection, class_key, numbers_refusal
from .outcomes import JobOutcomes
from .pooling import PoolKey
from .reading import CoreReading
from .records import DecisionRecord, Dispatch
from .roster import CoreRoster
from .routing.backend import Backend, BackendLoad
from .routing.classes import Classes, Route
from .routing.estimate import Speeds
from .settings import SchedulerSettings

__all__ = ["Scheduler", "UnknownUser"]


class UnknownUser(KeyError):
    """A job names a user the scheduler was never told about (call ``set_user`` first)."""


class Scheduler(JobOutcomes, CoreReading, CoreRoster):
    """Sans-I/O fair-share scheduler and router. Every method that depends on time takes ``now``."""

    def __init__(self, settings: SchedulerSettings | None = None) -> None:
        self.settings = settings = settings or SchedulerSettings()
        self.fair = FairShare(settings)
        self.speeds = Speeds()
        self._backends: dict[Hashable, Backend] = {}
        self._loads: dict[Hashable, BackendLoad] = {}
        self.classes = Classes(self._backends, self._loads, settings)
        self.holds = Holds(self._loads, self.classes, settings)
        self._class_pool: dict[ClassKey, Pool] = {}
        self.queues = Queues()
        self.ledger = Ledger(self.fair)
        self._running = self.ledger.jobs
        self._deadlines: list[tuple[float, int, str]] = []
        self._excluded: dict[str, set[Hashable]] = {}
        self._attempts: dict[str, int] = {}
        self._heavy_keyed: dict[PoolKey, tuple[float, float]] = {}
        self._usage_backlog: dict[str, list[tuple[Hashable, float, float, float]]] = {}
        """Restored usage by model, as (user id, prompt tokens, completion tokens, at), until its pool exists."""
        self._unstartable: list[tuple[Job, Exception]] = []
        self._seq = 0
        self._wait_rate = settings.wait_bonus_per_second

    # -- pools -------------------------------------------------------------

    def _classes_changed(self) -> None:
        """Candidates changed, so pools may have: seat every queued job in its class's pool again."""
        self.classes.clear()
        self._class_pool.clear()
        if not self.queues.jobs:
            return
        seats: list[tuple[Pool, Seat]] = []
        for pool in self.fair.pools.values():
            for seat in pool.seats.values():
                if seat.queued:
                    pool.queue_emptied(seat)
                    seat.queued = 0
                    seats.append((pool, seat))
        for job in self.queues.jobs.values():
            pool = self._pool(class_key(job))
            seat, new = self.fair.seat(pool, self.fair.users[job.user_id])
            if not seat.queued:
                pool.place(seat, new)
                seats.append((pool, seat))
            seat.queued += 1
        self.queues.clear_heads()
        for pool, seat in seats:
            self.fair.activity(pool, seat)
            pool.touch(seat)
            self._rekey(pool, seat)

    def _pool(self, key: ClassKey) -> Pool:
        pool = self._class_pool.get(key)
        if pool is None:
            pool = self._class_pool[key] = self.fair.pool(self.classes.get(key).pool)
            for uid, prompt, completion, at in self._usage_backlog.pop(key[0], ()) if pool.key else ():
                self.fair.add_usage(uid, prompt, completion, at, pool.key)
        return pool

    def add_usage(self, user_id: Hashable, prompt: float, completion: float, at: float, model: str) -> None:
        """Replay usage from before a restart (``at`` on the caller's clock) into ``model``'s pool.

        Backends are usually not known yet at that point, so the usage waits until
        the model's pool is first needed.
        """
        key = (model, Modality.CHAT, False)
        if self.classes.get(key).candidates:
            self.fair.add_usage(user_id, prompt, completion, at, self._pool(key).key)
        else:
            self._usage_backlog.setdefault(model, []).append((user_id, prompt, completion, at))

    # -- submitting --------------------------------------------------------

    def submit(self, job: Job, now: float) -> Rejection | None:
        """Queue ``job``, or say why it cannot be queued (``Rejection`` with its HTTP status)."""
        user = self.fair.users.get(job.user_id)
        if user is None:
            raise UnknownUser(job.user_id)
        if job.id in self.queues.jobs or job.id in self._running:
            raise ValueError(f"job {job.id!r} is already queued or running")
        refusal = numbers_refusal(job) or self.classes.refusal(job)
        if refusal is not None:
            return refusal
        if len(self.queues.jobs) >= self.settings.max_queued:
            return Rejection(
                job,
                429,
                "queue_full",
                f"the router already has {len(self.queues.jobs)} requests queued, the most it holds; "
                "send the request again in a few seconds",
                retry_after=5.0,
            )
        if user.queued >= self.settings.max_queued_per_user:
            return Rejection(
                job,
                429,
                "queue_full",
                f"you already have {user.queued} requests queued, the most allowed; wait for some to finish",
                retry_after=1.0,  # a slot frees within about one request's time; a client that honours it returns then
            )
        self._enqueue(job, now, front=False)
        self._seq += 1
        heapq.heappush(self._deadlines, (job.submitted_at + self.settings.queue_timeout, self._seq, job.id))
        return None

    def _enqueue(self, job: Job, now: float, *, front: bool) -> None:
        if not self.queues.jobs:
            self.fair.contention_started(now)
        user = self.fair.users[job.user_id]
        key = class_key(job)
        pool = self._pool(key)
        seat, new = self.fair.seat(pool, user)
        entering = not seat.queued
        if entering:  # credit banked while nothing was queued goes; a debt stays (pools.py)
            pool.place(seat, new, as_ended=not front and self.holds.within(seat, now))
        charged = self.holds.submitted(seat, pool.key, now, learn=entering and not front)  # after: the price stays
        head = self.queues.add(job, key, front=front)
        seat.queued += 1
        user.queued += 1
        if entering:
            self._rekey_seats(self.fair.activity(pool, seat))
        if entering or head or charged:
            pool.touch(seat)
            self._rekey(pool, seat)

    def _rekey(self, pool: Pool, seat: Seat) -> None:
        """Push ``seat``'s current heads with its current priority (older entries go stale)."""
        uid = seat.user.id
        queues = self.queues.classes_of(uid)
        if not queues:
            return
        if seat.factor == 1.0:
            base = seat.lag
        else:
            ref = pool.reference()
            base = ref + pool.priority(seat, ref)
        rate = self._wait_rate
        for key, queue in queues.items():
            if self._pool(key) is pool:
                self.queues.push(key, rate * queue[0].submitted_at - base, uid, seat.version, self._valid)

    def _rekey_seats(self, seats: Iterable[Seat]) -> None:
        for seat in seats:
            for pool in self.fair.pools.values():
                if pool.seats.get(seat.user.id) is seat:
                    self._rekey(pool, seat)
                    break

    def _rank(self, key: ClassKey, entry: Entry) -> tuple[float, int]:
        """Where a queue head stands among all heads: lowest is served first."""
        return entry[0] + self._pool(key).reference(), entry[1]

    def _valid(self, entry: Entry, key: ClassKey) -> bool:
        seat = self._pool(key).seats.get(entry[2])
        return seat is not None and seat.version == entry[3] and self.queues.has_queue(entry[2], key)

    # -- dispatching -------------------------------------------------------

    def dispatch(self, now: float) -> list[Dispatch]:
        """Start every job that can start now, best first; return what to send where.

        Whole answers still running are first charged what the clock says they produced (``Ledger.tick``).
        """
        self._end_holds(now)
        for moved in self.ledger.tick(now):
            self._rekey(moved.pool, moved.seat)
        for pool in self.fair.pools.values():
            for seat in pool.refresh(now):
                self._rekey(pool, seat)
            if pool.maybe_shift():
                for seat in pool.seats.values():
                    self._rekey(pool, seat)
        self.classes.now = now
        out: list[Dispatch] = []
        blocked: set[ClassKey] = set()
        while self.queues.jobs:
            self._rekey_heavy()
            best: tuple[float, int] | None = None
            best_entry: Entry | None = None
            best_key: ClassKey | None = None
            for key in self.queues.live_classes():
                if key in blocked or not self.classes.get(key).open:
                    continue
                entry = self.queues.top(key, self._valid)
                if entry is None:
                    continue
                rank = self._rank(key, entry)
                if best is None or rank < best:
                    best, best_entry, best_key = rank, entry, key
            if best_entry is None or best_key is None:
                break
            job = self.queues.head(best_entry[2], best_key)
            try:
                routed = self.classes.route(
                    best_key,
                    job,
                    self._expected_answer(best_key, job),
                    self.settings,
                    self.speeds,
                    self._excluded.get(job.id),
                    self.queues.counts[best_key],
                    self.queues.counts,
                )
                if routed is None or routed[0] is None:  # nothing open, or better to wait for a full one
                    blocked.add(best_key)
                    continue
                out.append(self._start(best_key, job, routed, now))
            except Exception as exc:  # a value no check caught, or a bug: this job alone fails
                self._unqueue(job, now)
                self._forget(job.id)
                self._unstartable.append((job, exc))
        return out

    def _expected_answer(self, key: ClassKey, job: Job) -> float:
        """Completion tokens ``job`` should produce: its user's usual answer, else the pool's, within ``max_tokens``."""
        if job.modality is Modality.EMBEDDINGS:
            return 0.0
        usual = self.fair.users[job.user_id].completion_ema
        answer = self._pool(key).answer if usual is None else usual
        return answer if job.max_tokens is None else min(answer, float(job.max_tokens))

    def take_unstartable(self) -> list[tuple[Job, Exception]]:
        """Jobs ``dispatch`` removed because starting them raised, with the error; each is returned once."""
        out, self._unstartable = self._unstartable, []
        return out

    def _rekey_heavy(self) -> None:
        """A heavy seat's key is measured from V: push it again when V or the credit moved."""
        for pool in self.fair.pools.values():
            if not pool.heavy:
                continue
            mark = (pool.reference(), pool.credit())
            if self._heavy_keyed.get(pool.key) == mark:
                continue
            self._heavy_keyed[pool.key] = mark
            for uid in pool.heavy:
                seat = pool.seats.get(uid)
                if seat is not None and seat.queued:
                    pool.touch(seat)
                    self._rekey(pool, seat)

    def _start(self, key: ClassKey, job: Job, routed: Route, now: float) -> Dispatch:
        fair = self.fair
        user = fair.users[job.user_id]
        pool = self._pool(key)
        seat = pool.seats[user.id]
        backend_id, rows, live = routed
        assert backend_id is not None
        reference = pool.reference()
        wait_bonus = self._wait_rate * (now - job.submitted_at)
        terms = PriorityTerms(
            deficit=(seat.lag - reference) * seat.weight,
            inflight_charge=seat.inflight,
            weight=seat.weight,
            factor=seat.factor,
            usage_fraction=pool.usage_fraction(seat),
            reference=reference,
            credit=pool.credit(),
            wait_bonus=wait_bonus,
            priority=pool.priority(seat, reference) + wait_bonus,
        )
        speed = self._loads[backend_id].speeds.get(job.model)
        rate = speed.observed if speed is not None else None
        running = self.ledger.prepare(job, backend_id, pool, seat, now, rate)
        record = DecisionRecord(
            request_id=job.id,
            time=now,
            model=job.model,
            user_id=user.id,
            user_name=user.name,
            user_group=user.group,
            user_recent_usage=seat.recent_tokens,
            user_recent_units=seat.recent,
            queue_wait=now - job.submitted_at,
            selected_backend_id=backend_id,
            candidates=rows,
            static_rejected=self.classes.get(key).static_rejected,
            live_rejected=live,
            terms=terms,
            attempt=self._attempts.get(job.id, 0) + 1,
            slot_held=self._loads[backend_id].hold_ended >= job.submitted_at,
        )
        self.queues.remove(job, key)
        seat.queued -= 1
        user.queued -= 1
        if not self.queues.jobs:
            fair.queue_became_empty(now)
        self.ledger.start(running)
        if not seat.queued:
            pool.queue_emptied(seat)
        self._rekey_seats(fair.activity(pool, seat))
        self._rekey(pool, seat)
        self._took(backend_id, job.id, job.model, routed, now)
        self.classes.load_changed(backend_id)
        return Dispatch(job, backend_id, record)

    def _took(self, backend_id: Hashable, job_id: str, model: str, routed: Route, now: float) -> None:
        """A slot is taken: count it per model, and expect the load and evictions it triggers at once."""
        load = self._loads[backend_id]
        load.in_flight += 1
        load.model_in_flight[model] = load.model_in_flight.get(model, 0) + 1
        chosen = next(row for row in routed[1] if row.backend_id == backend_id)
        if chosen.start > 0 and model not in load.loading:
            load.loading[model] = now + chosen.start
            load.loaders.add(job_id)
        for victim in chosen.evicts:
            load.evicted[victim] = now
