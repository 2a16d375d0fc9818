"""Pools of contention: where users compete, and each user's standing in each.

A *pool* is a group of backends joined by the models they serve (two backends
serving one model are joined, transitively, ``joined``); every job class's
candidate backends lie in one pool, and classes whose candidates overlap share
it. In a pool a person has one seat, whichever models it asks for, so when a
slot frees the most-owed person with a job that backend can serve is served:
weighted max-min fairness under the candidates' constraints. Pools that share
no backend never compete, so service a user got on a model nobody else could
run is never held against it on another model: every pool keeps its own
reference, its own positions and its own recent usage.

Invariants (``Pool.check()`` asserts them in tests):

- A seat's ``lag`` is its effective deficit: cost owed per unit of weight.
  Charging cost ``c`` lowers it by ``c / weight`` at the weight of the moment
  the service is produced, so a weight change alters only how fast it moves
  from then on, and the price of what was charged ahead for service still to
  come (``unproduced``), never what it was charged for service received.
- ``reference()`` (V) is the highest lag among seats with queued jobs, except
  that it never rises (seats placed above it leave it where it was). Priorities
  are measured from V.
- A seat is never raised: service received is never erased (VTC's rule),
  except that a seat returning from idle may have its debt bounded by
  ``return_debt``, an explicit setting that is unset by default.
- A seat that starts queuing is lowered only by credit banked while it had
  nothing queued: from idle it stands at most one typical request above V; with
  jobs running, at most where it stood from V when its queue emptied; sending
  within ``anticipation`` of its last job's end, where that end placed it.
- A charge takes a queued seat's settled lag (``lag`` without ``inflight``) at most
  ``debt_bound`` of the pool's largest charges (per unit of weight) behind V, and
  never moves a seat already further behind: people in one pool who never meet
  on a backend drift apart, and this bounds what one pays back when they meet.
- Lags leave their place in only three ways besides charges: that placement,
  that re-pricing, and a shift of every seat of the pool by the same amount
  when V drifts far below zero (order and shares unchanged).
- The deprioritization factor only ever lowers a heavy seat's priority.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from ..pooling import PoolKey
from ..settings import SchedulerSettings
from .priority import apply_factor, heavy_factor

__all__ = ["Pool", "Seat", "UserState"]


@dataclass(slots=True)
class UserState:
    """One account: what the admin set, and what the core learned about its requests."""

    id: Hashable
    name: str
    group: str | None
    weight: float
    """The user's own weight: its override, else its group's weight."""
    override: float | None = None
    """The user's ``weight_override``, if any (its weight inside its group in group shares)."""
    completion_ema: float | None = None
    """Moving average of this user's completion tokens: the estimate for the next job."""
    queued: int = 0
    running: int = 0
    served: float = 0.0
    """Total cost completed in all pools, never shifted (for reports)."""


@dataclass(slots=True)
class Seat:
    """A user's standing in one pool."""

    user: UserState
    lag: float
    """Cost owed per unit of weight (higher = more owed); compare only within the pool."""
    weight: float
    """The weight this pool uses now (the user's, or its part of its group's share)."""
    queued: int = 0
    running: int = 0
    inflight: float = 0.0
    """Cost charged so far for this seat's running jobs (part of ``lag``)."""
    unproduced: float = 0.0
    """The part of ``inflight`` beyond the jobs' prompts and streamed tokens: service still to come."""
    left: float = 0.0
    """``lag - V`` when its queue last emptied: what it may keep while its jobs run (``Pool.place``)."""
    recent: float = 0.0
    """Service units completed here within the fairness window."""
    recent_per_weight: float = 0.0
    """The same, each over the weight of its time: what decides who is heavy (``usage_fraction``)."""
    recent_tokens: float = 0.0
    """Tokens (prompt and completion) completed here within the fairness window, for display."""
    factor: float = 1.0
    served: float = 0.0
    version: int = 0
    """Bumped whenever the seat's priority changes; stale heap entries carry an older one."""
    ended: float | None = None
    """When its last job here ended, until its next submission: the start of a think time (``holds.py``)."""
    ends: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    """When its jobs here ended, oldest first, each until a submission answers it: a client running 4 loops
    thinks from each loop's end to that loop's next request, not from the last end to the next request."""
    think: float | None = None
    """Its think time here, learned: a moving average of the gaps from a job's end to the submission that
    answers it (the oldest end not yet answered)."""
    kept: float = 0.0
    """The lag ``place`` would have given it when its last job here ended (with nothing queued)."""


