"""Whose job goes next, and what it is charged: fairness behind one object.

The facade (``Scheduler``) hands a job in with the pool of contention routing
found for its class (``enqueue``), asks whose job is next among the classes
routing has open (``next``), prepares and starts that job's turn once routing
chose a backend (``prepare``, ``start``), and reports how a running job ends
(``progress``, ``complete``, ``end``). ``Turns`` knows no backend beyond the id
a hold names: slots are routing's, and every hold that ends is handed back.

Queued jobs are ordered by ``order.py`` (the theory of operation is there);
seats, pools and charges are ``fairshare.py``'s, ``pools.py``'s and
``ledger.py``'s, held slots ``holds.py``'s, and the decision to hold one
``anticipation.py``'s (``Turns.anticipation``).

Invariants (``check()``): a queued job is in one queue and counts once in its
seat's and its user's ``queued``; every queued job's class has its pool
(``regroup`` seats them all again when pools change); whatever moves a seat
re-keys it (``Order.rekey``) before control returns to the facade.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Hashable, Iterable, Mapping
from dataclasses import dataclass

from ..jobs import ClassKey, Job, Modality, Rejection, class_key
from ..pooling import PoolKey
from ..settings import SchedulerSettings
from ..views import QueueStats, ShareSnapshot
from .anticipation import Anticipation
from .fairshare import FairShare
from .holds import Hold, Holds
from .ledger import Charge, Ledger
from .order import Order
from .pools import Pool, Seat
from .priority import PriorityTerms
from .queues import Queues
from .snapshots import build_queue_stats, build_share, pending_usage

__all__ = ["Turn", "Turns"]


@dataclass(slots=True)
class Turn:
    """A queued job's turn to start, prepared: what it will be charged, and the standing it was chosen by.

    Made once by ``prepare`` and never changed (not frozen: a frozen dataclass costs a decision 0.8 us to build).
    """

    charge: Charge
    terms: PriorityTerms
    user_name: str
    user_group: str | None
    recent_tokens: float
    """Tokens its user completed in this pool within the fairness window."""
    recent_units: float


class Turns:
    """Queues, seats and charges: whose job goes next, and what each person is charged. Pure: time is passed in."""

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings
        self.fair = FairShare(settings)
        self.queues = Queues()
        self.ledger = Ledger(self.fair)
        self.holds = Holds(settings)
        self.order = Order(self.queues, self.fair.pools, settings.wait_bonus_per_second)
        self.anticipation = Anticipation(self.holds, self.fair, self.order, settings.wait_bonus_per_second)
        """Whether a freed slot waits for its seat (``anticipation.py``)."""
        self._usage_backlog: dict[str, list[tuple[Hashable, float, float, float]]] = {}
        """Restored usage by model, as (user id, prompt tokens, completion tokens, at), until its pool exists."""
        self._wait_rate = settings.wait_bonus_per_second

    # -- users and groups --------------------------------------------------

    def set_user(
        self,
        user_id: Hashable,
        weight: float,
        name: str | None,
        group: str | None,
        override: float | None,
        group_weight: float | None,
    ) -> None:
        _, changed = self.fair.set_user(user_id, weight, name, group, override, group_weight)
        self.order.rekey_seats(changed)

    def set_group(self, name: str, weight: float) -> None:
        self.order.rekey_seats(self.fair.set_group(name, weight))

    def remove_user(self, user_id: Hashable) -> None:
        self.fair.remove_user(user_id)

    def has_user(self, user_id: Hashable) -> bool:
        return user_id in self.fair.users

    # -- pools -------------------------------------------------------------

    def _seat_class(self, key: ClassKey, pool_key: PoolKey) -> Pool:
        """The pool class ``key``'s jobs contend in (``pool_key``, routing's answer); restored usage joins it."""
        pool = self.order.pools.get(key)
        if pool is None:
            pool = self.fair.pool(pool_key)
            self.order.assign(key, pool)
            for uid, prompt, completion, at in self._usage_backlog.pop(key[0], ()) if pool.key else ():
                self.fair.add_usage(uid, key[0], prompt, completion, at, pool.key)
        return pool

    def queued_classes(self) -> list[ClassKey]:
        """The classes of the queued jobs, in the order their first job was queued."""
        return self.order.queued_classes()

    def regroup(self, pools: Mapping[ClassKey, PoolKey]) -> None:
        """Pools changed (what backends serve did): seat every queued job in its class's pool (``pools``) again."""
        self.order.forget_pools()
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
            key = class_key(job)
            pool = self._seat_class(key, pools[key])
            seat, new = self.fair.seat(pool, self.fair.users[job.user_id])
            if not seat.queued:
                pool.place(seat, new)
                seats.append((pool, seat))
            seat.queued += 1
        self.queues.clear_heads()
        for pool, seat in seats:
            self.fair.activity(pool, seat)
            pool.touch(seat)
            self.order.rekey(pool, seat)

    def add_usage(
        self, user_id: Hashable, prompt: float, completion: float, at: float, key: ClassKey, pool: PoolKey
    ) -> None:
        """Replay usage from before a restart into class ``key``'s pool, or keep it until the pool exists."""
        if pool:
            self.fair.add_usage(user_id, key[0], prompt, completion, at, self._seat_class(key, pool).key)
        else:
            self._usage_backlog.setdefault(key[0], []).append((user_id, prompt, completion, at))

    # -- queueing ----------------------------------------------------------

    def refusal(self, job: Job) -> Rejection | None:
        """A 429 when the job is past a queue cap.

        The caps isolate: a user's and a proxy's own (its people together), then ``max_queued`` less a reserve
        (``queue_reserve``) that only the first request of a user and proxy with nothing queued may take, so
        those who filled the queue are refused and a newcomer is not.
        """
        settings, queues = self.settings, self.queues
        user = self.fair.users[job.user_id]
        if user.queued >= settings.max_queued_per_user:
            return Rejection(
                job,
                429,
                "queue_full",
                f"you already have {user.queued} requests queued, the most allowed; wait for some to finish",
                retry_after=1.0,  # a slot frees within about one request's time; a client that honours it returns then
            )
        via = queues.via.get(job.via, 0) if job.via is not None else 0
        if via >= settings.max_queued_per_proxy:
            return Rejection(
                job,
                429,
                "queue_full",
                f"the front end you use already has {via} requests queued for its people, the most allowed; "
                "send the request again in a few seconds",
                retry_after=5.0,
            )
        queued = len(queues.jobs)
        newcomer = not user.queued and not via
        if queued >= settings.max_queued or (
            not newcomer and queued >= settings.max_queued - int(settings.max_queued * settings.queue_reserve)
        ):
            return Rejection(
                job,
                429,
                "queue_full",
                f"the router already has {queued} requests queued, the most it holds; "
                "send the request again in a few seconds",
                retry_after=5.0,
            )
        return None

    def enqueue(self, job: Job, pool_key: PoolKey, now: float, *, front: bool) -> Hold | None:
        """Queue ``job`` in its class's pool ``pool_key``: at the back, or at the front (a retry keeps its place).

        Returns the hold of its seat that ended for it, if one did (routing gives the slot back).
        """
        if not self.queues.jobs:
            self.fair.contention_started(now)
        user = self.fair.users[job.user_id]
        key = class_key(job)
        pool = self._seat_class(key, pool_key)
        seat, new = self.fair.seat(pool, user)
        entering = not seat.queued
        if entering:  # credit banked while nothing was queued goes; a debt stays (pools.py)
            pool.place(seat, new, as_ended=not front and self.holds.within(seat, now))
        ended = self.holds.submitted(seat, pool.key, now, learn=not front)  # after: the price stays
        head = self.queues.add(job, key, front=front)
        seat.queued += 1
        user.queued += 1
        if entering:
            self.order.rekey_seats(self.fair.activity(pool, seat))
        if entering or head or ended is not None:
            pool.touch(seat)
            self.order.rekey(pool, seat)
        return ended

    def unqueue(self, job: Job, now: float) -> None:
        key = class_key(job)
        pool = self.order.pools[key]
        seat = pool.seats[job.user_id]
        self.queues.remove(job, key)
        seat.queued -= 1
        seat.user.queued -= 1
        if not seat.queued:
            pool.queue_emptied(seat)
        if not self.queues.jobs:
            self.fair.queue_became_empty(now)
        self.order.rekey_seats(self.fair.activity(pool, seat))
        pool.touch(seat)
        self.order.rekey(pool, seat)

    # -- choosing and starting ---------------------------------------------

    def refresh(self, now: float) -> list[Hold]:
        """Before choosing: end the holds past their time (returned), charge whole answers what the clock says
        they produced, age usage and re-rate heavy seats."""
        ended = self.anticipation.expire_holds(now)
        rekey = self.order.rekey
        for moved in self.ledger.tick(now):
            rekey(moved.pool, moved.seat)
        for pool in self.fair.pools.values():
            for seat in pool.refresh(now):
                rekey(pool, seat)
            if pool.maybe_shift():
                for seat in pool.seats.values():
                    rekey(pool, seat)
        return ended

    def next(self, blocked: Container[ClassKey], is_open: Callable[[ClassKey], bool]) -> tuple[ClassKey, Job] | None:
        """The queued job to start next: the best head of a class not ``blocked`` that ``is_open``, if any."""
        return self.order.best(blocked, is_open) if self.queues.jobs else None

    def capped(self, key: ClassKey, job: Job, slots: int, running: int) -> bool:
        """Whether ``job``'s user, running ``running`` of a backend's ``slots``, holds the most of them
        ``max_slot_share`` allows while someone else has a seat in the class's pool and could send."""
        share = self.settings.max_slot_share
        if share is None or running < max(1, int(share * slots + 1e-9)):
            return False
        return len(self.order.pools[key].seats) > 1

    @property
    def queued_per_class(self) -> Mapping[ClassKey, int]:
        return self.queues.counts

    def expected_answer(self, key: ClassKey, job: Job) -> float:
        """Completion tokens ``job`` should produce: its user's usual answer, else the pool's, within ``max_tokens``."""
        if job.modality is Modality.EMBEDDINGS:
            return 0.0
        usual = self.fair.users[job.user_id].completion_ema
        answer = self.order.pools[key].answer if usual is None else usual
        return answer if job.max_tokens is None else min(answer, float(job.max_tokens))

    def prepare(self, key: ClassKey, job: Job, now: float, rate: float | None) -> Turn:
        """``job``'s turn, as it would start now; changes nothing, so a failure here leaves no trace.

        ``rate``: completion tokens a second one stream of the chosen (backend, model) was seen to get.
        """
        user = self.fair.users[job.user_id]
        pool = self.order.pools[key]
        seat = pool.seats[user.id]
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
        charge = self.ledger.prepare(job, pool, seat, now, rate)
        return Turn(charge, terms, user.name, user.group, seat.recent_tokens, seat.recent)

    def start(self, key: ClassKey, turn: Turn, now: float) -> None:
        """The prepared turn's job (of class ``key``) starts: off its queue, and its seat charged."""
        charge = turn.charge
        job, pool, seat = charge.job, charge.pool, charge.seat
        self.queues.remove(job, key)
        seat.queued -= 1
        seat.user.queued -= 1
        if not self.queues.jobs:
            self.fair.queue_became_empty(now)
        self.ledger.start(charge)
        if not seat.queued:
            pool.queue_emptied(seat)
        self.order.rekey_seats(self.fair.activity(pool, seat))
        self.order.rekey(pool, seat)

    # -- running jobs ------------------------------------------------------

    def progress(self, charge: Charge, completion_tokens: int) -> None:
        if self.ledger.progress(charge, completion_tokens):
            self.order.rekey(charge.pool, charge.seat)

    def complete(self, charge: Charge, now: float, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        """The job finished with the backend's counts (None: not reported); without counts, what was charged stands."""
        prompt = charge.job.prompt_tokens if prompt_tokens is None else prompt_tokens
        if completion_tokens is not None:
            completion = float(completion_tokens)
        elif prompt_tokens is None:
            completion = charge.answer
        else:
            completion = float(charge.streamed)
        self._settle(charge, now, prompt, completion, completion_tokens)

    def end(self, charge: Charge, now: float, prompt_tokens: int | None, completion_tokens: int) -> None:
        """The job failed or was cancelled, having used its prompt (None: the estimate) and at least what streamed."""
        prompt = charge.job.prompt_tokens if prompt_tokens is None else prompt_tokens
        self._settle(charge, now, prompt, max(completion_tokens, charge.streamed), None)

    def _settle(self, charge: Charge, now: float, prompt: float, completion: float, learned: int | None) -> None:
        self.ledger.settle(charge, now, prompt, completion, learned)
        pool, seat = charge.pool, charge.seat
        seat.ended = now
        seat.ends.append(now)
        if not seat.queued:
            seat.kept = pool.returning(seat)
        self.order.rekey_seats(self.fair.activity(pool, seat))
        self.order.rekey(pool, seat)

    # -- holds -------------------------------------------------------------

    def queued_of(self, user_id: Hashable) -> int:
        return self.fair.users[user_id].queued

    # -- reading -----------------------------------------------------------

    def queued(self, job_id: str) -> Job | None:
        return self.queues.jobs.get(job_id)

    @property
    def queued_count(self) -> int:
        return len(self.queues.jobs)

    def queued_jobs(self) -> Iterable[Job]:
        return self.queues.jobs.values()

    def queue_position(self, job_id: str) -> tuple[int, int] | None:
        """(1-based place among its user's queued jobs of the same class, jobs queued in all), or None."""
        job = self.queues.jobs.get(job_id)
        place = None if job is None else self.queues.position(job, class_key(job))
        return None if place is None else (place, len(self.queues.jobs))

    @property
    def heavy(self) -> frozenset[Hashable]:
        return frozenset(uid for pool in self.fair.pools.values() for uid in pool.heavy)

    def share(self, now: float, user_ids: Iterable[Hashable] | None = None, *, active: bool = False) -> ShareSnapshot:
        fair, settings = self.fair, self.settings
        window = settings.fairness_window
        pending = pending_usage(self._usage_backlog.items(), now - window, fair.prices.cost)
        if active:
            known = fair.active()
            known.update((uid, fair.users[uid]) for uid in pending if uid in fair.users and uid not in known)
            users = list(known.values())
        else:
            users = list(fair.users.values()) if user_ids is None else [fair.users[u] for u in user_ids]
        burst = fair.current_burst(now)
        pools = user_ids is None
        return build_share(
            users, fair.pools.values(), now, settings.shares, window, burst, pending, pools, complete=pools or active
        )

    def queue_stats(self, now: float, running: int) -> QueueStats:
        return build_queue_stats(self.queues.jobs.values(), running, self.fair.users, now)

    def check(self) -> None:
        """Assert the invariants (for tests)."""
        self.fair.check()
        self.queues.check()
        for user in self.fair.users.values():
            assert user.queued == sum(len(q) for q in self.queues.classes_of(user.id).values())
            seated = sum(p.seats[user.id].queued for p in self.fair.pools.values() if user.id in p.seats)
            assert seated == user.queued, (user, seated)
        for job in self.queues.jobs.values():
            assert self.order.pools.get(class_key(job)) is not None, job
