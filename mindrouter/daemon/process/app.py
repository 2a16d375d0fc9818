"""The composition root: ``create_app(config)`` builds the daemon's one application.

It wires the pieces (store, core, dispatcher, registry, GPU poller, decision
log, quotas, usage) into one application; each background concern is a
``cleanup_ctx`` generator, so it starts with the app and stops with it.
``serve.py`` runs it as a process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web

from ...backends import set_aliases
from ...config import Config
from ...gpu.probe import GpuProbe
from ...scheduler import Scheduler
from ...store import Store
from ...store.worker import StoreWorker
from ..admin.api import setup_admin_routes
from ..admin.middleware import admin_middleware
from ..admin.transfer import setup_transfer_routes
from ..edge.accounting import setup_accounting_routes
from ..edge.answers import stamp
from ..edge.auth import Auth
from ..edge.catalog import setup_catalog_routes
from ..edge.cors import setup_cors
from ..edge.guard import guard_middleware
from ..edge.inference import end_handlers, setup_inference_routes
from ..edge.metrics import setup_metrics
from ..edge.services import SERVICES, Services
from ..pollers.discover import discover_local_backends
from ..pollers.gpus import GpuState
from ..pollers.registry import AdapterFactory, Registry
from ..pollers.retention import retention_ctx
from ..request.decisions import DecisionLog
from ..request.dispatcher import Dispatcher
from ..request.settlement import Settlement
from ..request.weights import apply_user
from ..ui import setup_ui
from ..usage.quotas import Quotas
from ..usage.stats import Stats
from ..usage.writer import UsageWriter
from .roles import setup_leadership

__all__ = ["create_app"]

log = logging.getLogger("mindrouter.daemon")


async def create_app(
    config: Config, *, nvml: Any = None, discover: bool | None = None, adapters: AdapterFactory | None = None
) -> web.Application:
    """The daemon's application, ready to be served.

    Args:
        config: the settings.
        nvml: a ``pynvml`` stand-in (tests); defaults to the real module.
        discover: look for local servers when no backend is configured;
            defaults to ``config.server.discover``.
        adapters: builds each backend's adapter from its row (tests: in-process backends);
            defaults to the engine's adapter over HTTP.
    """
    server = config.server
    app = web.Application(client_max_size=server.max_body_bytes, middlewares=[guard_middleware, admin_middleware])
    store = Store(
        server.state_path / "mindrouter.db",
        max_decisions=server.decision_retention,
        usage_retention=server.usage_retention_days * 86400.0,
        prune_inline=False,
        url=config.store.url,
    )
    worker = StoreWorker(
        store.path,
        usage_retention=store.usage_retention,
        decision_days=server.decision_retention_days,
        url=config.store.url,
    )
    store.checkpoint_in_background()  # a checkpoint's fsyncs never stall the loop (store/checkpoint.py)
    shared = bool(config.store.url)  # routers share the store; the leader recovers and restores (roles.py)
    recovered = 0 if shared else store.recover_open_usage()
    if recovered:
        log.info("recorded the usage of %d streams that were cut when the daemon last stopped", recovered)
    created = store.ensure_default_groups(config.scheduler.group_weights)
    if created:
        log.info("created the default groups %s", ", ".join(created))
    set_aliases(store.list_aliases())  # before any backend's models are keyed
    scheduler = Scheduler(config.scheduler)
    for group in store.list_groups():
        scheduler.set_group(group.name, group.scheduler_weight)
    for user in store.list_users():
        apply_user(scheduler, user.id, user)
    if not shared:
        _restore_usage(store, scheduler, config)
    # Idle keep-alive connections are closed after 2 s: servers such as llama-server hold an
    # HTTP thread per open connection (4 threads with -np 2), so a pool that kept them for
    # long would lock out everyone else talking to that server. Under load they are reused
    # within milliseconds, so this costs no reconnects. Answers are asked for uncompressed (a
    # compressing proxy in front of a backend then sends them plain); one compressed anyway is
    # decompressed as it is read, so every limit on what is read counts its decompressed bytes.
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=2.0, enable_cleanup_closed=True),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=config.backends.connect_timeout),
        headers={"Accept-Encoding": "identity"},
    )
    decisions = DecisionLog(store, lambda bid: registry.entries[bid].row.name if bid in registry.entries else None)
    quotas = Quotas(
        store,
        scheduler,
        default_completion=config.scheduler.default_completion_tokens,
        queue_timeout=config.scheduler.queue_timeout,
    )
    usage = UsageWriter(store, on_usage=quotas.record)
    stats = Stats()
    gpus = GpuState(
        GpuProbe(nvml),
        session,
        poll_interval=server.gpu_poll_interval,
        agent_key=server.agent_key or None,
        nodes=lambda: {e.row.node for e in registry.entries.values() if e.row.node},
        on_change=lambda: registry.republish_all(),
    )
    registry = Registry(
        scheduler,
        store,
        session,
        config.backends,
        on_change=lambda: dispatcher.pump(),
        gpu_lookup=gpus.lookup,
        vram_estimate=gpus.vram_estimate,
        adapters=adapters,
    )

    def settled(settlement: Settlement) -> None:
        usage.settled(settlement)
        stats.settled(settlement)
        decisions.settled(settlement)

    dispatcher = Dispatcher(
        scheduler,
        registry,
        on_settled=settled,
        quotas=quotas,
        on_streamed=usage.streamed,
        max_retries=config.backends.max_retries,
    )

    app[SERVICES] = Services(
        config=config,
        store=store,
        scheduler=scheduler,
        dispatcher=dispatcher,
        registry=registry,
        auth=Auth(store, new_people_per_hour=server.new_people_per_hour),
        quotas=quotas,
        stats=stats,
        usage=usage,
        decisions=decisions,
        gpus=gpus,
        session=session,
        store_worker=worker,
    )

    want_discovery = server.discover if discover is None else discover

    async def resources(_app: web.Application) -> AsyncIterator[None]:
        try:
            registry.probing = not shared  # on a shared store, the leader alone probes, once it leads
            if want_discovery and not shared and not store.list_backends():
                for row in await discover_local_backends(session, store):
                    log.info(
                        "found %s at %s (%s) and added it as backend %r; `mr backend rm %s` removes it",
                        row.engine,
                        row.url,
                        row.engine,
                        row.name,
                        row.name,
                    )
            await registry.start(first_probe_timeout=config.backends.connect_timeout)
            yield
        finally:
            await registry.stop()
            await session.close()
            decisions.flush()
            usage.write()
            store.close()

    app.cleanup_ctx.append(resources)
    services = app[SERVICES]
    app.cleanup_ctx.append(retention_ctx(worker, lambda: services.leading, lambda: services.epoch))
    app.cleanup_ctx.append(decisions.flush_ctx)
    app.cleanup_ctx.append(dispatcher.timer_ctx)
    app.cleanup_ctx.append(gpus.poll_ctx)
    if shared:
        setup_leadership(app, lambda: _restore_usage(store, scheduler, config))
    app.on_shutdown.append(end_handlers)  # runs before the cleanup contexts close the resources
    setup_inference_routes(app)
    setup_catalog_routes(app)
    setup_cors(app, server.cors_origins)
    setup_admin_routes(app)
    setup_transfer_routes(app)
    setup_accounting_routes(app)
    app.on_response_prepare.append(stamp)
    setup_metrics(app)
    setup_ui(app)
    return app


def _restore_usage(store: Store, scheduler: Scheduler, config: Config) -> None:
    """Replay the fairness window's usage from before a restart."""
    wall, mono = time.time(), time.monotonic()
    rows = store.recent_usage(wall - config.scheduler.fairness_window)
    for row in rows:
        scheduler.add_usage(row.user_id, row.prompt_tokens, row.completion_tokens, mono - (wall - row.at), row.model)
    if rows:
        log.info(
            "restored %d usage records from the last %.0f s for fair share", len(rows), config.scheduler.fairness_window
        )
