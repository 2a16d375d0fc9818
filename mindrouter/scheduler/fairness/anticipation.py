"""Whether the slot a finished job freed waits for its seat, against whom, and at what price.

``holds.py`` keeps the held slots and says how long one may last; this is where fairness decides a hold
with what it knows of seats and queues: the facade asks, after each end (``Scheduler._anticipate``), how
long the seat may hold (``hold_length``), whose queued job it would keep waiting (``rival``), whether that
one already has its share of the backend (``over_share``), and then takes the hold (``hold``). Every hold
that ends is returned, so routing gets its slot back.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable

from ..jobs import ClassKey, Job, class_key
from .fairshare import FairShare
from .holds import Hold, Holds
from .ledger import Charge
from .order import Order

__all__ = ["Anticipation"]


class Anticipation:
    """Holds as fairness decides them, over ``Turns``' parts (its holds, seats and queue order). Pure."""

    def __init__(self, holds: Holds, fair: FairShare, order: Order, wait_rate: float) -> None:
        self.holds = holds
        self.fair = fair
        self.order = order
        self._wait_rate = wait_rate

    def hold_length(self, charge: Charge) -> tuple[float, bool] | None:
        """How long the slot ``charge``'s job freed may wait for its seat (nothing queued, a brief think time),
        and whether only where the one who would take it has its share of the slots (``Holds.length``)."""
        return None if charge.seat.queued else self.holds.length(charge.seat)

    def over_share(self, charge: Charge, rival: Job, slots: int, running: int, now: float) -> bool:
        """Whether ``rival``'s user, running ``running`` of a backend's ``slots``, has its share of them next
        to ``charge``'s seat (``Holds.over_share``)."""
        pool = self.order.pools[class_key(rival)]
        theirs = pool.seats.get(rival.user_id)
        if theirs is None:
            return False
        seat = charge.seat
        demand = self.holds.demand(seat, now - charge.started, now)
        return self.holds.over_share(pool, seat, theirs, slots, running, demand, now)

    def rival(
        self, charge: Charge, classes: Iterable[ClassKey], now: float, *, shared: bool
    ) -> tuple[ClassKey, Job] | None:
        """The queued job (with its class) a hold of the slot ``charge``'s job freed would keep waiting: the
        first of ``classes`` (those that slot serves). None when someone queued there is owed more than the
        seat is, placed as it would be if it sent now, or nobody queued could take the slot.

        With ``shared`` (a hold only while the rival has its share of the slots), owed is measured by the
        service each completed within the fairness window, per unit of weight: by lag, a batch user charged a
        72 s answer at its start stood owed more for the minute it ran, and the reader returning after 3 s
        was placed one credit from it, so the slot went to the batch user every other answer.
        """
        pool, seat = charge.pool, charge.seat
        mine = self._wait_rate * now - pool.priority(seat, pool.reference(), seat.kept)
        first = self.order.first_behind(-math.inf if shared else mine, classes)
        if first is None:  # someone there is owed more, or nobody could take it: the slot stays free
            return None
        if shared and pool.seats[first[1].user_id].recent_per_weight <= seat.recent_per_weight:
            return None
        return first

    def hold(
        self,
        charge: Charge,
        backend_id: Hashable,
        now: float,
        rival: Job,
        answer: float,
        busy: float,
        length: tuple[float, bool],
    ) -> None:
        """Hold the slot ``charge``'s job freed on ``backend_id`` for its seat for ``length`` (``Holds.length``),
        priced at what it would have delivered to ``rival`` (``answer`` tokens in ``busy`` seconds there)."""
        rate = self.fair.prices.cost(rival.model, rival.prompt_tokens, answer) / busy if busy > 0 else 0.0
        self.holds.take(charge.pool, charge.seat, backend_id, charge.job.model, now, rate, length)

    def expire_holds(self, now: float) -> list[Hold]:
        """End the holds past their time; their holders, charged for them, are queued at their new place."""
        ended = self.holds.expire(now)
        for hold in ended:
            self.order.rekey(hold.pool, hold.seat)
        return ended

    def drop_holds(self, backend_id: Hashable) -> list[Hold]:
        """``backend_id`` closed or went away: its holds end, free of charge."""
        return self.holds.backend_closed(backend_id)

    def next_hold_deadline(self) -> float | None:
        return self.holds.next_deadline()

    def held_per_backend(self) -> dict[Hashable, int]:
        return self.holds.per_backend()
