"""What running jobs have been charged: service is charged as it is produced, a little ahead.

A job is charged its prompt and a provisional answer when it starts
(``FairShare.provisional_answer``). While it streams, the answer charged is
``max(streamed, min(total, streamed + ahead))``: it runs ``ahead`` of what the
stream has produced (one of the pool's typical answers while the user's answers
are unknown, and the total unbounded; two slot answers once known), but never
past the answer's expected total unless it outlives it. So a user taking
several slots at once moves by each of them, and a long answer is charged as it
is produced rather than all at once. A job that does not stream is charged its
whole expected answer at once, capped by ``max_tokens`` as a stream's total is,
and reports nothing before its end; so the clock stands in for its progress:
at each decision (``tick``) it is charged as a stream that had produced
``rate x elapsed`` tokens would be, up to ``max_tokens``, where ``rate`` is what
one stream of that (backend, model) was seen to get (``ModelSpeed.observed``; no
such rate, no clock). Charged only at its end, b's first 4,000-token whole
answers after 10-token ones were charged as the short ones and b held the slots
for a minute (answers-jump unstreamed: gap 54,780 of 16,400). What was charged
beyond the prompt and what was produced (``unproduced``) is service still to
come, priced again if the seat's weight changes. At the end the charge is
settled against the backend's own counts: the difference is charged or
refunded at the seat's weight of that moment.

Invariants: a seat's ``inflight`` is the sum of ``charged`` over its running jobs' charges; a charge is
settled once, and the clock skips a settled one (its entries go lazily).
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from ..jobs import Job
from .fairshare import FairShare
from .pools import Pool, Seat

__all__ = ["Charge", "Ledger"]


@dataclass(slots=True)
class Charge:
    """What one running job has been charged, and what it is expected to cost (``Ledger`` moves it)."""

    job: Job
    pool: Pool
    seat: Seat
    total: float
    """The answer's expected length in completion tokens (infinite while unknown)."""
    ahead: float
    """How far ahead of what it has produced the answer is charged, once past ``total`` for a whole answer."""
    started: float = 0.0
    rate: float = 0.0
    """Completion tokens per second the clock charges a whole answer by (0: no rate known, no clock)."""
    clocked: float = 0.0
    """Completion tokens a whole answer is taken to have produced by the clock, at most ``max_tokens``."""
    charged: float = 0.0
    """Cost charged so far."""
    answer: float = 0.0
    """Completion tokens charged so far."""
    streamed: int = 0
    """Completion tokens reported so far."""
    unproduced: float = 0.0
    """Cost charged beyond what it has produced (its prompt and what streamed): its part of ``Seat.unproduced``."""
    settled: bool = False
    """The job ended and the charge was settled: nothing moves it any more."""

    def answer_due(self) -> float:
        """Completion tokens to have charged now, given what has streamed or the clock says was produced.

        A stream that outlives its expected total shows the estimate wrong: from then on it is
        charged as one of unknown length is, ``ahead`` of what it has produced up to ``max_tokens``.
        Held to the estimate, a user whose answers jump from 10 to 4,000 tokens was charged only
        what streamed and took 6 of 8 slots at once (answers-jump, gap 25,540 of 16,400). A whole
        answer with no rate to clock it by is charged its whole total at once.
        """
        produced = max(self.streamed, self.clocked)
        total = self.total
        if produced > total:
            limit = self.job.max_tokens
            total = math.inf if limit is None else float(limit)
        due = max(produced, min(total, produced + self.ahead))
        return due if self.job.stream or self.rate > 0 else max(due, self.total)

    def next_tick(self) -> float | None:
        """When the clock next moves a whole answer's charge: once it has used half of what is charged ahead.

        Held at its total, the charge moves once the clock passes the total; never at once (a token on).
        """
        if self.job.stream or self.rate <= 0:
            return None
        limit = self.job.max_tokens
        if limit is not None and self.answer >= limit:
            return None
        tokens = self.answer - self.ahead / 2
        if tokens <= self.clocked:
            tokens = self.answer
        return self.started + max(tokens, self.clocked + 1.0) / self.rate