@dataclass(slots=True)
class Pool:
    """Fair-share state of one pool of contention. Pure: methods that depend on time take ``now``."""

    key: PoolKey
    settings: SchedulerSettings
    seats: dict[Hashable, Seat] = field(default_factory=dict)
    typical: float = 0.0
    """Typical request cost here: a moving average of completed requests, each clipped."""
    answer: float = 0.0
    """Typical answer here, in completion tokens: the same moving average of completed answers."""
    _answer_tokens: float = 0.0
    _answer_squares: float = 0.0
    """Moving averages of completed answers and of their squares (``slot_answer``), each clipped."""
    recent_total: float = 0.0
    heavy: set[Hashable] = field(default_factory=set)
    shifts: int = 0
    largest: float = 0.0
    """The largest single charge made here: the unit of the bound on how far a seat stands behind V."""
    _ref_heap: list[tuple[float, int, Hashable, int]] = field(default_factory=list)
    _seq: int = 0
    _reference: float = 0.0
    _window: deque[tuple[float, Hashable, float, float, float]] = field(default_factory=deque)
    """(at, user id, tokens, service units, units per weight) of each completed request within the fairness window."""
    windowed: dict[Hashable, int] = field(default_factory=dict)
    """User id -> its requests in ``_window``: who used the pool in the window, without a walk over every seat."""
    _next_refresh: float = 0.0
    _per_weight_total: float = 0.0

    def __post_init__(self) -> None:
        if not self.typical:
            self.typical = self.settings.cost(0, self.settings.default_completion_tokens)
        if not self.answer:
            self.answer = float(self.settings.default_completion_tokens)
        if not self._answer_tokens:
            self._answer_tokens = self.answer
            self._answer_squares = self.answer * self.answer

    @property
    def slot_answer(self) -> float:
        """The answer a slot here is typically busy with, in tokens: the mean weighted by length.

        Many 10-token answers hold the slots little of the time: answers-jump's slot answer is
        270 tokens where the plain average (``answer``) says 30.
        """
        return self._answer_squares / self._answer_tokens

    # -- seats and the reference V -----------------------------------------

    def touch(self, seat: Seat) -> None:
        """Record that ``seat``'s priority changed (the caller re-keys its queue heads)."""
        seat.version += 1
        if seat.queued:
            self._seq += 1
            heapq.heappush(self._ref_heap, (-seat.lag, self._seq, seat.user.id, seat.version))
            if len(self._ref_heap) > 64 and len(self._ref_heap) > 4 * len(self.seats):
                self._ref_heap = [(-s.lag, i, u, s.version) for i, (u, s) in enumerate(self.seats.items()) if s.queued]
                heapq.heapify(self._ref_heap)

    def reference(self) -> float:
        """V: the highest lag among seats with queued jobs, never raised by seats placed above it.

        Like CFS's ``min_vruntime``, V only moves in the direction service moves it
        (down), so users entering together are each placed one credit above the
        same V instead of each above the last. With nothing queued it stays put.
        """
        heap = self._ref_heap
        seats = self.seats
        while heap:
            neg, _, uid, version = heap[0]
            seat = seats.get(uid)
            if seat is not None and seat.version == version and seat.queued:
                if -neg < self._reference:
                    self._reference = -neg
                return self._reference
            heapq.heappop(heap)
        return self._reference

    def credit(self) -> float:
        """How far, in cost, a seat entering contention may stand from V: one typical request."""
        fixed = self.settings.return_credit
        return self.typical if fixed is None else fixed

    def place(self, seat: Seat, new: bool, *, as_ended: bool = False) -> None:
        """``seat``'s queue here was empty and a job joins it: keep what it was owed, bank no more.

        A seat is never raised: what it was charged, running jobs included, stays
        charged (VTC's rule), unless the explicit ``return_debt`` bounds the debt
        of a seat with nothing running. It is lowered only by credit it banked
        while it had nothing queued, when others were served and it asked for
        nothing more: an idle seat keeps at most one credit above V (VTC's lift);
        a seat with jobs running keeps where it stood when its queue emptied (or
        one credit, if more), so a user who keeps 4 streams on 4 slots keeps what
        it is owed, and one who kept a few running below its share cannot then
        take every slot. A new seat starts one credit above V.

        With ``as_ended`` (it sends again within ``anticipation`` of its last job's end), it is
        placed as it would have been at that end: a closed-loop client that thinks for a moment
        counts as waiting all along (BFQ's idling window), so service others got meanwhile is not
        erased from what it is owed; it gains nothing it would not get by sending at once.
        """
        seat.lag = min(seat.lag, seat.kept) if as_ended and not new else self.returning(seat, new)

    def returning(self, seat: Seat, new: bool = False) -> float:
        """The lag ``place`` gives ``seat`` if a job of its joins its empty queue now."""
        ref = self.reference()
        room = self.credit() / seat.weight
        if new:
            return ref + room
        if seat.running:
            return min(ref + max(seat.left, room), seat.lag)
        lag = min(ref + room, seat.lag)
        debt = self.settings.return_debt
        return lag if debt is None else max(ref - debt / seat.weight, lag)

    def queue_emptied(self, seat: Seat) -> None:
        """``seat`` has nothing queued here any more: remember where it stands from V."""
        seat.left = seat.lag - self.reference()

    def priority(self, seat: Seat, reference: float, lag: float | None = None) -> float:
        """Priority of a queued ``seat`` measured from ``reference``, without the wait bonus.

        A plain seat stands at ``lag - V``. A heavy seat is measured from one credit
        above V, where a newcomer stands, and that distance (negative) is divided by
        its factor, as the seed's formula does below zero; the handicap this adds is
        capped at one credit. So deprioritization always acts (a factor below 1
        moves the heavy seat back) and never starves: it stands at most one credit
        further back than its lag puts it, so it waits at most one more request
        per competing seat than fair share alone makes it wait.
        """
        base = (seat.lag if lag is None else lag) - reference
        if seat.factor == 1.0:
            return base
        room = self.credit() / seat.weight
        return max(room + apply_factor(base - room, seat.factor), base - room)

    def charge(self, seat: Seat, cost: float) -> None:
        """Move ``seat`` by ``cost`` (negative: a refund) at its current weight.

        A charge takes a queued seat's settled lag (its lag without what its running
        jobs were charged ahead) at most two of the pool's largest requests (per unit
        of its weight) behind V, or leaves it where it stood if already further
        behind: that is VTC's bound between people who compete, so it never binds
        between them, and it bounds what a person pays back for service on backends
        that nobody it meets later could have used (one standing per person spans
        the whole pool, where lags of people who never meet drift apart).
        """
        if cost > self.largest:
            self.largest = cost
        lag = seat.lag - cost / seat.weight
        if cost > 0 and seat.queued:
            held = seat.inflight / seat.weight  # charged ahead for jobs still running: not yet a debt
            floor = self.reference() - self.settings.debt_bound * self.largest / seat.weight - held
            lag = max(lag, min(seat.lag, floor))
        seat.lag = lag
        self.touch(seat)

    def maybe_shift(self) -> bool:
        """Shift every seat up together once V drifts far below zero."""
        ref = self.reference()
        if ref > -self.settings.deficit_shift_threshold:
            return False
        for seat in self.seats.values():
            seat.lag -= ref
            seat.version += 1
        self._reference -= ref
        self._ref_heap = [(-s.lag, i, u, s.version) for i, (u, s) in enumerate(self.seats.items()) if s.queued]
        heapq.heapify(self._ref_heap)
        self.shifts += 1
        return True

    # -- usage -------------------------------------------------------------

    def completed(self, seat: Seat, cost: float, prompt: float, completion: float, now: float) -> None:
        """A request here ended having cost ``cost``: count it as usage, in the typical cost and answer."""
        seat.served += cost
        alpha, clip = self.settings.typical_ema_alpha, self.settings.typical_clip
        if cost > 0:
            self.typical += alpha * (min(cost, clip * self.typical) - self.typical)
        if completion > 0:
            self.answer += alpha * (min(completion, clip * self.answer) - self.answer)
            clipped = min(completion, clip * self.slot_answer)
            self._answer_tokens += alpha * (clipped - self._answer_tokens)
            self._answer_squares += alpha * (clipped * clipped - self._answer_squares)
        self.add_usage(seat, prompt + completion, cost, now)

    def add_usage(self, seat: Seat, tokens: float, units: float, at: float) -> None:
        if tokens > 0:
            per_weight = units / seat.weight
            uid = seat.user.id
            self._window.append((at, uid, tokens, units, per_weight))
            self.windowed[uid] = self.windowed.get(uid, 0) + 1
            seat.recent += units
            seat.recent_per_weight += per_weight
            seat.recent_tokens += tokens
            self.recent_total += units

    def usage_fraction(self, seat: Seat) -> float:
        """Recent service units per unit of weight, as a part of that sum over the seats active in the window.

        With equal weights this is the seed's ``user_recent_tokens / global_recent_tokens``;
        a weight-10 user using its 91% next to a weight-1 user stands at 0.5. Each request counts
        at the weight of its time, so a group whose weight fell from 3 to 1 is not heavy for what
        it used at 3. The sum is the one of the last refresh (``heavy_refresh_interval``).
        """
        if seat.recent_per_weight <= 0 or self._per_weight_total <= 0:
            return 0.0
        return min(1.0, seat.recent_per_weight / self._per_weight_total)

    def refresh(self, now: float) -> list[Seat]:
        """Expire old usage and, at most once per ``heavy_refresh_interval``, re-rate heavy seats.

        Returns the seats whose factor changed (the caller re-keys them).
        """
        window = self._window
        horizon = now - self.settings.fairness_window
        seats = self.seats
        while window and window[0][0] < horizon:
            _, uid, tokens, units, weighed = window.popleft()
            self.recent_total -= units
            left = self.windowed[uid] - 1
            if left:
                self.windowed[uid] = left
            else:
                del self.windowed[uid]
            seat = seats.get(uid)
            if seat is not None:
                seat.recent -= units
                seat.recent_tokens -= tokens
                seat.recent_per_weight -= weighed
                if not left or seat.recent < 1e-6:  # its last request here left the window
                    seat.recent = seat.recent_tokens = seat.recent_per_weight = 0.0
        if not window:
            self.recent_total = 0.0
        if now < self._next_refresh:
            return []
        self._next_refresh = now + self.settings.heavy_refresh_interval
        settings = self.settings
        per_weight = {uid: s.recent_per_weight for uid, s in seats.items() if s.recent > 0}
        total = self._per_weight_total = sum(per_weight.values())
        factors: dict[Hashable, float] = {}
        # Heavy means heavy next to others: a seat alone in the window is using an idle pool.
        # And heavy beyond noise: fair share itself lets a seat run up to two requests ahead.
        slack = settings.heavy_slack * self.credit()
        if len(per_weight) > 1:
            for uid, used in per_weight.items():
                if used - settings.deprioritize_threshold * total > slack:
                    factors[uid] = heavy_factor(
                        used / total, settings.deprioritize_threshold, settings.min_deprioritization
                    )
        changed = []
        for uid in set(factors) | self.heavy:
            seat = seats.get(uid)
            factor = factors.get(uid, 1.0)
            if seat is not None and seat.factor != factor:
                seat.factor = factor
                self.touch(seat)
                changed.append(seat)
        self.heavy = set(factors)
        return changed

    def check(self) -> None:
        """Assert the invariants (for tests)."""
        counts: dict[Hashable, int] = {}
        for entry in self._window:
            counts[entry[1]] = counts.get(entry[1], 0) + 1
        assert counts == self.windowed, (counts, self.windowed)
        for seat in self.seats.values():
            assert seat.weight > 0, seat
            assert seat.queued >= 0 and seat.running >= 0, seat
            assert 0 < seat.factor <= 1.0, seat
            assert -1e-6 <= seat.unproduced <= seat.inflight + 1e-6, seat
        assert len(self.heavy) <= 1 or self.settings.deprioritize_threshold < 0.5
