"""What the core shows: frozen snapshots, queue positions and its invariants.

A mixin of ``Scheduler``: everything here only reads. The daemon, the CLI and
the simulator see the core through these methods (``share(now)``,
``queue_stats(now)``, ``snapshot(now)``) and never through its mutable state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterable
from typing import Any

from .fairness.fairshare import FairShare
from .fairness.holds import Holds
from .fairness.ledger import Running
from .fairness.queues import Queues
from .jobs import Job, class_key
from .routing.backend import Backend, BackendLoad
from .settings import SchedulerSettings
from .views import QueueStats, ShareSnapshot, UserShare, build_queue_stats, build_share

__all__ = ["CoreReading"]


class CoreReading:
    settings: SchedulerSettings
    fair: FairShare
    queues: Queues
    holds: Holds
    _running: dict[str, Running]
    _backends: dict[Hashable, Backend]
    _loads: dict[Hashable, BackendLoad]
    _usage_backlog: dict[str, list[tuple[Hashable, float, float, float]]]

    def is_queued(self, job_id: str) -> bool:
        return job_id in self.queues.jobs

    def is_running(self, job_id: str) -> bool:
        return job_id in self._running

    @property
    def queued_count(self) -> int:
        return len(self.queues.jobs)

    @property
    def running_count(self) -> int:
        return len(self._running)

    def has_user(self, user_id: Hashable) -> bool:
        return user_id in self.fair.users

    def user(self, user_id: Hashable) -> UserShare | None:
        """A frozen view of one user (``share(now).user(id)`` at the last instant)."""
        if user_id not in self.fair.users:
            return None
        return self.share(0.0, [user_id]).users[0]

    def backend(self, backend_id: Hashable) -> Backend | None:
        return self._backends.get(backend_id)

    def load(self, backend_id: Hashable) -> BackendLoad | None:
        """A copy of what the core counts for ``backend_id`` (in flight, latency, throughput)."""
        load = self._loads.get(backend_id)
        return None if load is None else dataclasses.replace(load)

    @property
    def backends(self) -> dict[Hashable, Backend]:
        return dict(self._backends)

    @property
    def heavy(self) -> frozenset[Hashable]:
        """Users deprioritized in some pool now."""
        return frozenset(uid for pool in self.fair.pools.values() for uid in pool.heavy)

    def queue_position(self, job_id: str) -> tuple[int, int] | None:
        """(1-based place among its user's jobs of the same kind, jobs queued in all), or None."""
        job = self.queues.jobs.get(job_id)
        if job is None:
            return None
        place = self.queues.position(job, class_key(job))
        return None if place is None else (place, len(self.queues.jobs))

    def queued_jobs(self) -> Iterable[Job]:
        return self.queues.jobs.values()

    def running_jobs(self) -> Iterable[tuple[Job, Hashable]]:
        return ((r.job, r.backend_id) for r in self._running.values())

    def share(self, now: float, user_ids: Iterable[Hashable] | None = None) -> ShareSnapshot:
        """Every user's standing, per pool and in sum, and every pool (``mr share``).

        With ``user_ids``, only those users, and no pools (cheap enough per request).
        """
        fair = self.fair
        users = fair.users.values() if user_ids is None else [fair.users[u] for u in user_ids]
        horizon = now - self.settings.fairness_window
        pending: dict[Hashable, tuple[float, float]] = {}  # restored (tokens, units) whose model no backend named yet
        for entries in self._usage_backlog.values():
            for uid, prompt, completion, at in entries:
                if at >= horizon:
                    tokens, units = pending.get(uid, (0.0, 0.0))
                    pending[uid] = (tokens + prompt + completion, units + self.settings.cost(prompt, completion))
        return build_share(
            users,
            fair.pools.values(),
            now,
            self.settings.shares,
            self.settings.fairness_window,
            fair.current_burst(now),
            pending,
            with_pools=user_ids is None,
        )

    def queue_stats(self, now: float) -> QueueStats:
        """What waits, for whom and for which model, and how long (``mr queue``)."""
        return build_queue_stats(self.queues.jobs.values(), len(self._running), self.fair.users, now)

    def snapshot(self, now: float) -> dict[str, Any]:
        """Queue statistics and fair share in the seed's shape (``mr queue --json``)."""
        share = self.share(now)
        return {
            "queue": self.queue_stats(now).to_dict(),
            "fair_share": {
                "total_users": len(share.users),
                "global_recent_tokens": share.global_recent_tokens,
                "global_recent_units": share.global_recent_units,
                "user_stats": [u.to_dict() for u in share.users],
            },
        }

    def check(self) -> None:
        """Assert the invariants (for tests)."""
        self.fair.check()
        self.queues.check()
        self.holds.check()
        per_backend: dict[Hashable, int] = {}
        for job_id, running in self._running.items():
            assert job_id not in self.queues.jobs, job_id
            per_backend[running.backend_id] = per_backend.get(running.backend_id, 0) + 1
        for bid, load in self._loads.items():
            jobs = load.in_flight - load.held
            assert jobs == per_backend.get(bid, 0) and load.held >= 0, (bid, load.in_flight, per_backend.get(bid, 0))
            backend = self._backends.get(bid)
            if backend is not None:
                assert load.in_flight <= backend.max_concurrent or not backend.enabled, bid
        for user in self.fair.users.values():
            assert user.queued == sum(len(q) for q in self.queues.classes_of(user.id).values())
            seated = sum(p.seats[user.id].queued for p in self.fair.pools.values() if user.id in p.seats)
            assert seated == user.queued, (user, seated)
