"""How jobs end, and what they are charged: progress, completion, failure, cancellation, expiry.

A mixin of ``Scheduler``, holding the half of it that runs after a decision.
Every path frees the job's slot once (``_end``) and settles its charge against
what it really cost (``Ledger.settle``); a failure before the first byte puts
the job back at the front of its queue.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable

from .fairness.fairshare import FairShare
from .fairness.holds import Holds
from .fairness.ledger import Ledger, Running
from .fairness.pools import Pool, Seat
from .fairness.queues import Entry, Queues
from .jobs import ClassKey, Expired, Job, Timings, class_key, token_count
from .routing.backend import Backend, BackendLoad
from .routing.classes import Classes
from .routing.estimate import Speeds, estimate
from .routing.learning import Sample, learn
from .settings import SchedulerSettings

__all__ = ["JobOutcomes"]


class JobOutcomes:
    settings: SchedulerSettings
    fair: FairShare
    ledger: Ledger
    queues: Queues
    classes: Classes
    holds: Holds
    speeds: Speeds
    _wait_rate: float
    _running: dict[str, Running]
    _loads: dict[Hashable, BackendLoad]
    _backends: dict[Hashable, Backend]
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

    def _rank(self, key: ClassKey, entry: Entry) -> tuple[float, int]:
        raise NotImplementedError

    def _valid(self, entry: Entry, key: ClassKey) -> bool:
        raise NotImplementedError

    def _expected_answer(self, key: ClassKey, job: Job) -> float:
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
        timings: Timings | None = None,
    ) -> bool:
        """A running job finished. Token counts are the backend's; None means it reported none.

        Without counts, what was charged (the provisional answer, or what streamed beyond it) stands.

        Args:
            latency: seconds to the first byte (streaming) or the whole answer, by the shell's clock.
            duration: seconds from sending the request to its end, by the shell's clock.
            timings: what the backend says it spent loading, reading the prompt and answering;
                with ``latency`` and ``duration`` they teach the estimate this (backend, model)'s rates.

        Returns False when the job was not running (already ended).
        """
        running = self._running.pop(job_id, None)
        if running is None:
            return False
        job = running.job
        prompt_tokens, completion_tokens = token_count(prompt_tokens), token_count(completion_tokens)  # else unknown
        load = self._loads.get(running.backend_id)
        if load is not None:  # before ``_end``: the streams that shared the backend still count this one
            backend = self._backends.get(running.backend_id)
            size = backend.model_sizes.get(job.model) if backend is not None else None
            sample = Sample(prompt_tokens, completion_tokens, latency, duration, timings or Timings(), size)
            learn(load, self.speeds, job, sample, self.settings)
        prompt = job.prompt_tokens if prompt_tokens is None else prompt_tokens
        if completion_tokens is not None:
            completion = float(completion_tokens)
        elif prompt_tokens is None:
            completion = running.answer
        else:
            completion = float(running.streamed)
        self._end(running, now, prompt, completion, completion_tokens)
        self._forget(job_id)
        self._anticipate(running, now)
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
            self._anticipate(running, now)
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
            model = running.job.model
            load.in_flight -= 1
            load.model_in_flight[model] -= 1
            load.loaders.discard(running.job.id)
            self.classes.load_changed(running.backend_id)
        self.ledger.settle(running, now, prompt, completion, learned)
        pool, seat = running.pool, running.seat
        seat.ended = now
        if not seat.queued:
            seat.kept = pool.returning(seat)
        self._rekey_seats(self.fair.activity(pool, seat))
        self._rekey(pool, seat)

    def _anticipate(self, running: Running, now: float) -> None:
        """Hold the slot ``running`` freed for its seat's next job, when the seat has nothing queued,
        thinks briefly, and would be served before every job queued that could take the slot (``holds.py``)."""
        pool, seat, bid = running.pool, running.seat, running.backend_id
        backend = self._backends.get(bid)
        if seat.queued or not self.holds.thinks_briefly(seat) or backend is None:
            return
        if not backend.healthy or not backend.enabled or backend.draining:
            return
        mine = self._wait_rate * now - pool.priority(seat, pool.reference(), seat.kept)
        first: tuple[float, ClassKey, Entry] | None = None
        for key in self.classes.served_by(bid):
            if not self.queues.counts.get(key):
                continue
            entry = self.queues.top(key, self._valid)
            if entry is None:
                continue
            rank = self._rank(key, entry)[0]
            if rank <= mine:
                return
            if first is None or rank < first[0]:
                first = (rank, key, entry)
        if first is None:  # with nobody queued who could take it, the slot stays free for whoever comes first
            return
        _, key, entry = first
        job = self.queues.head(entry[2], key)
        answer = self._expected_answer(key, job)
        row = estimate(backend, self._loads[bid], job.model, job.prompt_tokens, answer, now, self.settings, self.speeds)
        busy = 0.0 if row is None else row.prefill + row.decode  # the seconds it would hold the slot, once started
        rate = self.settings.cost(job.prompt_tokens, answer) / busy if busy > 0 else 0.0
        self.holds.take(pool, seat, bid, running.job.model, now, rate)

    def _unqueue(self, job: Job, now: float) -> None:
        key = class_key(job)
        pool = self._pool(key)
        seat = pool.seats[job.user_id]
        self.queues.remove(job, key)
        seat.queued -= 1
        seat.user.queued -= 1
        if not seat.queued:
            pool.queue_emptied(seat)
        if not self.queues.jobs:
            self.fair.queue_became_empty(now)
        self._rekey_seats(self.fair.activity(pool, seat))
        pool.touch(seat)
        self._rekey(pool, seat)

    def expire(self, now: float) -> list[Expired]:
        """Remove and return the jobs that have waited past ``queue_timeout``; end the holds past their time."""
        self._end_holds(now)
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

    def _end_holds(self, now: float) -> None:
        """End the holds past their time; their holders, charged for them, are queued at their new place."""
        for hold in self.holds.expire(now):
            self._rekey(hold.pool, hold.seat)

    def next_deadline(self) -> float | None:
        """When ``expire`` will next have something to do (a queue timeout, or a hold's end), if ever."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][2] not in self.queues.jobs:
            heapq.heappop(deadlines)
        hold = self.holds.next_deadline()
        if not deadlines:
            return hold
        return deadlines[0][0] if hold is None else min(hold, deadlines[0][0])
