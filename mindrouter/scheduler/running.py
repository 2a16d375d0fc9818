"""The jobs running now: where each runs (routing's), what it is charged (fairness's), and how many of a
backend's slots each user holds (kept slots and ``max_slot_share`` read it).

Invariant (``Roster.check``): the jobs running per (backend, user) are counted once each.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from .fairness.ledger import Charge
from .jobs import Job

__all__ = ["Roster", "Running"]


@dataclass(slots=True)
class Running:
    """A job started on a backend: where it runs (routing's) and what it is charged (fairness's). Never changed."""

    job: Job
    backend_id: Hashable
    charge: Charge


class Roster:
    """The running jobs by id, and their count per (backend id, user id)."""

    def __init__(self) -> None:
        self.jobs: dict[str, Running] = {}
        self._per_backend: dict[tuple[Hashable, Hashable], int] = {}

    def add(self, running: Running) -> None:
        self.jobs[running.job.id] = running
        where = (running.backend_id, running.job.user_id)
        self._per_backend[where] = self._per_backend.get(where, 0) + 1

    def stop(self, job_id: str) -> Running | None:
        """Take ``job_id`` off the running jobs, if it runs; returns it."""
        running = self.jobs.pop(job_id, None)
        if running is not None:
            where = (running.backend_id, running.job.user_id)
            left = self._per_backend[where] - 1
            if left:
                self._per_backend[where] = left
            else:
                del self._per_backend[where]
        return running

    def on(self, backend_id: Hashable, user_id: Hashable) -> int:
        """Jobs ``user_id`` runs on ``backend_id``: what it already holds of that backend."""
        return self._per_backend.get((backend_id, user_id), 0)

    def check(self) -> dict[Hashable, int]:
        """Assert the invariant (for tests); returns the jobs running per backend."""
        per_backend: dict[Hashable, int] = {}
        for running in self.jobs.values():
            per_backend[running.backend_id] = per_backend.get(running.backend_id, 0) + 1
        per_user = {(r.backend_id, r.job.user_id) for r in self.jobs.values()}
        assert per_user == set(self._per_backend), (per_user, self._per_backend)
        assert sum(self._per_backend.values()) == len(self.jobs)
        return per_backend
