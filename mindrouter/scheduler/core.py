"""The scheduler: the core's one face, composing fairness (``Turns``: whose job goes next, and its charge)
and routing (``Router``: where it runs, and what its answer teaches), which never read each other's state.

``dispatch(now)`` asks ``Turns`` for the best queued job whose class routing has open, asks ``Router``
where it is expected to finish first, and starts it there, until nothing more can start (``starting.py``). The caller
performs the I/O, reports streamed tokens with ``progress`` and the end with ``complete``, ``fail`` or
``cancel``: each end frees the slot in routing and settles the charge in fairness. ``Scheduler`` owns
the jobs' lives: where each runs, their queue deadlines (``deadlines.py``) and retries (``retries.py``).

Invariants (``check()``): a job is in exactly one of queued / running / finished; a backend's in-flight
count equals the running jobs routed to it plus the slots held there, and never exceeds its
``max_concurrent``; every hold that fairness ends gives its slot back to routing (``_unhold``); the
running jobs per (backend, user) are counted once each (``running.py``'s ``Roster``, for kept slots and
``max_slot_share``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from .deadlines import Deadlines
from .fairness.holds import Hold
from .fairness.turns import Turns
from .jobs import Expired, Job, Modality, Rejection, Timings, class_key, numbers_refusal, token_count
from .records import Dispatch
from .retries import Retries
from .routing.backend import Backend, BackendLoad
from .routing.router import Router
from .running import Roster, Running
from .settings import SchedulerSettings
from .starting import Starter
from .views import QueueStats, ShareSnapshot, UserShare, seed_snapshot

__all__ = ["Scheduler", "UnknownUser"]


class UnknownUser(KeyError):
    """A job names a user the scheduler was never told about (call ``set_user`` first)."""


class Scheduler:
    """Sans-I/O fair-share scheduler and router. Every method that depends on time takes ``now``."""

    def __init__(self, settings: SchedulerSettings | None = None) -> None:
        self.settings = settings = settings or SchedulerSettings()
        self.turns = Turns(settings)
        self.router = Router(settings)
        self._roster = Roster()
        self._deadlines = Deadlines()
        self._retries = Retries()
        self._starter = Starter(settings, self.turns, self.router, self._retries, self._roster)

    # -- users, groups and backends ----------------------------------------

    def set_user(
        self,
        user_id: Hashable,
        weight: float,
        *,
        name: str | None = None,
        group: str | None = None,
        weight_override: float | None = None,
        group_weight: float | None = None,
    ) -> None:
        """Add a user or change its weight, name or group; a new weight applies from now on.

        Args:
            weight: the user's own weight (its ``weight_override``, else its group's weight).
            weight_override: the override, if any: its weight inside its group in group shares.
            group_weight: its group's weight, if known (group shares); defaults to ``weight``.
        """
        self.turns.set_user(user_id, weight, name, group, weight_override, group_weight)

    def set_group(self, name: str, weight: float) -> None:
        """A group's weight changed: members without an override follow it, from now on."""
        self.turns.set_group(name, weight)

    def remove_user(self, user_id: Hashable) -> None:
        """Forget a user that has nothing queued or running."""
        self.turns.remove_user(user_id)

    def set_backend(self, backend: Backend) -> None:
        """Add a backend or replace what is known about it (configuration and telemetry)."""
        if self.router.set_backend(backend):
            self._regroup()
        if not backend.takes_work:
            self._unhold(self.turns.anticipation.drop_holds(backend.id), None)

    def remove_backend(self, backend_id: Hashable) -> None:
        """Forget a backend; jobs running there still end through complete/fail/cancel."""
        self._unhold(self.turns.anticipation.drop_holds(backend_id), None)
        if self.router.remove_backend(backend_id):
            self._regroup()

    def _regroup(self) -> None:
        """What backends serve changed, so pools may have: seat every queued job in its class's pool again."""
        self.turns.regroup({key: self.router.pool_of(key) for key in self.turns.queued_classes()})

    def _unhold(self, holds: Iterable[Hold], now: float | None) -> None:
        """Give the slots of holds fairness ended back to routing (``now`` None: their backend went away)."""
        for hold in holds:
            self.router.unhold(hold.backend_id, hold.model, hold.ended(now))

    def add_usage(self, user_id: Hashable, prompt: float, completion: float, at: float, model: str) -> None:
        """Replay usage from before a restart (``at`` on the caller's clock) into ``model``'s pool.

        Backends are usually not known yet then, so the usage waits until the model's pool is first needed.
        """
        key = (model, Modality.CHAT, False)
        self.turns.add_usage(user_id, prompt, completion, at, key, self.router.pool_of(key))

    def cost(self, model: str, prompt: float, completion: float) -> float:
        """A request's service units as fair share charges them now (``fairness/prices.py``)."""
        return self.turns.fair.prices.cost(model, prompt, completion)

    def prompt_weight(self, model: str) -> float:
        """Service units one prompt token of ``model`` costs now."""
        return self.turns.fair.prices.prompt_weight(model)

    # -- submitting and dispatching ----------------------------------------

    def submit(self, job: Job, now: float) -> Rejection | None:
        """Queue ``job``, or say why it cannot be queued (``Rejection`` with its HTTP status)."""
        if not self.turns.has_user(job.user_id):
            raise UnknownUser(job.user_id)
        if self.turns.queued(job.id) is not None or job.id in self._roster.jobs:
            raise ValueError(f"job {job.id!r} is already queued or running")
        refusal = numbers_refusal(job) or self.router.refusal(job)
        if refusal is None and not self._starts_at_once(job):
            refusal = self.turns.refusal(job)
        if refusal is not None:
            return refusal
        self._enqueue(job, now, front=False)
        self._deadlines.add(job.submitted_at + self.settings.queue_timeout, job.id)
        return None

    def _starts_at_once(self, job: Job) -> bool:
        """Nobody waits for the job's class and a backend has room: it leaves the queue in the next dispatch,
        so no queue cap refuses it (issue 28: a full queue refused idle models too)."""
        key = class_key(job)
        return not self.turns.queued_per_class.get(key) and self.router.has_open(key)

    def _enqueue(self, job: Job, now: float, *, front: bool) -> None:
        hold = self.turns.enqueue(job, self.router.pool_of(class_key(job)), now, front=front)
        if hold is not None:
            self._unhold((hold,), now)
            if hold.kept:
                self._starter.claims.append(job)

    def dispatch(self, now: float) -> list[Dispatch]:
        """Start every job that can start now, best first; return what to send where.

        Whole answers still running are first charged what the clock says they produced (``Ledger.tick``).
        """
        expired = self.turns.refresh(now)
        if expired:
            self._unhold(expired, now)
        return self._starter.dispatch(now)

    def take_unstartable(self) -> list[tuple[Job, Exception]]:
        """Jobs ``dispatch`` removed because starting them raised, with the error; each is returned once."""
        return self._starter.take_unstartable()

    # -- how jobs end --------------------------------------------------------

    def progress(self, job_id: str, now: float, *, completion_tokens: int) -> bool:
        """A running job has streamed ``completion_tokens`` so far (cumulative): charge what is new.

        The charge runs one or two typical answers ahead of what has streamed (``fairness/ledger.py``), so
        calling it every few dozen tokens is enough. Returns False when the job is not running.
        """
        running = self._roster.jobs.get(job_id)
        if running is None:
            return False
        self.turns.progress(running.charge, completion_tokens)
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
        cached_tokens: int | None = None,
    ) -> bool:
        """A running job finished. Token counts are the backend's; None means it reported none.

        Without counts, what was charged (the provisional answer, or what streamed beyond it) stands.

        Args:
            latency: seconds to the first byte (streaming) or the whole answer, by the shell's clock.
            duration: seconds from sending the request to its end, by the shell's clock.
            timings: what the backend says it spent loading, reading the prompt and answering;
                with ``latency`` and ``duration`` they teach the estimate this (backend, model)'s rates.
            cached_tokens: prompt tokens the backend found in its prompt cache, if it says (OpenAI usage's
                ``cached_tokens``): corrects what routing expects that backend to hold.

        Returns False when the job was not running (already ended).
        """
        running = self._roster.stop(job_id)
        if running is None:
            return False
        prompt_tokens, completion_tokens = token_count(prompt_tokens), token_count(completion_tokens)  # else unknown
        bid, job = running.backend_id, running.job
        self.router.learn(
            bid, job, prompt_tokens, completion_tokens, latency, duration, timings, token_count(cached_tokens)
        )
        self.router.release(bid, job)
        known = self.router.speeds.best.get(job.model)
        if known is not None:
            self.turns.fair.prices.learned(job.model, known.decode, known.prefill)
        self.turns.complete(running.charge, now, prompt_tokens, completion_tokens)
        self._retries.forget(job_id)
        self._anticipate(running, now)
        return True

    def fail(self, job_id: str, now: float, *, retry: bool, prompt_tokens: int = 0, completion_tokens: int = 0) -> bool:
        """A running job failed on its backend.

        With ``retry`` (the failure came before the first byte), the job goes back to the front of its
        queue, keeping its place in time; it then waits for another live backend rather than return to one
        that failed it, and goes back to a failed one only when no other is live. Tokens delivered are charged.

        Returns True when the job was queued again.
        """
        running = self._roster.stop(job_id)
        if running is None:
            return False
        job = running.job
        self.router.release(running.backend_id, job, failed=True)
        self.turns.end(running.charge, now, prompt_tokens, completion_tokens)
        if not retry or not self.turns.has_user(job.user_id):
            self._retries.forget(job_id)
            self._anticipate(running, now)
            return False
        self._retries.failed(job_id, running.backend_id)
        self._enqueue(job, now, front=True)
        return True

    def cancel(self, job_id: str, now: float, *, prompt_tokens: int | None = None, completion_tokens: int = 0) -> bool:
        """The client went away: drop a queued job, or end a running one (charging what it used).

        Returns False when the job was neither queued nor running.
        """
        job = self.turns.queued(job_id)
        if job is not None:
            self.turns.unqueue(job, now)
            self._retries.forget(job_id)
            return True
        running = self._roster.stop(job_id)
        if running is None:
            return False
        self.router.release(running.backend_id, running.job)
        self.turns.end(running.charge, now, prompt_tokens, completion_tokens)
        self._retries.forget(job_id)
        return True

    def _anticipate(self, running: Running, now: float) -> None:
        """Hold the slot ``running`` freed for its seat's next job, when the seat has nothing queued and
        thinks briefly, and would be served before every job queued that could take the slot; or keep it for
        a seat that reads for seconds (under ``max_think_time``) while the one who would take it already runs
        its share of the backend's slots and used more of late (``holds.py``)."""
        charge, bid, anticipation = running.charge, running.backend_id, self.turns.anticipation
        length = anticipation.hold_length(charge)
        if length is None:
            return
        served = self.router.holdable(bid, running.job.model)
        if served is None:
            return
        shared = length[1]
        rival = anticipation.rival(charge, served, now, shared=shared)
        if rival is None:
            return
        key, job = rival
        answer = self.turns.expected_answer(key, job)
        if shared:  # the rival's share counts the free slots the queue takes anyway (its jobs ending with ours)
            backend = self.router.backend(bid)
            free = self.router.free(bid) - 1
            mine = self._roster.on(bid, job.user_id) + min(free, self.turns.queued_of(job.user_id))
            if backend is None or not anticipation.over_share(charge, job, backend.max_concurrent, mine, now):
                return
        busy = self.router.busy_seconds(bid, job, answer, now)
        anticipation.hold(charge, bid, now, job, answer, busy, length)
        self.router.hold(bid, running.job.model)

    def expire(self, now: float) -> list[Expired]:
        """Remove and return the jobs that have waited past ``queue_timeout``; end the holds past their time."""
        self._unhold(self.turns.anticipation.expire_holds(now), now)
        out: list[Expired] = []
        for job_id in self._deadlines.due(now):
            job = self.turns.queued(job_id)
            if job is not None:
                self.turns.unqueue(job, now)
                self._retries.forget(job_id)
                out.append(Expired(job, now - job.submitted_at))
        return out

    def next_deadline(self) -> float | None:
        """When ``expire`` will next have something to do (a queue timeout, or a hold's end), if ever."""
        queued = self._deadlines.next(self.is_queued)
        hold = self.turns.anticipation.next_hold_deadline()
        if queued is None:
            return hold
        return queued if hold is None else min(hold, queued)

    # -- reading: frozen values only ---------------------------------------

    def is_queued(self, job_id: str) -> bool:
        return self.turns.queued(job_id) is not None

    def is_running(self, job_id: str) -> bool:
        return job_id in self._roster.jobs

    @property
    def queued_count(self) -> int:
        return self.turns.queued_count

    @property
    def running_count(self) -> int:
        return len(self._roster.jobs)

    def has_user(self, user_id: Hashable) -> bool:
        return self.turns.has_user(user_id)

    def user(self, user_id: Hashable) -> UserShare | None:
        """A frozen view of one user (``share(now).user(id)`` at the last instant)."""
        if not self.turns.has_user(user_id):
            return None
        return self.share(0.0, [user_id]).users[0]

    def backend(self, backend_id: Hashable) -> Backend | None:
        return self.router.backend(backend_id)

    def load(self, backend_id: Hashable) -> BackendLoad | None:
        """A copy of what the core counts for ``backend_id`` (in flight, latency, throughput)."""
        return self.router.load(backend_id)

    @property
    def backends(self) -> dict[Hashable, Backend]:
        return self.router.backends

    @property
    def heavy(self) -> frozenset[Hashable]:
        """Users deprioritized in some pool now."""
        return self.turns.heavy

    def queue_position(self, job_id: str) -> tuple[int, int] | None:
        """(1-based place among its user's jobs of the same kind, jobs queued in all), or None."""
        return self.turns.queue_position(job_id)

    def queued_jobs(self) -> Iterable[Job]:
        return self.turns.queued_jobs()

    def running_jobs(self) -> Iterable[tuple[Job, Hashable]]:
        return ((r.job, r.backend_id) for r in self._roster.jobs.values())

    def share(self, now: float, user_ids: Iterable[Hashable] | None = None, *, active: bool = False) -> ShareSnapshot:
        """Every user's standing, per pool and in sum, and every pool (``mr share``).

        With ``user_ids``, only those users, and no pools (cheap enough per request). With ``active``, only
        the users with jobs queued or running or usage in the fairness window, and every pool: what a
        listing shows, at a cost that grows with them rather than with the users registered.
        """
        return self.turns.share(now, user_ids, active=active)

    def queue_stats(self, now: float) -> QueueStats:
        """What waits, for whom and for which model, and how long (``mr queue``)."""
        return self.turns.queue_stats(now, len(self._roster.jobs))

    def snapshot(self, now: float) -> dict[str, Any]:
        """Queue statistics and fair share in the seed's shape (``mr queue --json``)."""
        return seed_snapshot(self.queue_stats(now), self.share(now))

    def check(self) -> None:
        """Assert the invariants (for tests)."""
        self.turns.check()
        for job_id in self._roster.jobs:
            assert not self.is_queued(job_id), job_id
        self.router.check(self._roster.check(), self.turns.anticipation.held_per_backend())
