"""How jobs end, and what they are charged: progress, completion, failure, cancellation, expiry.

A mixin of ``Scheduler``, holding the half of it that runs after a decision.
Every path frees the job's slot once (``_end``) and settles its charge against
what it really cost (``Ledger.settle``); a failure before the first byte puts
the job back at the front of its queue.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable

from .backend import BackendLoad
from .classes import Classes
from .fairshare import FairShare
from .jobs import Expired, Job, token_count
from .ledger import Ledger, Running
from .pools import Pool, Seat
from .queues import Queues
from .scoring import BackendScorer, ClassKey
from .settings import SchedulerSettings

__all__ = ["JobOutcomes"]


def class_key(job: Job) -> ClassKey:
    return (job.model, job.modality, job.json_mode)


class JobOutcomes:
    settings: SchedulerSettings
    fair: FairShare
    ledger: Ledger
    queues: Queues
    classes: Classes
    scorer: BackendScorer
    _running: dict[str, Running]
    _loads: dict[Hashable, BackendLoad]
    _deadlines: list[tuple[float, int, str]]
    _excluded: dict[str, set[Hashable]]
    _attempts: dict[str, int]

    def _pool(self, key: ClassKey) -> Pool:
        raise NotImplementedError

    def _rekey(self, pool: Pool, seat: Seat) -> None:
        raise NotImplementedError

    def _rekey_seats(self, seats: Iterable[Seat]) -> None:
        raise NotImplementedError

    def _enqueue(self, job: Job, now: float, *, front: bool) -> None:
        raise NotImplementedError

    def progress(self, job_id: str, now: float, *, completion_tokens: int) -> bool:
        """A running job has streamed ``completion_tokens`` so far (cumulative): charge what is new.

        The charge runs one or two typical answers ahead of what has streamed (see
        ``ledger.py``), so calling it every few dozen tokens is enough. Returns
        False when the job is not running.
        """
        if job_id not in self._running:
            return False
        moved = self.ledger.progress(job_id, completion_tokens)
        if moved is not None:
            self._rekey(moved.pool, moved.seat)
        return True

    def complete(
        self,
        job_id: str,
        now: float,
        *,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        latency: float | None = None,
        duration: float | None = None,
    ) -> bool:
        """A running job finished. Token counts are the backend's; None means it reported none.

        Without counts, what was charged (the provisional answer, or what streamed beyond it) stands.

        Args:
            latency: seconds to the first byte (streaming) or the whole answer, for the latency score.
            duration: seconds the generation took, for the throughput score.

        Returns False when the job was not running (already ended).
        """
        running = self._running.pop(job_id, None)
        if running is None:
            return False
        job = running.job
        prompt_tokens, completion_tokens = token_count(prompt_tokens), token_count(completion_tokens)  # else unknown
        prompt = job.prompt_tokens if prompt_tokens is None else prompt_tokens
        if completion_tokens is not None:
            completion = float(completion_tokens)
        elif prompt_tokens is None:
            completion = running.answer
        else:
            completion = float(running.streamed)
        self._end(running, now, prompt, completion, completion_tokens)
        load = self._loads.get(running.backend_id)
        if load is not None:
            load.completed += 1
            alpha = self.settings.latency_ema_alpha
            if latency is not None and latency >= 0:
                load.latency_ema = (
                    latency if load.latency_ema is None else load.latency_ema + alpha * (latency - load.latency_ema)
                )
            if duration and duration > 0 and completion_tokens:
                tps = completion_tokens / duration
                ema = load.tokens_per_second
                load.tokens_per_second = tps if ema is None else ema + alpha * (tps - ema)
            self.scorer.invalidate(running.backend_id)
        self._forget(job_id)
        return True

    def fail(self, job_id: str, now: float, *, retry: bool, prompt_tokens: int = 0, completion_tokens: int = 0) -> bool:
        """A running job failed on its backend.

        With ``retry`` (the failure came before the first byte), the job goes back
        to the front of its queue, keeping its place in time; it then waits for
        another live backend rather than return to one that failed it, and goes
        back to a failed one only when no other is live. Tokens already
        delivered are charged.

        Returns True when the job was queued again.
        """
        running = self._running.pop(job_id, None)
        if running is None:
            return False
        self._end(running, now, prompt_tokens, max(completion_tokens, running.streamed), None)
        load = self._loads.get(running.backend_id)
        if load is not None:
            load.failed += 1
        job = running.job
        if not retry or job.user_id not in self.fair.users:
            self._forget(job_id)
            return False
        self._excluded.setdefault(job_id, set()).add(running.backend_id)
        self._attempts[job_id] = self._attempts.get(job_id, 0) + 1
        self._enqueue(job, now, front=True)
        return True

    def cancel(self, job_id: str, now: float, *, prompt_tokens: int | None = None, completion_tokens: int = 0) -> bool:
        """The client went away: drop a queued job, or end a running one (charging what it used).

        Returns False when the job was neither queued nor running.
        """
        job = self.queues.jobs.get(job_id)
        if job is not None:
            self._unqueue(job, now)
            self._forget(job_id)
            return True
        running = self._running.pop(job_id, None)
        if running is None:
            return False
        prompt = running.job.prompt_tokens if prompt_tokens is None else prompt_tokens
        self._end(running, now, prompt, max(completion_tokens, running.streamed), None)
        self._forget(job_id)
        return True

    def _forget(self, job_id: str) -> None:
        self._excluded.pop(job_id, None)
        self._attempts.pop(job_id, None)

    def _end(self, running: Running, now: float, prompt: float, completion: float, learned: int | None) -> None:
        """Free the slot and settle the charge against what the job really cost."""
        load = self._loads.get(running.backend_id)
        if load is not None:
            load.in_flight -= 1
            self.classes.load_changed(running.backend_id)
        self.ledger.settle(running, now, prompt, completion, learned)
        pool, seat = running.pool, running.seat
        self._rekey_seats(self.fair.activity(pool, seat))
        self._rekey(pool, seat)

    def _unqueue(self, job: Job, now: float) -> None:
        key = class_key(job)
        pool = self._pool(key)
        seat = pool.seats[job.user_id]
        self.queues.remove(job, key)
        seat.queued -= 1
        seat.user.queued -= 1
        if not self.queues.jobs:
            self.fair.queue_became_empty(now)
        self._rekey_seats(self.fair.activity(pool, seat))
        pool.touch(seat)
        self._rekey(pool, seat)

    def expire(self, now: float) -> list[Expired]:
        """Remove and return the jobs that have waited past ``queue_timeout``."""
        out: list[Expired] = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, _, job_id = heapq.heappop(deadlines)
            job = self.queues.jobs.get(job_id)
            if job is not None:
                self._unqueue(job, now)
                self._forget(job_id)
                out.append(Expired(job, now - job.submitted_at))
        return out

    def next_deadline(self) -> float | None:
        """When ``expire`` will next have something to do, if ever."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][2] not in self.queues.jobs:
            heapq.heappop(deadlines)
        return deadlines[0][0] if deadlines else None
