"""Decisions: send a job to a backend now, and the record of why it went there.

A record is captured cheaply at decision time (tuples and shared references)
and turned into the seed's JSON shape only when someone reads or stores it.

Invariants: a record is built before its decision changes anything, and
nothing it holds changes afterwards (what may, such as a class's closed
backends, is copied); fields of the seed's shape are never renamed or
removed, more may be added.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .fairness.priority import PriorityTerms
from .jobs import Job
from .routing.constraints import rejected_map
from .routing.estimate import Estimate

__all__ = ["DecisionRecord", "Dispatch"]


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    request_id: str
    time: float
    """The core's clock (monotonic seconds); the shell adds wall-clock time when storing."""
    model: str
    user_id: Hashable
    user_name: str
    user_group: str | None
    user_recent_usage: float
    """Tokens the user completed in this pool within the fairness window."""
    user_recent_units: float
    """The same in service units (``SchedulerSettings.cost``): what decides who is heavy."""
    queue_wait: float
    selected_backend_id: Hashable
    candidates: tuple[Estimate, ...]
    """Every open candidate's estimate: when the job would start and finish there."""
    static_rejected: Mapping[Hashable, tuple[str, ...]]
    live_rejected: Mapping[Hashable, tuple[str, ...]]
    terms: PriorityTerms
    attempt: int = 1
    slot_held: bool = False
    """A slot of the backend it went to was held for another user about to send again while it waited."""

    def to_dict(self) -> dict[str, Any]:
        t = self.terms
        rows = self.candidates
        return {
            "request_id": self.request_id,
            "selected_backend_id": self.selected_backend_id,
            "candidate_backends": [row.backend_id for row in rows],
            "scores": {str(row.backend_id): round(row.score, 3) for row in rows},
            "user_deficit": round(t.deficit, 3),
            "user_weight": t.weight,
            "user_group": self.user_group,
            "user_recent_usage": self.user_recent_usage,
            "user_recent_units": self.user_recent_units,
            "user_id": self.user_id,
            "user": self.user_name,
            "model": self.model,
            "time": self.time,
            "queue_wait": round(self.queue_wait, 6),
            "attempt": self.attempt,
            "slot_held": self.slot_held,
            "priority": t.to_dict(),
            "score_components": {str(row.backend_id): row.to_dict() for row in rows},
            "rejected": rejected_map(self.static_rejected, self.live_rejected),
        }


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Send ``job`` to ``backend_id`` now; ``record`` says why."""

    job: Job
    backend_id: Hashable
    record: DecisionRecord = field(compare=False)
