"""Accounting routes: usage reports and quotas for admins, and ``GET /v1/me`` for each user.

``/v1/me`` answers with the caller's own key and shows only the caller's own
usage, quotas and fair-share standing; nothing about anyone else.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ...errors import RequestError
from ...localtime import day_start, iso_local, month_start, parse_when, zone_label
from ...scheduler import SchedulerSettings
from ...store import QUOTA_FIELDS, InvalidValue, Store
from ...store.worker import json_bytes
from ..edge.errorbodies import error_response
from ..edge.services import SERVICES
from ..usage.stats import BUCKET_SECONDS

__all__ = ["change_quota", "me_dict", "setup_accounting_routes", "top_panels"]

#: A quota this full is a warning in `mr top`.
WARN_AT = 0.8

DEFAULT_SINCE = "30d"


def _when(request: web.Request, name: str, default: str | None, now: float) -> float:
    spec = request.query.get(name) or default
    if spec is None:
        return now
    try:
        return parse_when(spec, now)
    except ValueError as exc:
        raise InvalidValue(f"--{name} {exc}") from None


async def get_usage(request: web.Request) -> web.Response:
    """``GET /admin/usage?by=user,model&since=7d&until=2026-12-01``: totals in the server's local calendar."""
    app = request.app
    now = app[SERVICES].quotas.wall()
    by = [d.strip() for d in request.query.get("by", "user").split(",") if d.strip()]
    since = _when(request, "since", DEFAULT_SINCE, now)
    until = _when(request, "until", None, now)
    settings = app[SERVICES].config.scheduler
    quotas = app[SERVICES].quotas.overview()

    def answer(store: Store) -> bytes:
        """The report, its rows priced and encoded: on the store's worker (30,000 rows took 30 ms on the loop)."""
        report = store.usage_report(by, since, until)
        for row in (*report.rows, report.total):
            with_units(row, settings)
        stamps = {"since": report.since, "until": report.until, "day_resolution_before": report.day_resolution_before}
        return json_bytes(
            {
                **report.to_dict(),
                **{f"{name}_at": iso_local(ts) for name, ts in stamps.items() if ts is not None},
                "timezone": zone_label(now),
                "quotas": [limit.to_dict() for limit in quotas],
            }
        )

    return web.Response(body=await app[SERVICES].store_worker.run(answer), content_type="application/json")


def with_units(row: dict[str, Any], settings: SchedulerSettings) -> dict[str, Any]:
    """Add ``service_units`` to a usage row: its tokens at the token costs in effect now (quotas stay in tokens)."""
    row["service_units"] = round(settings.cost(row["prompt_tokens"], row["completion_tokens"]), 3)
    return row


async def _set_quota(request: web.Request, subject: str) -> web.Response:
    """``PUT /admin/{users,groups}/{name}/quota`` with any of the limits (null removes one), or ``{"clear": true}``."""
    app = request.app
    try:
        data = await request.json()
    except ValueError:
        raise InvalidValue("the request body is not valid JSON") from None
    if not isinstance(data, dict) or not data:
        raise InvalidValue(f'give a JSON object with any of {", ".join(QUOTA_FIELDS)}, or {{"clear": true}}')
    return web.json_response(change_quota(app, subject, request.match_info["name"], data))


def change_quota(app: web.Application, subject: str, name: str, data: dict[str, Any]) -> dict[str, Any]:
    """Set a user's or group's limits (the admin API and the web UI): the row with its quotas and their use."""
    changes = dict.fromkeys(QUOTA_FIELDS) if data.pop("clear", False) is True else {}
    changes.update(data)
    store = app[SERVICES].store
    row = store.set_user_quota(name, changes) if subject == "user" else store.set_group_quota(name, changes)
    quotas = app[SERVICES].quotas
    quotas.reload()
    key = row.id if subject == "user" else row.name
    return {**row.to_dict(), "quotas": [limit.to_dict() for limit in quotas.subject_limits(subject, key)]}


async def set_user_quota(request: web.Request) -> web.Response:
    return await _set_quota(request, "user")


