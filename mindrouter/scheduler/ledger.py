"""Running jobs and what they have been charged: service is charged as it is produced.

A job is charged its prompt and an estimate of its answer when it starts
(``FairShare.completion_estimate``), then, as the caller reports progress,
whatever it has streamed beyond that estimate, and at the end it is settled
against the backend's own counts: the difference is charged or refunded at the
seat's weight of that moment.

Invariant: a seat's ``inflight`` is the sum of ``charged`` over its running jobs.
"""

from __future__ import annotations

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
    estimate: float
    """Completion tokens charged when it started."""
    charged: float
    """Cost charged so far."""
    streamed: int = 0
    """Completion tokens reported so far."""


class Ledger:
    def __init__(self, fair: FairShare) -> None:
        self.fair = fair
        self.settings = fair.settings
        self.jobs: dict[str, Running] = {}

    def start(self, job: Job, backend_id: Hashable, pool: Pool, seat: Seat) -> None:
        estimate = self.fair.completion_estimate(seat.user, pool, job.max_tokens, job.stream)
        cost = self.settings.cost(job.prompt_tokens, estimate)
        seat.running += 1
        seat.user.running += 1
        seat.inflight += cost
        pool.charge(seat, cost)
        self.jobs[job.id] = Running(job, backend_id, pool, seat, estimate, cost)

    def progress(self, job_id: str, completion_tokens: int) -> Running | None:
        """Charge what streamed beyond what was charged; returns the job if its seat moved."""
        running = self.jobs.get(job_id)
        if running is None:
            return None
        running.streamed = max(running.streamed, completion_tokens)
        target = self.settings.cost(running.job.prompt_tokens, max(running.estimate, running.streamed))
        more = target - running.charged
        if more <= 0:
            return None
        running.charged = target
        running.seat.inflight += more
        running.pool.charge(running.seat, more)
        return running

    def settle(self, running: Running, now: float, prompt: float, completion: float, learned: int | None) -> None:
        """The job ended having really cost ``cost(prompt, completion)``: charge or refund the difference."""
        pool, seat = running.pool, running.seat
        user = seat.user
        cost = self.settings.cost(prompt, completion)
        seat.inflight = max(0.0, seat.inflight - running.charged)
        seat.running -= 1
        user.running -= 1
        user.served += cost
        pool.charge(seat, cost - running.charged)
        pool.completed(seat, cost, prompt, completion, now)
        if learned is not None:
            self.fair.learn_completion(user, learned)
