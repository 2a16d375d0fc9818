"""Running jobs and what they have been charged: service is charged as it is produced, a little ahead.

A job is charged its prompt and a provisional answer when it starts
(``FairShare.provisional_answer``). While it streams, the answer charged is
``max(streamed, min(total, streamed + ahead))``: it runs ``ahead`` of what the
stream has produced (one of the pool's typical answers while the user's answers
are unknown, and the total unbounded; two slot answers once known), but never
past the answer's expected total unless it outlives it. So a user taking
several slots at once moves by each of them, and a long answer is charged as it
is produced rather than all at once. A job that does not stream is charged its
whole estimate at once (``ahead`` infinite): its expected answer, capped by
``max_tokens``, as a stream's total is. What was charged beyond the prompt and
what streamed (``unproduced``) is service still to come, priced again if the
seat's weight changes. At the end the charge is settled against the backend's
own counts: the difference is charged or refunded at the seat's weight of that
moment.

Invariant: a seat's ``inflight`` is the sum of ``charged`` over its running jobs.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

from .fairshare import FairShare
from .jobs import Job
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
    """How far ahead of what has streamed the answer is charged (infinite when it does not stream)."""
    charged: float = 0.0
    """Cost charged so far."""
    answer: float = 0.0
    """Completion tokens charged so far."""
    streamed: int = 0
    """Completion tokens reported so far."""
    unproduced: float = 0.0
    """Cost charged beyond what it has produced (its prompt and what streamed): its part of ``Seat.unproduced``."""

    def answer_due(self) -> float:
        """Completion tokens to have charged now, given what has streamed.

        A stream that outlives its expected total shows the estimate wrong: from then on it is
        charged as one of unknown length is, ``ahead`` of what it has produced up to ``max_tokens``.
        Held to the estimate, a user whose answers jump from 10 to 4,000 tokens was charged only
        what streamed and took 6 of 8 slots at once (answers-jump, gap 25,540 of 16,400).
        """
        streamed = self.streamed
        total = self.total
        if streamed > total:
            limit = self.job.max_tokens
            total = math.inf if limit is None else float(limit)
        return max(streamed, min(total, streamed + self.ahead))


class Ledger:
    def __init__(self, fair: FairShare) -> None:
        self.fair = fair
        self.settings = fair.settings
        self.jobs: dict[str, Running] = {}

    def prepare(self, job: Job, backend_id: Hashable, pool: Pool, seat: Seat) -> Running:
        """What ``job`` will be charged as it starts; changes nothing, so a failure here leaves no trace."""
        running = Running(job, backend_id, pool, seat, *self.fair.provisional_answer(seat.user, pool, job))
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

    def _produced(self, running: Running) -> None:
        """Keep the seat's cost charged ahead of production in step with the job's."""
        unproduced = running.charged - self.settings.cost(running.job.prompt_tokens, running.streamed)
        running.seat.unproduced += unproduced - running.unproduced
        running.unproduced = unproduced

    def progress(self, job_id: str, completion_tokens: int) -> Running | None:
        """Charge what streamed beyond what was charged; returns the job if its seat moved."""
        running = self.jobs.get(job_id)
        if running is None:
            return None
        running.streamed = max(running.streamed, completion_tokens)
        answer = running.answer_due()
        if answer <= running.answer:
            self._produced(running)
            return None
        target = self.settings.cost(running.job.prompt_tokens, answer)
        more = target - running.charged
        running.answer, running.charged = answer, target
        running.seat.inflight += more
        running.pool.charge(running.seat, more)
        self._produced(running)
        return running

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
