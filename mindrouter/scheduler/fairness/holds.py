"""Anticipation: a slot held briefly for a user about to send again (BFQ's device idling).

Dispatch is work-conserving, so a closed-loop client that thinks 50 ms between
requests has nothing queued for those 50 ms each time one ends, and the slot it
freed goes at once to whoever is queued, though the client is owed more: a
user with 6 s requests queued ends up holding the slot for good
(``think-time``: 88% of the service against a target of 61%). Linux's BFQ I/O
scheduler meets the same pattern by idling the device for a process whose
think time is short (``slice_idle``; anticipatory scheduling, Iyer and
Druschel, SOSP 2001). Here, when a job ends and its seat has nothing queued in
its pool, a learned think time shorter than ``anticipation``, and a better
priority than every queued job that could take the slot, the core holds that
slot for it for at most ``anticipation`` seconds.

A person who reads each answer for a few seconds (a learned think time under
``max_think_time``) gets the same hold, for up to twice its think time, when it
is owed more and whoever would take the slot already runs its weighted share of
that backend's slots (``Turns.over_share``): otherwise the backlogged user takes
every slot a short answer frees, and on a 2-slot workstation a chat user waited
a 72 s batch answer for each 2.4 s one (issue 30: 2.6% of the service against a
target of 47%). Work conservation yields only where the backlogged user already
has its share, so a thinker never takes more than it is owed. A person whose
think time is not known yet (its first answer) is kept the slot for up to
``max_think_time``: on 4 slots chat's second question waited a 72 s answer
(67 s), 2.8 points of its share over 30 minutes; a one-shot user idles a slot
once, at the batch user's surplus only, and pays ``hold_price`` for it.

Invariants: a hold is ended once, by ``release``: when its seat submits again,
when it expires, or when its backend is disabled or removed; every ``Hold``
that ends is returned to the caller, which gives its slot back to routing
(``Router.unhold``), where a held slot counts in the backend's ``in_flight``,
``model_in_flight`` and ``held`` so every rule treats it as taken. A holder is
charged for the time held only here (``hold_price``), and never for a hold
whose backend went away.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from ..pooling import PoolKey
from ..settings import SchedulerSettings
from .pools import Pool, Seat

__all__ = ["Hold", "Holds"]


@dataclass(frozen=True, slots=True)
class Hold:
    pool: Pool
    seat: Seat
    backend_id: Hashable
    model: str
    start: float
    until: float
    rate: float
    """Service units a second the slot would have delivered to the job it keeps waiting: the hold's price."""
    kept: bool = False
    """Kept for its holder's next job, which takes it when it comes, whoever ranks first then (``length``)."""

    def ended(self, now: float | None) -> float:
        """When a hold given back at ``now`` (None: its backend went away) ended."""
        return self.until if now is None else min(now, self.until)


