"""Running jobs and what they have been charged: service is charged as it is produced, a little ahead.

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

Invariant: a seat's ``inflight`` is the sum of ``charged`` over its running jobs.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Hashable
from dataclasses import dataclass

from ..jobs import Job
from .fairshare import FairShare
from .pools import Pool, Seat

__all__ = ["Ledger", "Running"]


@dataclass(slots=True)
class Running:
    job: Job
    backend_id: Hashable
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
    def __init__(self, fair: FairShare) -> None:
        self.fair = fair
        self.settings = fair.settings
        self.jobs: dict[str, Running] = {}
        self._clock: list[tuple[float, int, Running]] = []
        """Whole answers by when the clock next moves their charge (entries of ended jobs go lazily)."""
        self._seq = itertools.count()

    def prepare(
        self, job: Job, backend_id: Hashable, pool: Pool, seat: Seat, now: float, rate: float | None
    ) -> Running:
        """What ``job`` will be charged as it starts; changes nothing, so a failure here leaves no trace.

        ``rate``: completion tokens per second one stream of that (backend, model) was seen to get.
        """
        total, ahead = self.fair.provisional_answer(seat.user, pool, job)
        running = Running(job, backend_id, pool, seat, total, ahead, now, rate or 0.0)
        running.answer = running.answer_due()
        running.charged = self.settings.cost(job.prompt_tokens, running.answer)
        return running

    def start(self, running: Running) -> None:
        seat, pool, cost = running.seat, running.pool, running.charged
        seat.running += 1
        seat.user.running += 1
        seat.inflight += cost
        pool.charge(seat, cost)
        self._produced(running)
        self.jobs[running.job.id] = running
        self._wind(running)

    def _wind(self, running: Running) -> None:
        at = running.next_tick()
        if at is not None:
            heapq.heappush(self._clock, (at, next(self._seq), running))

    def tick(self, now: float) -> list[Running]:
        """Charge the whole answers whose clock has run past what they were charged; returns them."""
        clock, moved = self._clock, []
        while clock and clock[0][0] <= now:
            running = heapq.heappop(clock)[2]
            if self.jobs.get(running.job.id) is not running:
                continue
            produced = running.rate * (now - running.started)
            limit = running.job.max_tokens
            running.clocked = produced if limit is None else min(produced, float(limit))
            if self._recharge(running):
                moved.append(running)
            self._wind(running)
        return moved

    def _produced(self, running: Running) -> None:
        """Keep the seat's cost charged ahead of production in step with the job's."""
        produced = max(running.streamed, running.clocked)
        unproduced = running.charged - self.settings.cost(running.job.prompt_tokens, produced)
        running.seat.unproduced += unproduced - running.unproduced
        running.unproduced = unproduced

    def progress(self, job_id: str, completion_tokens: int) -> Running | None:
        """Charge what streamed beyond what was charged; returns the job if its seat moved."""
        running = self.jobs.get(job_id)
        if running is None:
            return None
        running.streamed = max(running.streamed, completion_tokens)
        return running if self._recharge(running) else None

    def _recharge(self, running: Running) -> bool:
        """Charge what is due beyond what was charged; True if the seat moved."""
        answer = running.answer_due()
        if answer <= running.answer:
            self._produced(running)
            return False
        target = self.settings.cost(running.job.prompt_tokens, answer)
        more = target - running.charged
        running.answer, running.charged = answer, target
        running.seat.inflight += more
        running.pool.charge(running.seat, more)
        self._produced(running)
        return True

    def settle(self, running: Running, now: float, prompt: float, completion: float, learned: int | None) -> None:
        """The job ended having really cost ``cost(prompt, completion)``: charge or refund the difference."""
        pool, seat = running.pool, running.seat
        user = seat.user
        cost = self.settings.cost(prompt, completion)
        seat.inflight = max(0.0, seat.inflight - running.charged)
        seat.unproduced = max(0.0, seat.unproduced - running.unproduced)
        seat.running -= 1
        user.running -= 1
        user.served += cost
        pool.charge(seat, cost - running.charged)
        pool.completed(seat, cost, prompt, completion, now)
        if learned is not None:
            self.fair.learn_completion(user, learned)
