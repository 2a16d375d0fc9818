"""What the pool is doing, read-only, for the admin API: status, queue, fair share, decisions, GPUs, `mr top`.

Each route builds its answer from the core's and the registry's snapshots
(``views.py`` holds the pure shaping); nothing here changes state.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from aiohttp import web

from ... import __version__
from ...store import InvalidValue, NotFound, Store
from ...store.worker import json_bytes
from ..edge.accounting import top_panels
from ..edge.services import SERVICES
from .views import Counters, share_view, standby_sentence, status_view, top_view

__all__ = ["quota_rows", "setup_watch_routes", "status_dict"]


# -- status --------------------------------------------------------------------------


def status_dict(app: web.Application) -> dict[str, Any]:
    registry, scheduler, stats, config = (
        app[SERVICES].registry,
        app[SERVICES].scheduler,
        app[SERVICES].stats,
        app[SERVICES].config,
    )
    rps, tps = stats.rates()
    entries = list(registry.entries.values())
    counters = Counters(
        stats.uptime, stats.requests_total, stats.prompt_tokens_total + stats.completion_tokens_total, rps, tps
    )
    return status_view(
        counters,
        version=__version__,
        backend_states=[registry.status(e) for e in entries],
        unreachable_nodes=[e.row.node for e in entries if e.row.node and app[SERVICES].gpus.node_error(e.row.node)],
        queued=scheduler.queued_count,
        running=scheduler.running_count,
        users=app[SERVICES].store.count_users(),
        listen=f"http://{config.server.host}:{config.server.port}",
        socket=str(config.server.socket_path),
        role=app[SERVICES].role,
        standby=None if app[SERVICES].leading else standby_sentence(app[SERVICES].leader),
    )


async def get_status(request: web.Request) -> web.Response:
    return web.json_response(status_dict(request.app))


def quota_rows(app: web.Application, subject: str, key: Any) -> list[dict[str, Any]]:
    """A user's (by id) or group's (by name) quotas with their use so far."""
    return [limit.to_dict() for limit in app[SERVICES].quotas.subject_limits(subject, key)]


# -- the pool's state -------------------------------------------------------------------


def queue_dict(app: web.Application) -> dict[str, Any]:
    return app[SERVICES].scheduler.snapshot(app[SERVICES].dispatcher.clock())


async def get_queue(request: web.Request) -> web.Response:
    return web.json_response(queue_dict(request.app))


def backend_names(app: web.Application) -> dict[str, str]:
    """Backend id (as pools and decision records name it) -> its name."""
    return {str(bid): entry.row.name for bid, entry in app[SERVICES].registry.entries.items()}


def _share_of(app: web.Application) -> Callable[[Store], dict[str, Any]]:
    """``mr share``: per group and user what the weights entitle it to, what it used, and the terms that act.

    The active people's standing and the quotas set are read here, on the loop (what they number);
    the returned function, given a ``Store``, adds a row for every registered user: run it on the
    store's worker thread, where 10,000 rows cost the loop nothing.
    """
    services = app[SERVICES]
    share = services.scheduler.share(services.dispatcher.clock(), active=True)
    limits = services.quotas.by_subject()
    names = backend_names(app)

    def quotas(kind: str, key: Any) -> list[dict[str, Any]]:
        return [limit.to_dict() for limit in limits.get((kind, key), ())]

    return lambda store: share_view(
        share, store.list_users(), store.list_groups(), store.users_per_group(), quotas, names
    )


async def share_dict(app: web.Application) -> dict[str, Any]:
    return await app[SERVICES].store_worker.run(_share_of(app))


async def get_share(request: web.Request) -> web.Response:
    build = _share_of(request.app)
    body = await request.app[SERVICES].store_worker.run(lambda store: json_bytes(build(store)))  # 10,000 rows
    return web.Response(body=body, content_type="application/json")


def _limit(request: web.Request, default: int = 50) -> int:
    raw = request.query.get("limit", str(default))
    try:
        limit = int(raw)
    except ValueError:
        raise InvalidValue(f"limit {raw!r} is not a whole number") from None
    if limit < 1:
        raise InvalidValue("limit must be at least 1")
    return min(limit, 10_000)


async def list_decisions(request: web.Request) -> web.Response:
    """`mr decisions`: up to 10,000 records of about 1 KB, read and encoded on the store's worker thread."""
    services = request.app[SERVICES]
    limit, user = _limit(request), request.query.get("user") or None
    services.decisions.flush()  # what has ended is in the store before the worker reads it
    body = await services.store_worker.run(lambda store: json_bytes(store.recent_decisions(limit, user=user)))
    return web.Response(body=body, content_type="application/json")


async def get_decision(request: web.Request) -> web.Response:
    rid = request.match_info["request_id"]
    record = request.app[SERVICES].decisions.get(rid)
    if record is None:
        raise NotFound(f"no decision record for request {rid!r}; `mr decisions` lists recent ones")
    return web.json_response(record)


async def follow_decisions(request: web.Request) -> web.StreamResponse:
    log = request.app[SERVICES].decisions
    user = request.query.get("user") or None
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-cache"})
    await response.prepare(request)
    queue = log.follow()
    try:
        while True:
            line = await queue.get()
            if user is not None and json.loads(line).get("user") != user:
                continue
            await response.write(line)
    finally:
        log.unfollow(queue)


async def get_gpus(request: web.Request) -> web.Response:
    return web.json_response(request.app[SERVICES].gpus.nodes())


async def get_top(request: web.Request) -> web.Response:
    """`mr top`: the live state read on the loop; the share's row per registered user and the JSON on the
    store's worker thread."""
    app = request.app
    services = app[SERVICES]
    registry = services.registry
    share = _share_of(app)
    live: dict[str, Any] = {
        "status": status_dict(app),
        "backends": [registry.row_dict(e) for e in registry.entries.values()],
        "gpus": services.gpus.nodes(),
        "queue": queue_dict(app),
        "decisions": services.decisions.recent(10),
        "panels": await top_panels(app),
    }
    body = await services.store_worker.run(
        lambda store: json_bytes(top_view(**live, share=share(store)), default=_finite)
    )
    return web.Response(body=body, content_type="application/json")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"cannot encode {type(value).__name__}")


def setup_watch_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/admin/status", get_status)
    r.add_get("/admin/queue", get_queue)
    r.add_get("/admin/share", get_share)
    r.add_get("/admin/decisions", list_decisions)
    r.add_get("/admin/decisions/stream", follow_decisions)
    r.add_get("/admin/decisions/{request_id}", get_decision)
    r.add_get("/admin/gpus", get_gpus)
    r.add_get("/admin/top", get_top)