class Holds:
    """The slots held now: per seat, keyed by (user id, pool), one for each of its jobs that ended, oldest first."""

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings
        self.anticipation = settings.anticipation
        self.max_think = settings.max_think_time
        self._longest_gap = 2 * max(self.anticipation, self.max_think)
        self.held: dict[tuple[Hashable, PoolKey], list[Hold]] = {}

    def submitted(self, seat: Seat, pool: PoolKey, now: float, *, learn: bool) -> Hold | None:
        """A job of ``seat`` was queued: its oldest hold ends, so the job may take that slot; returns it if one did.

        With ``learn`` (the job is new, not one queued again after a failure), the gap since the
        oldest end of its jobs not yet answered by a submission teaches its think time: 4 loops that
        each think 0.2 s were learned as thinking 0.02 s, from whichever loop ended last, and lost
        the slot each loop freed. A gap counts as at most twice ``max_think_time`` (or
        ``anticipation``, if more), so one long break costs a tight loop its anticipation for a
        dozen requests, not for hundreds, and a person who always reads longer than the bound
        learns a think time past it.
        """
        if learn and seat.ends and self._longest_gap:
            gap = min(now - seat.ends.popleft(), self._longest_gap)
            alpha = self.settings.think_ema_alpha
            seat.think = gap if seat.think is None else seat.think + alpha * (gap - seat.think)
        if not seat.queued:
            seat.ended = None
        key = (seat.user.id, pool)
        holds = self.held.get(key)
        if not holds:
            return None
        hold = holds.pop(0)
        self.release(hold, now)
        if not holds:
            del self.held[key]
        return hold

    def within(self, seat: Seat, now: float) -> bool:
        """Whether ``seat`` sends again within ``anticipation`` of its last job's end (``Pool.place``)."""
        return seat.ended is not None and now - seat.ended <= self.anticipation

    def length(self, seat: Seat) -> tuple[float, bool] | None:
        """How long a slot ``seat``'s job freed may be held for it, and whether only where the one who would
        take it has its share of the backend's slots (a think time past ``anticipation``); None: not at all.

        Such a slot is kept for the seat's next job: it would otherwise go to the one it was kept from
        whenever that one ranks first by lag, which a batch user charged ahead for a long answer does
        for the minute it runs. Before the seat's think time is known it is kept for ``max_think_time``
        (the module docstring says why)."""
        think = seat.think
        if think is None:
            return (self.max_think, True) if self.max_think > 0 else None
        if think < self.anticipation:
            return self.anticipation, False
        if think < self.max_think:
            return min(self.max_think, 2 * think), True
        return None

    def over_share(
        self, pool: Pool, holder: Seat, rival: Seat, slots: int, running: int, demand: int, now: float
    ) -> bool:
        """Whether ``rival``, running ``running`` of a backend's ``slots``, has its share of them: its weighted
        share (at least one) among the people active in ``pool`` (those with work queued or running, and those
        thinking within ``max_think_time`` of their last job's end, ``holder`` among them), or more where the
        holder's reading leaves it using only ``demand`` of them (weighted max-min with the holder's demand).

        By weight alone a weight-10 admin's 8 loops reading 2 s between 1.2 s requests kept 7 of 8 slots for
        themselves and used 3: the GPU was 63% busy and a backlogged student got 25.9% against 33.1%.
        """
        if running < max(1, slots - demand):
            return False
        if running >= math.ceil(slots * rival.weight / (rival.weight + holder.weight) - 1e-9):
            return True  # its share beside the holder alone, the most it can be: no need to count the others
        bound = self.max_think
        total = 0.0
        for seat in pool.seats.values():
            if (
                seat.queued
                or seat.running
                or seat is holder
                or (seat.ended is not None and now - seat.ended < bound and (seat.think or bound) < bound)
            ):
                total += seat.weight
        return running >= max(1.0, math.ceil(slots * rival.weight / total - 1e-9))

    def demand(self, seat: Seat, busy: float, now: float) -> int:
        """Slots ``seat`` uses while it reads: its requests in flight (running, queued, or ended within twice
        its think time and not yet answered by a request) times the part of its time they run (``busy``
        seconds each, then its think time), at least one."""
        think = seat.think or 0.0
        if busy + think <= 0:
            return 1
        since = now - 2 * think
        loops = seat.running + seat.queued + sum(1 for end in seat.ends if end >= since)
        return max(1, math.ceil(loops * busy / (busy + think) - 1e-9))

    def take(
        self,
        pool: Pool,
        seat: Seat,
        backend_id: Hashable,
        model: str,
        now: float,
        rate: float,
        length: tuple[float, bool],
    ) -> None:
        """Hold one slot of ``backend_id`` for ``seat`` for ``length`` (``Holds.length``), at ``rate`` a second."""
        seconds, kept = length
        hold = Hold(pool, seat, backend_id, model, now, now + seconds, rate, kept)
        self.held.setdefault((seat.user.id, pool.key), []).append(hold)

    def release(self, hold: Hold, now: float | None) -> None:
        """End a hold, and charge its holder for the time held: the one place that does.

        Idling is not free (BFQ charges an idled queue for the time it kept the device): the holder
        pays ``hold_price`` of what the slot would have delivered meanwhile to the job it kept
        waiting. ``now`` None: the backend went away, and the slot with it.
        """
        held = 0.0 if now is None else hold.ended(now) - hold.start
        if held > 0 and hold.rate > 0:
            hold.pool.charge(hold.seat, self.settings.hold_price * held * hold.rate)

    def _end(self, ends: Callable[[Hold], bool], now: float | None) -> list[Hold]:
        ended = []
        for key in [k for k, holds in self.held.items() if any(map(ends, holds))]:
            keep = []
            for hold in self.held.pop(key):
                if ends(hold):
                    self.release(hold, now)
                    ended.append(hold)
                else:
                    keep.append(hold)
            if keep:
                self.held[key] = keep
        return ended

    def expire(self, now: float) -> list[Hold]:
        """End the holds past their time; return them (their holders were charged)."""
        return self._end(lambda hold: hold.until <= now, now) if self.held else []

    def backend_closed(self, backend_id: Hashable) -> list[Hold]:
        """``backend_id`` was disabled or removed: its holds end now, free of charge; returns them."""
        return self._end(lambda hold: hold.backend_id == backend_id, None)

    def next_deadline(self) -> float | None:
        return min((holds[0].until for holds in self.held.values()), default=None)

    def per_backend(self) -> dict[Hashable, int]:
        """Slots held now, per backend (what routing's ``held`` must count)."""
        counts: dict[Hashable, int] = {}
        for hold in (hold for holds in self.held.values() for hold in holds):
            counts[hold.backend_id] = counts.get(hold.backend_id, 0) + 1
        return counts
