"""Frozen snapshots of fairness's state (``views.py``'s values), built on demand.

Invariant: building one moves no seat. Each pool's reference is read once
(``Pool.reference()``, which drops stale entries as every read does), so all
seats of a pool are shown from the same V.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping

from ..jobs import Job
from ..views import PoolShare, QueueStats, SeatShare, ShareSnapshot, UserShare
from .pools import Pool, Seat, UserState

__all__ = ["build_queue_stats", "build_share", "pending_usage"]


def _backends(pool: Pool) -> tuple[str, ...]:
    return tuple(sorted(str(b) for b in pool.key))


def _seat_share(pool: Pool, seat: Seat, reference: float) -> SeatShare:
    return SeatShare(
        backends=_backends(pool),
        weight=seat.weight,
        deficit=(seat.lag - reference) * seat.weight,
        inflight_charge=seat.inflight,
        recent_tokens=seat.recent_tokens,
        recent_units=seat.recent,
        usage_fraction=pool.usage_fraction(seat),
        factor=seat.factor,
        queued=seat.queued,
        running=seat.running,
        served=seat.served,
    )


def build_queue_stats(jobs: Iterable[Job], running: int, users: Mapping[Hashable, UserState], now: float) -> QueueStats:
    by_user: dict[str, int] = {}
    by_name: dict[str, int] = {}
    by_model: dict[str, int] = {}
    by_user_model: dict[str, dict[str, int]] = {}
    oldest: dict[str, dict[str, float]] = {}
    total_wait = 0.0
    count = 0
    for job in jobs:
        count += 1
        wait = now - job.submitted_at
        user = users.get(job.user_id)
        name = user.name if user is not None else str(job.user_id)
        by_user[str(job.user_id)] = by_user.get(str(job.user_id), 0) + 1
        by_name[name] = by_name.get(name, 0) + 1
        by_model[job.model] = by_model.get(job.model, 0) + 1
        per = by_user_model.setdefault(name, {})
        per[job.model] = per.get(job.model, 0) + 1
        waits = oldest.setdefault(name, {})
        waits[job.model] = round(max(waits.get(job.model, 0.0), wait), 3)
        total_wait += wait
    return QueueStats(
        time=now,
        total=count,
        running=running,
        by_user=by_user,
        by_user_name=by_name,
        by_model=by_model,
        average_wait_seconds=round(total_wait / count, 3) if count else 0.0,
        oldest_wait_seconds=max((w for m in oldest.values() for w in m.values()), default=0.0),
        by_user_model=by_user_model,
        oldest_wait_by_user_model=oldest,
    )


def build_share(
    users: Iterable[UserState],
    pools: Iterable[Pool],
    now: float,
    shares: str,
    window: float,
    burst: float,
    pending: Mapping[Hashable, tuple[float, float]],
    with_pools: bool = True,
) -> ShareSnapshot:
    """Every user's standing, per pool and in sum, and (``with_pools``) every pool, as ``users`` use it.

    ``pending``: per user, restored (tokens, service units) whose model no backend serves yet.
    """
    pools = list(pools)
    users = list(users)
    references = {pool.key: pool.reference() for pool in pools}
    seats: dict[Hashable, list[SeatShare]] = {}
    pool_rows = []
    for pool in pools:
        ref = references[pool.key]
        here = [seat for seat in (pool.seats.get(user.id) for user in users) if seat is not None]
        for seat in here:
            seats.setdefault(seat.user.id, []).append(_seat_share(pool, seat, ref))
        if not with_pools:
            continue
        names = tuple(s.user.name for s in here if s.recent > 0 or s.queued or s.running)
        heavy = tuple(pool.seats[u].user.name for u in pool.heavy if u in pool.seats)
        tokens = sum(s.recent_tokens for s in here)
        pool_rows.append(PoolShare(_backends(pool), names, ref, pool.credit(), tokens, pool.recent_total, heavy))
    rows = []
    total_recent = total_units = 0.0
    for user in users:
        mine = tuple(seats.get(user.id, ()))
        pending_tokens, pending_units = pending.get(user.id, (0.0, 0.0))
        recent = sum(s.recent_tokens for s in mine) + pending_tokens
        units = sum(s.recent_units for s in mine) + pending_units
        total_recent += recent
        total_units += units
        rows.append(
            UserShare(
                user_id=user.id,
                name=user.name,
                group=user.group,
                weight=user.weight,
                weight_override=user.override,
                deficit=sum(s.deficit for s in mine),
                inflight_charge=sum(s.inflight_charge for s in mine),
                recent_tokens=recent,
                recent_units=units,
                usage_fraction=max((s.usage_fraction for s in mine), default=0.0),
                factor=min((s.factor for s in mine), default=1.0),
                queued=user.queued,
                running=user.running,
                served=user.served,
                seats=mine,
            )
        )
    return ShareSnapshot(now, shares, window, total_recent, total_units, burst, tuple(rows), tuple(pool_rows))


def pending_usage(
    backlog: Iterable[list[tuple[Hashable, float, float, float]]], horizon: float, cost: Callable[[float, float], float]
) -> dict[Hashable, tuple[float, float]]:
    """Per user, restored (tokens, service units) since ``horizon`` that waits for its model's pool."""
    pending: dict[Hashable, tuple[float, float]] = {}
    for entries in backlog:
        for uid, prompt, completion, at in entries:
            if at >= horizon:
                tokens, units = pending.get(uid, (0.0, 0.0))
                pending[uid] = (tokens + prompt + completion, units + cost(prompt, completion))
    return pending
