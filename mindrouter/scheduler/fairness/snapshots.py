"""Frozen snapshots of fairness's state (``views.py``'s values), built on demand.

Invariant: building one moves no seat. Each pool's reference is read once
(``Pool.reference()``, which drops stale entries as every read does), so all
seats of a pool are shown from the same V.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping

from ..jobs import Job
from ..pooling import PoolKey
from ..targets import Part, combined, pool_targets
from ..views import PoolShare, QueueStats, SeatShare, ShareSnapshot, UserShare
from .pools import Pool, Seat, UserState

__all__ = ["build_queue_stats", "build_share", "demand", "pending_usage"]


def _backends(pool: Pool) -> tuple[str, ...]:
    return tuple(sorted(str(b) for b in pool.key))


def demand(seat: Seat) -> bool:
    """Whether ``seat`` counts in its pool's division: queued, running, or served within the window."""
    return bool(seat.recent > 0 or seat.queued or seat.running)


def _targets(pool: Pool) -> dict[Hashable, float]:
    return pool_targets({uid: s.weight for uid, s in pool.seats.items() if demand(s)})


def _seat_share(
    pool: Pool, seat: Seat, reference: float, targets: Mapping[Hashable, float], backends: tuple[str, ...]
) -> SeatShare:
    return SeatShare(
        backends=backends,
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
        target_share=targets.get(seat.user.id),
        actual_share=seat.recent / pool.recent_total if pool.recent_total > 0 else 0.0,
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
    complete: bool = True,
) -> ShareSnapshot:
    """Every user's standing, per pool and in sum, and (``with_pools``) every pool, as ``users`` use it.

    ``pending``: per user, restored (tokens, service units) whose model no backend serves yet.
    ``complete``: ``users`` hold everyone with demand (all users, or the active ones), so each pool's
    targets come from their seats, not from a walk over every seat the pool ever gave.
    """
    pools = list(pools)
    users = list(users)
    references = {pool.key: pool.reference() for pool in pools}
    seats: dict[Hashable, list[SeatShare]] = {}
    parts: dict[Hashable, list[Part]] = {}
    pool_rows = []
    by_pool: dict[PoolKey, dict[Hashable, float]] = {}
    for pool in pools:
        ref = references[pool.key]
        here = [seat for seat in (pool.seats.get(user.id) for user in users) if seat is not None]
        if not here and not with_pools:
            continue  # made for the pools the users asked for sit in only
        targets = by_pool[pool.key] = (
            pool_targets({s.user.id: s.weight for s in here if demand(s)}) if complete else _targets(pool)
        )
        backends = _backends(pool)
        for seat in here:
            shown = _seat_share(pool, seat, ref, targets, backends)
            seats.setdefault(seat.user.id, []).append(shown)
            if shown.target_share is not None:
                parts.setdefault(seat.user.id, []).append((shown.target_share, seat.recent, pool.recent_total))
        if not with_pools:
            continue
        names = tuple(s.user.name for s in here if demand(s))
        heavy = tuple(pool.seats[u].user.name for u in pool.heavy if u in pool.seats)
        tokens = sum(s.recent_tokens for s in here)
        pool_rows.append(PoolShare(backends, names, ref, pool.credit(), tokens, pool.recent_total, heavy))
    rows = []
    total_recent = total_units = 0.0
    for user in users:
        mine = tuple(seats.get(user.id, ()))
        pending_tokens, pending_units = pending.get(user.id, (0.0, 0.0))
        recent = sum(s.recent_tokens for s in mine) + pending_tokens
        units = sum(s.recent_units for s in mine) + pending_units
        total_recent += recent
        total_units += units
        target, actual = combined(parts.get(user.id, ()))
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
                target_share=target,
                actual_share=actual,
            )
        )
    groups = _group_shares(pools, by_pool) if with_pools else {}
    return ShareSnapshot(now, shares, window, total_recent, total_units, burst, tuple(rows), tuple(pool_rows), groups)


def _group_shares(
    pools: Iterable[Pool], by_pool: Mapping[PoolKey, Mapping[Hashable, float]]
) -> dict[str | None, tuple[float | None, float | None]]:
    """Each group's target and actual share: its members' seats summed per pool (``by_pool``: each pool's
    targets), then ``combined``."""
    parts: dict[str | None, list[Part]] = {}
    for pool in pools:
        targets = by_pool[pool.key]
        per_group: dict[str | None, tuple[float, float]] = {}
        for uid, target in targets.items():
            seat = pool.seats[uid]
            had = per_group.get(seat.user.group, (0.0, 0.0))
            per_group[seat.user.group] = (had[0] + target, had[1] + seat.recent)
        for group, (target, own) in per_group.items():
            parts.setdefault(group, []).append((target, own, pool.recent_total))
    return {group: combined(p) for group, p in parts.items()}


def pending_usage(
    backlog: Iterable[tuple[str, list[tuple[Hashable, float, float, float]]]],
    horizon: float,
    cost: Callable[[str, float, float], float],
) -> dict[Hashable, tuple[float, float]]:
    """Per user, restored (tokens, service units) since ``horizon`` that waits for its model's pool."""
    pending: dict[Hashable, tuple[float, float]] = {}
    for model, entries in backlog:
        for uid, prompt, completion, at in entries:
            if at >= horizon:
                tokens, units = pending.get(uid, (0.0, 0.0))
                pending[uid] = (tokens + prompt + completion, units + cost(model, prompt, completion))
    return pending
