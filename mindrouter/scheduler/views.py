"""Frozen snapshots of the core: what the daemon, the CLI and the simulator may read.

Nothing outside ``scheduler/`` touches a mutable ``UserState`` or ``Seat``; they
read these values, built on demand by ``Scheduler.share(now)`` and
``Scheduler.queue_stats(now)`` (``fairness/snapshots.py``).

Invariants: every value here is frozen and holds no reference into the core;
deficits are shown in cost units relative to their pool's reference (0 = the
most-owed waiting user; negative = served ahead), so the absolute zero the
core may shift never shows.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PoolShare",
    "QueueStats",
    "SeatShare",
    "ShareSnapshot",
    "UserShare",
    "round_share",
    "seed_snapshot",
]


@dataclass(frozen=True, slots=True)
class SeatShare:
    """A user's standing in one pool."""

    backends: tuple[str, ...]
    """The pool: the backends its jobs can run on."""
    weight: float
    """The weight the pool uses now (group shares: the user's part of its group's)."""
    deficit: float
    """Cost owed relative to the pool's most-owed waiting user (in-flight charges included)."""
    inflight_charge: float
    recent_tokens: float
    recent_units: float
    """Recent service units (``SchedulerSettings.cost``): what ``usage_fraction`` counts."""
    usage_fraction: float
    """Recent service units per unit of weight, as a part of the pool's sum of that."""
    factor: float
    """Deprioritization for heavy use; below 1 it lowers this user's priority here."""
    queued: int
    running: int
    served: float
    target_share: float | None = None
    """Its weight over the weights of the seats with demand in this pool (``targets.py``); None while idle here."""
    actual_share: float = 0.0
    """Its part of the service units this pool gave within the window."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "backends": list(self.backends),
            "weight": round(self.weight, 4),
            "deficit": round(self.deficit, 3),
            "recent_tokens": self.recent_tokens,
            "recent_units": round(self.recent_units, 3),
            "usage_fraction": round(self.usage_fraction, 4),
            "factor": round(self.factor, 4),
            "target_share": round_share(self.target_share),
            "actual_share": round_share(self.actual_share),
        }


@dataclass(frozen=True, slots=True)
class UserShare:
    user_id: Hashable
    name: str
    group: str | None
    weight: float
    weight_override: float | None
    deficit: float
    """Sum over the user's pools."""
    inflight_charge: float
    recent_tokens: float
    recent_units: float
    usage_fraction: float
    """The highest over its pools."""
    factor: float
    """The lowest over its pools."""
    queued: int
    running: int
    served: float
    seats: tuple[SeatShare, ...]
    target_share: float | None = None
    """Over the pools it has demand in (``targets.combined``); None for an idle person."""
    actual_share: float | None = None
    """Its part of the service units of those pools, the same way."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id,
            "name": self.name,
            "group": self.group,
            "weight": self.weight,
            "deficit": round(self.deficit, 3),
            "inflight_charge": round(self.inflight_charge, 3),
            "recent_tokens": self.recent_tokens,
            "recent_units": round(self.recent_units, 3),
            "served_units": round(self.served, 3),
            "usage_fraction": round(self.usage_fraction, 4),
            "factor": round(self.factor, 4),
            "queued": self.queued,
            "running": self.running,
            "target_share": round_share(self.target_share),
            "actual_share": round_share(self.actual_share),
            "pools": [s.to_dict() for s in self.seats],
        }


@dataclass(frozen=True, slots=True)
class PoolShare:
    """One pool of contention: its backends, who used it, its reference and typical request."""

    backends: tuple[str, ...]
    users: tuple[str, ...]
    """Names of the users with a seat here that is active or used the pool in the window."""
    reference: float
    typical_request: float
    """The pool's typical request cost: the bound on return credit and on placement behind."""
    recent_tokens: float
    recent_units: float
    heavy: tuple[str, ...]
    """Users deprioritized here (at most one)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "backends": list(self.backends),
            "users": list(self.users),
            "typical_request": round(self.typical_request, 1),
            "recent_tokens": self.recent_tokens,
            "recent_units": round(self.recent_units, 3),
            "heavy": list(self.heavy),
        }


@dataclass(frozen=True, slots=True)
class ShareSnapshot:
    time: float
    shares: str
    """``user`` or ``group`` (hierarchical fair share)."""
    window_seconds: float
    global_recent_tokens: float
    global_recent_units: float
    burst_credits_per_weight: float
    """The same for every user per unit of weight, so it never reorders anyone."""
    users: tuple[UserShare, ...]
    pools: tuple[PoolShare, ...]
    groups: Mapping[str | None, tuple[float | None, float | None]] = field(default_factory=dict)
    """Per group with demand, (target, actual) as ``targets.combined`` sums its members' seats (full snapshots only)."""

    def user(self, user_id: Hashable) -> UserShare | None:
        return next((u for u in self.users if u.user_id == user_id), None)


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Queue statistics in the seed's shape, plus per user and model detail."""

    time: float
    total: int
    running: int
    by_user: Mapping[str, int]
    by_user_name: Mapping[str, int]
    by_model: Mapping[str, int]
    average_wait_seconds: float
    oldest_wait_seconds: float
    by_user_model: Mapping[str, Mapping[str, int]]
    oldest_wait_by_user_model: Mapping[str, Mapping[str, float]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "by_user": dict(self.by_user),
            "by_model": dict(self.by_model),
            "average_wait_seconds": self.average_wait_seconds,
            "running": self.running,
            "by_user_name": dict(self.by_user_name),
            "oldest_wait_seconds": self.oldest_wait_seconds,
            "by_user_model": {k: dict(v) for k, v in self.by_user_model.items()},
            "oldest_wait_by_user_model": {k: dict(v) for k, v in self.oldest_wait_by_user_model.items()},
        }


def round_share(share: float | None) -> float | None:
    """A share as the views show it: to four places, None kept."""
    return None if share is None else round(share, 4)


def seed_snapshot(queue: QueueStats, share: ShareSnapshot) -> dict[str, Any]:
    """Queue statistics and fair share in the seed's shape (``mr queue --json``)."""
    return {
        "queue": queue.to_dict(),
        "fair_share": {
            "total_users": len(share.users),
            "global_recent_tokens": share.global_recent_tokens,
            "global_recent_units": share.global_recent_units,
            "user_stats": [u.to_dict() for u in share.users],
        },
    }
