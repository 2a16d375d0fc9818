"""Leader or standby: what a router on a shared PostgreSQL store does in each role (docs/scale.md).

A router on SQLite always leads (``Services.leading``). On PostgreSQL
(``[store] url``) each router starts as a standby: it answers ``GET /health`` with 503
"standby", inference with 503 and ``Retry-After`` in the request's dialect, and serves
the admin API and web UI (their writes go to the database, and every router hears of
them). The one that wins the
leader lock (``pollers/leader.py``) rebuilds what a restart rebuilds (the streams a dead
leader left open become usage, fair share replays the fairness window's usage rows,
quotas recount from the totals), holds the backends' slots busy until their gauges
say the old leader's generations ended (without gauges: the slots its open streams had, for
``takeover_hold_seconds``), starts probing the backends, and from then on
schedules and dispatches. A standby's registry mirrors the store's backends without
probing them: only the leader polls, drains and disables.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from ..admin.aliases import apply_aliases
from ..edge.services import SERVICES
from ..pollers.leader import Leadership
from ..request.weights import apply_user

__all__ = ["setup_leadership", "sync_pool"]

log = logging.getLogger(__name__)


def sync_pool(app: web.Application) -> None:
    """Bring groups, users, keys and quotas in memory in line with the store (after a write anywhere)."""
    services = app[SERVICES]
    store, scheduler = services.store, services.scheduler
    services.auth.clear()
    services.quotas.reload()
    for group in store.list_groups():
        scheduler.set_group(group.name, group.scheduler_weight)
    for user in store.list_users():
        apply_user(scheduler, user.id, user)


def setup_leadership(app: web.Application, restore_usage: Callable[[], None]) -> None:
    """Contend for leadership of ``[store] url``'s pool for as long as the app runs.

    Args:
        restore_usage: replays the fairness window's usage into the scheduler (as a restart does).
    """
    services = app[SERVICES]
    tasks: set[asyncio.Task[None]] = set()

    async def on_lead(epoch: int) -> None:
        store = services.store
        store.fence(epoch)
        open_streams = store.open_streams()
        recovered = store.recover_open_usage()
        if recovered:
            log.info("recorded the usage of %d streams the last leader was cut in", recovered)
        sync_pool(app)
        apply_aliases(app)
        services.quotas.restore()
        restore_usage()
        await services.registry.sync(store.list_backends())
        services.registry.inherit(open_streams)
        services.registry.probe_all()
        # Serving before a backend's first probe would answer 404 for its models. Bounded: the lock's
        # session is silent meanwhile, and the server ends it after 3 s of silence.
        await services.registry.first_probes(1.0)

    def on_change(table: str) -> None:
        if table in ("groups", "users"):
            sync_pool(app)
        elif table == "api_keys":
            services.auth.clear()
        elif table == "model_aliases":
            apply_aliases(app)
        elif table == "backends":
            task = asyncio.create_task(services.registry.sync(services.store.list_backends()))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    def on_lost() -> None:
        # At once, status 1: nothing it holds may be written any more (it is fenced), closing its
        # connections ends its generations at the backends for the new leader, and systemd's
        # Restart=on-failure (docs/systemd) starts it again, as a standby.
        os._exit(1)

    server = services.config.server
    host = socket.gethostname() if server.host in ("", "0.0.0.0", "::") else server.host
    leadership = Leadership(
        services.config.store.url,
        on_lead=on_lead,
        on_change=on_change,
        on_lost=on_lost,
        name=f"http://{host}:{server.port}",  # a standby's live views name the leader by it
    )
    services.leadership = leadership

    async def contend(_app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(leadership.run(), name="leadership")
        yield
        task.cancel()
        await asyncio.gather(task, *tasks, return_exceptions=True)

    app.cleanup_ctx.append(contend)
