"""Starting queued jobs: fairness names the best job whose class routing has open, routing says where it is
expected to finish first, and it starts there, until nothing more can start (``Scheduler.dispatch``).

A job that ended a hold kept for it (``Hold.kept``) starts first; a job whose start raises fails alone
(``take_unstartable``).
"""

from __future__ import annotations

from collections.abc import Hashable

from .fairness.turns import Turns
from .jobs import ClassKey, Job, class_key
from .records import DecisionRecord, Dispatch
from .retries import Retries
from .routing.router import Route, Router
from .running import Roster, Running
from .settings import SchedulerSettings

__all__ = ["Starter"]


class Starter:
    """Starts what can start now, with the jobs waiting to claim a kept slot and those that could not start."""

    def __init__(
        self, settings: SchedulerSettings, turns: Turns, router: Router, retries: Retries, roster: Roster
    ) -> None:
        self.settings = settings
        self.turns = turns
        self.router = router
        self._retries = retries
        self._roster = roster
        self._unstartable: list[tuple[Job, Exception]] = []
        self.claims: list[Job] = []
        """Jobs that ended a hold kept for them (``Hold.kept``): the next dispatch starts them first."""

    def dispatch(self, now: float) -> list[Dispatch]:
        """Start every job that can start now, best first; return what to send where."""
        turns, router = self.turns, self.router
        router.deciding(now)
        queued = turns.queued_per_class
        out: list[Dispatch] = []
        blocked: set[ClassKey] = set()
        while (chosen := self._claimed(blocked) or turns.next(blocked, router.has_open)) is not None:
            key, job = chosen
            try:
                answer = turns.expected_answer(key, job)
                routed = router.route(key, job, answer, self._retries.excluded(job.id), queued[key], queued)
                if routed is None or routed[0] is None:  # nothing open, or better to wait for a full one
                    blocked.add(key)
                    continue
                if self._capped(key, job, routed[0].backend_id):
                    turns.order.park(job.user_id)
                    continue
                out.append(self._start(key, job, routed, now))
            except Exception as exc:  # a value no check caught, or a bug: this job alone fails
                self.turns.unqueue(job, now)
                self._retries.forget(job.id)
                self._unstartable.append((job, exc))
        self.claims.clear()
        turns.order.unpark()
        router.place(queued)
        return out

    def _capped(self, key: ClassKey, job: Job, backend_id: Hashable) -> bool:
        """Whether ``job``'s user holds the most of ``backend_id``'s slots ``max_slot_share`` allows."""
        if self.settings.max_slot_share is None:
            return False
        backend = self.router.backend(backend_id)
        running = self._roster.on(backend_id, job.user_id)
        return backend is not None and self.turns.capped(key, job, backend.max_concurrent, running)

    def _claimed(self, blocked: set[ClassKey]) -> tuple[ClassKey, Job] | None:
        """A queued job that ended a hold kept for it, whose class is open: it takes the slot first."""
        while self.claims:
            job = self.claims.pop()
            key = class_key(job)
            if self.turns.queued(job.id) is job and key not in blocked and self.router.has_open(key):
                return key, job
        return None

    def _start(self, key: ClassKey, job: Job, routed: Route, now: float) -> Dispatch:
        """Start ``job`` where ``routed`` says; whatever raises before the first change leaves no trace."""
        chosen, rows, live = routed
        assert chosen is not None
        backend_id = chosen.backend_id
        router = self.router
        turn = self.turns.prepare(key, job, now, router.observed_rate(backend_id, job.model))
        record = DecisionRecord(
            request_id=job.id,
            time=now,
            model=job.model,
            user_id=job.user_id,
            user_name=turn.user_name,
            user_group=turn.user_group,
            user_recent_usage=turn.recent_tokens,
            user_recent_units=turn.recent_units,
            queue_wait=now - job.submitted_at,
            selected_backend_id=backend_id,
            candidates=rows,
            static_rejected=router.static_rejected(key),
            live_rejected=live,
            terms=turn.terms,
            attempt=self._retries.attempt(job.id),
            slot_held=router.held_since(backend_id, job.submitted_at),
        )
        self.turns.start(key, turn, now)
        router.take(job, chosen, now)
        self._roster.add(Running(job, backend_id, turn.charge))
        return Dispatch(job, backend_id, record)

    def take_unstartable(self) -> list[tuple[Job, Exception]]:
        """Jobs ``dispatch`` removed because starting them raised, with the error; each is returned once."""
        out, self._unstartable = self._unstartable, []
        return out