async def set_group_quota(request: web.Request) -> web.Response:
    return await _set_quota(request, "group")


async def get_me(request: web.Request) -> web.Response:
    """``GET /v1/me``: the caller's usage today and this month, quotas and fair-share standing."""
    app = request.app
    try:
        caller = app[SERVICES].auth.caller(request.headers.get("Authorization"))
    except RequestError as exc:
        return error_response(exc, "openai")
    return web.json_response(await me_dict(app, caller))


async def me_dict(app: web.Application, caller: Any) -> dict[str, Any]:
    """The caller's own usage today and this month, quotas and fair-share standing (``/v1/me``, the web UI).

    The usage is read on the store's worker thread: the loop serves others meanwhile.
    """
    quotas = app[SERVICES].quotas
    now = quotas.wall()
    starts = {"today": day_start(now), "month": month_start(now)}
    totals = await app[SERVICES].store_worker.run(
        lambda store: {
            p: store.usage_report([], t, now + 1e-3, user_id=caller.user_id).total for p, t in starts.items()
        }
    )
    units = app[SERVICES].config.scheduler
    periods = {p: {**with_units(total, units), "since": starts[p]} for p, total in totals.items()}
    return {
        "user": caller.name,
        "group": caller.group,
        "timezone": zone_label(now),
        **periods,
        "quotas": [limit.to_dict() for limit in quotas.limits(caller.user_id, caller.group)],
        "fair_share": _standing(app, caller.user_id),
    }


def _standing(app: web.Application, user_id: int) -> dict[str, Any]:
    """The caller's fair-share figures, and its place among the users active now (1 = served next).

    Reads the active users alone (``share(active=True)``), so it costs what they number, not the registered.
    """
    scheduler, now = app[SERVICES].scheduler, app[SERVICES].dispatcher.clock()
    if not scheduler.has_user(user_id):
        return {}
    share = scheduler.share(now, active=True)
    mine = share.user(user_id) or scheduler.share(now, [user_id]).users[0]
    active = [u for u in share.users if u.queued or u.running or u.recent_tokens]
    position = None
    if mine in active:
        position = 1 + sum(1 for u in active if u.deficit / u.weight > mine.deficit / mine.weight)
    row = mine.to_dict()
    return {
        "weight": mine.weight,
        "recent_tokens": mine.recent_tokens,
        "recent_units": round(mine.recent_units, 3),
        "factor": mine.factor,
        "queued": mine.queued,
        "running": mine.running,
        "target_share": row["target_share"],
        "actual_share": row["actual_share"],
        "pools": row["pools"],
        "deprioritized": mine.factor < 1,
        "position": position,
        "active_users": len(active),
    }


async def top_panels(app: web.Application) -> dict[str, Any]:
    """What `mr top` adds about accounting: today's heaviest users and models, quotas near their limit,
    and each backend's recent tokens per second (today's usage read on the store's worker thread)."""
    quotas = app[SERVICES].quotas
    now = quotas.wall()
    since = day_start(now)
    users, models = await app[SERVICES].store_worker.run(
        lambda store: (
            store.usage_report(["user"], since, now + 1e-3),
            store.usage_report(["model"], since, now + 1e-3),
        )
    )
    today = {"users": users.rows[:10], "models": models.rows[:10], "total": users.total}
    names = {bid: entry.row.name for bid, entry in app[SERVICES].registry.entries.items()}
    return {
        "usage_today": today,
        "quota_warnings": [
            limit.to_dict()
            for limit in quotas.overview()
            if limit.subject == "user" and limit.limit and limit.used >= WARN_AT * limit.limit
        ],
        "throughput": {
            "bucket_seconds": BUCKET_SECONDS,
            "backends": {names.get(bid, f"#{bid}"): rates for bid, rates in app[SERVICES].stats.throughput().items()},
        },
    }


def setup_accounting_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/admin/usage", get_usage)
    r.add_put("/admin/users/{name}/quota", set_user_quota)
    r.add_put("/admin/groups/{name}/quota", set_group_quota)
    r.add_get("/v1/me", get_me)