class Ledger:
    """Charges running jobs as their service is produced, and settles each when it ends."""

    def __init__(self, fair: FairShare) -> None:
        self.fair = fair
        self.settings = fair.settings
        self._clock: list[tuple[float, int, Charge]] = []
        """Whole answers by when the clock next moves their charge (entries of ended jobs go lazily)."""
        self._seq = itertools.count()

    def prepare(self, job: Job, pool: Pool, seat: Seat, now: float, rate: float | None) -> Charge:
        """What ``job`` will be charged as it starts; changes nothing, so a failure here leaves no trace.

        ``rate``: completion tokens per second one stream of its (backend, model) was seen to get.
        """
        total, ahead = self.fair.provisional_answer(seat.user, pool, job)
        charge = Charge(job, pool, seat, total, ahead, now, rate or 0.0)
        charge.answer = charge.answer_due()
        charge.charged = self.fair.prices.cost(job.model, job.prompt_tokens, charge.answer)
        return charge

    def start(self, charge: Charge) -> None:
        seat, pool, cost = charge.seat, charge.pool, charge.charged
        seat.running += 1
        seat.user.running += 1
        seat.inflight += cost
        pool.charge(seat, cost)
        self._produced(charge)
        self._wind(charge)

    def _wind(self, charge: Charge) -> None:
        at = charge.next_tick()
        if at is not None:
            heapq.heappush(self._clock, (at, next(self._seq), charge))

    def tick(self, now: float) -> list[Charge]:
        """Charge the whole answers whose clock has run past what they were charged; returns them."""
        clock, moved = self._clock, []
        while clock and clock[0][0] <= now:
            charge = heapq.heappop(clock)[2]
            if charge.settled:
                continue
            produced = charge.rate * (now - charge.started)
            limit = charge.job.max_tokens
            charge.clocked = produced if limit is None else min(produced, float(limit))
            if self._recharge(charge):
                moved.append(charge)
            self._wind(charge)
        return moved

    def _produced(self, charge: Charge) -> None:
        """Keep the seat's cost charged ahead of production in step with the job's."""
        produced = max(charge.streamed, charge.clocked)
        job = charge.job
        unproduced = charge.charged - self.fair.prices.cost(job.model, job.prompt_tokens, produced)
        charge.seat.unproduced += unproduced - charge.unproduced
        charge.unproduced = unproduced

    def progress(self, charge: Charge, completion_tokens: int) -> bool:
        """Charge what streamed beyond what was charged; True if the seat moved."""
        charge.streamed = max(charge.streamed, completion_tokens)
        return self._recharge(charge)

    def _recharge(self, charge: Charge) -> bool:
        """Charge what is due beyond what was charged; True if the seat moved."""
        answer = charge.answer_due()
        if answer <= charge.answer:
            self._produced(charge)
            return False
        target = self.fair.prices.cost(charge.job.model, charge.job.prompt_tokens, answer)
        more = target - charge.charged
        charge.answer, charge.charged = answer, target
        charge.seat.inflight += more
        charge.pool.charge(charge.seat, more)
        self._produced(charge)
        return True

    def settle(self, charge: Charge, now: float, prompt: float, completion: float, learned: int | None) -> None:
        """The job ended having really cost ``cost(prompt, completion)``: charge or refund the difference."""
        charge.settled = True
        pool, seat = charge.pool, charge.seat
        user = seat.user
        cost = self.fair.prices.cost(charge.job.model, prompt, completion)
        seat.inflight = max(0.0, seat.inflight - charge.charged)
        seat.unproduced = max(0.0, seat.unproduced - charge.unproduced)
        seat.running -= 1
        user.running -= 1
        user.served += cost
        pool.charge(seat, cost - charge.charged)
        pool.completed(seat, cost, prompt, completion, now)
        if learned is not None:
            self.fair.learn_completion(user, learned)
