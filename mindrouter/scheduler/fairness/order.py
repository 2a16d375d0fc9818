"""The order of queued jobs: per class a heap of queue heads, keyed by their seats' priorities.

Theory of operation. Jobs wait in FIFO queues per user and job class
(``queues.py``); a class lies in one pool of contention (``pools.py``:
backends joined by shared models), where the user has one seat with one lag,
whichever of the pool's classes its jobs are in. For every class there is a
heap of queue heads keyed by

    key = wait_rate * submitted_at - (V + priority(seat, V))

which is ``-lag`` plus a constant for plain seats, so it orders heads exactly
as the seed's priority plus ``wait_rate * waited`` does at any instant, yet
never changes as time passes. A key changes only when its seat is charged or
placed, or (for the at most one heavy seat of a pool) when V or the weight
moves; then the seat's heads are pushed again and stale entries are dropped
lazily. Heads of different classes are compared by ``key + V`` of their own
pool (the same V for classes whose candidates overlap, so there they compare
by lag alone: weighted max-min across the pool), so choosing costs O(log n) in
queued jobs, plus a constant per class.

Invariants: every queued job's class has its pool here (``assign``; after
``forget_pools`` the caller assigns every queued class again); whoever changes
a seat's priority touches it (``Pool.touch``) and re-keys it here (``rekey``),
so a class's top valid entry is its best head; an entry goes stale when its
seat's version moves or its queue empties.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Hashable, Iterable, Mapping

from ..jobs import ClassKey, Job, class_key
from ..pooling import PoolKey
from .pools import Pool, Seat
from .queues import Entry, Queues

__all__ = ["Order"]


class Order:
    """Which queued job is at the head of the line, by its seat's priority (over ``queues``, shared)."""

    def __init__(self, queues: Queues, pools: Mapping[PoolKey, Pool], wait_rate: float) -> None:
        self.queues = queues
        self._pools = pools
        """Every pool (``FairShare.pools``): where a seat that moved, or a heavy seat, is found."""
        self._wait_rate = wait_rate
        self._class_pool: dict[ClassKey, Pool] = {}
        self.pools: Mapping[ClassKey, Pool] = self._class_pool
        """The pool each class contends in (every queued job's class is here); read-only."""
        self._heavy_keyed: dict[PoolKey, tuple[float, float]] = {}
        self.parked: set[Hashable] = set()
        """Users whose queue heads are passed over until the caller rekeys them (``Turns.unpark``)."""

    # -- classes and their pools -------------------------------------------

    def assign(self, key: ClassKey, pool: Pool) -> None:
        self._class_pool[key] = pool

    def forget_pools(self) -> None:
        """Pools changed: every class is assigned again (the caller re-keys every queued seat)."""
        self._class_pool.clear()

    def queued_classes(self) -> list[ClassKey]:
        """The classes of the queued jobs, in the order their first job was queued."""
        return list(dict.fromkeys(class_key(job) for job in self.queues.jobs.values()))

    # -- keys --------------------------------------------------------------

    def rekey(self, pool: Pool, seat: Seat) -> None:
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
        class_pool = self._class_pool
        for key, queue in queues.items():
            if class_pool[key] is pool:
                self.queues.push(key, rate * queue[0].submitted_at - base, uid, seat.version, self.valid)

    def rekey_seats(self, seats: Iterable[Seat]) -> None:
        for seat in seats:
            for pool in self._pools.values():
                if pool.seats.get(seat.user.id) is seat:
                    self.rekey(pool, seat)
                    break

    def rekey_heavy(self) -> None:
        """A heavy seat's key is measured from V: push it again when V or the credit moved."""
        for pool in self._pools.values():
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
                    self.rekey(pool, seat)

    def park(self, user_id: Hashable) -> None:
        """Pass over ``user_id``'s queued jobs until ``unpark`` (``max_slot_share``)."""
        self.parked.add(user_id)

    def unpark(self) -> None:
        """Queue the parked users' heads again, where their priorities put them."""
        if not self.parked:
            return
        users = list(self.parked)
        self.parked.clear()
        for uid in users:
            for pool in self._pools.values():
                seat = pool.seats.get(uid)
                if seat is not None and seat.queued:
                    self.rekey(pool, seat)

    def rank(self, key: ClassKey, entry: Entry) -> tuple[float, int]:
        """Where a queue head stands among all heads: lowest is served first."""
        return entry[0] + self._class_pool[key].reference(), entry[1]

    def valid(self, entry: Entry, key: ClassKey) -> bool:
        seat = self._class_pool[key].seats.get(entry[2])
        return (
            seat is not None
            and seat.version == entry[3]
            and self.queues.has_queue(entry[2], key)
            and entry[2] not in self.parked
        )

    # -- heads -------------------------------------------------------------

    def best(self, blocked: Container[ClassKey], is_open: Callable[[ClassKey], bool]) -> tuple[ClassKey, Job] | None:
        """The best head of a class not ``blocked`` that ``is_open``, if any."""
        self.rekey_heavy()
        best: tuple[float, int] | None = None
        best_entry: Entry | None = None
        best_key: ClassKey | None = None
        for key in self.queues.live_classes():
            if key in blocked or not is_open(key):
                continue
            entry = self.queues.top(key, self.valid)
            if entry is None:
                continue
            rank = self.rank(key, entry)
            if best is None or rank < best:
                best, best_entry, best_key = rank, entry, key
        if best_entry is None or best_key is None:
            return None
        return best_key, self.queues.head(best_entry[2], best_key)

    def first_behind(self, rank: float, classes: Iterable[ClassKey]) -> tuple[ClassKey, Job] | None:
        """The best head of ``classes``, when every head there ranks after ``rank``; None when one does not,
        or none is queued."""
        first: tuple[float, ClassKey, Entry] | None = None
        for key in classes:
            if not self.queues.counts.get(key):
                continue
            entry = self.queues.top(key, self.valid)
            if entry is None:
                continue
            theirs = self.rank(key, entry)[0]
            if theirs <= rank:
                return None
            if first is None or theirs < first[0]:
                first = (theirs, key, entry)
        if first is None:
            return None
        _, key, entry = first
        return key, self.queues.head(entry[2], key)
