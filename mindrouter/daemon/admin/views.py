"""What `mr status`, `mr queue`, `mr share` and `mr top` show, as pure functions of snapshots.

The admin handlers read frozen snapshots (the core's ``share(now)`` and
``snapshot(now)``, the store's rows, the counters) and pass them here; nothing
in this module does I/O or reaches into the core, so each view is tested with
plain values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...scheduler.views import round_share

__all__ = ["Counters", "share_view", "status_view", "top_view"]

QuotaLookup = Callable[[str, Any], list[dict[str, Any]]]
"""(``"user"``, user id) or (``"group"``, name) -> that subject's quotas with their use."""


@dataclass(frozen=True, slots=True)
class Counters:
    """The daemon's request counters at one moment (from ``Stats``)."""

    uptime: float
    requests_total: int
    tokens_total: int
    requests_per_second: float
    tokens_per_second: float


def status_view(
    counters: Counters,
    *,
    version: str,
    backend_states: Sequence[str],
    unreachable_nodes: Iterable[str],
    queued: int,
    running: int,
    users: int,
    listen: str,
    socket: str,
    role: str = "leader",
    standby: str | None = None,
) -> dict[str, Any]:
    """`mr status`: one line per fact about the daemon.

    Args:
        standby: on a standby, the sentence its live views show (``standby_sentence``); else None.
    """
    return {
        "version": version,
        "uptime_seconds": round(counters.uptime, 3),
        "backends": len(backend_states),
        "backends_healthy": sum(1 for state in backend_states if state == "healthy"),
        "nodes_unreachable": sorted(set(unreachable_nodes)),
        "queue_total": queued,
        "running": running,
        "users": users,
        "requests_total": counters.requests_total,
        "tokens_total": counters.tokens_total,
        "requests_per_second": round(counters.requests_per_second, 3),
        "tokens_per_second": round(counters.tokens_per_second, 3),
        "listen": listen,
        "socket": socket,
        "role": role,
        "standby": standby,
    }


def standby_sentence(leader: str) -> str:
    """What a standby's live views (Live, `mr top`) say: it schedules nothing, and which router does."""
    who = f"{leader} leads" if leader else "no router leads yet"
    return f"This router is a standby and schedules nothing, so its live views stay empty: {who}."


def _seat_dict(seat: Any, names: Mapping[str, str]) -> dict[str, Any]:
    """A user's standing in one pool, its backends named."""
    return {**seat.to_dict(), "names": [names.get(b, f"#{b}") for b in seat.backends]}


def share_view(
    share: Any,
    users: Sequence[Any],
    groups: Sequence[Any],
    members: Mapping[str, int],
    quotas: QuotaLookup,
    names: Mapping[str, str],
) -> dict[str, Any]:
    """`mr share`: per group and user its target and actual share (``scheduler/targets.py``), and the terms that act.

    A target is a share of the pools one has demand in; idle people and groups have none (None).

    Args:
        share: the core's ``share(now)`` snapshot.
        users, groups: the store's rows: every user, or those of ``share`` (the people active now).
        members: each group's count of users (``Store.users_per_group``).
        quotas: each subject's quotas with their use so far.
        names: backend id -> name, to name each pool by its backends.
    """
    live = {u.user_id: u for u in share.users}
    total = share.global_recent_tokens
    rows = []
    for user in users:
        state = live.get(user.id)
        recent = state.recent_tokens if state else 0.0
        units = state.recent_units if state else 0.0
        pools = [_seat_dict(seat, names) for seat in state.seats] if state else []
        rows.append(
            {
                "name": user.name,
                "group": user.group,
                "weight": user.weight,
                "weight_override": user.weight_override,
                "target_share": round_share(state.target_share) if state else None,
                "actual_share": round_share(state.actual_share) if state else None,
                "recent_tokens": recent,
                "recent_units": round(units, 3),
                "token_share": round(recent / total, 4) if total else 0.0,
                "unit_share": round(units / share.global_recent_units, 4) if share.global_recent_units else 0.0,
                "deficit": round(state.deficit, 3) if state else 0.0,
                "factor": round(state.factor, 4) if state else 1.0,
                "queued": state.queued if state else 0,
                "running": state.running if state else 0,
                "pools": pools,
                "proxy": user.proxy,
                "person_of": user.person_of,
                "quotas": quotas("user", user.id),
            }
        )
    group_rows = []
    for group in groups:
        own = [r for r in rows if r["group"] == group.name]
        recent = sum(r["recent_tokens"] for r in own)
        units = sum(r["recent_units"] for r in own)
        target, actual = share.groups.get(group.name, (None, None))
        group_rows.append(
            {
                "name": group.name,
                "weight": group.scheduler_weight,
                "target_share": round_share(target),
                "actual_share": round_share(actual),
                "recent_tokens": recent,
                "recent_units": round(units, 3),
                "token_share": round(recent / total, 4) if total else 0.0,
                "unit_share": round(units / share.global_recent_units, 4) if share.global_recent_units else 0.0,
                "users": members.get(group.name, 0),
                "quotas": quotas("group", group.name),
            }
        )
    return {
        "window_seconds": share.window_seconds,
        "shares": share.shares,
        "global_recent_tokens": total,
        "global_recent_units": round(share.global_recent_units, 3),
        "groups": group_rows,
        "users": rows,
        "pools": [p.to_dict() for p in share.pools],
    }


def top_view(
    *,
    status: Mapping[str, Any],
    backends: Sequence[Mapping[str, Any]],
    gpus: Any,
    queue: Mapping[str, Any],
    share: Mapping[str, Any],
    decisions: Sequence[Mapping[str, Any]],
    panels: Mapping[str, Any],
) -> dict[str, Any]:
    """`mr top`: every view at once, so one call draws a frame."""
    return {
        "status": status,
        "backends": backends,
        "gpus": gpus,
        "queue": queue,
        "share": share,
        "decisions": decisions,
        **panels,
    }
