"""Building and running the daemon: one aiohttp app on the TCP port and the admin Unix socket.

``create_app(config)`` wires the pieces (store, core, dispatcher, registry,
GPU poller, decision log) into one application; each background concern is a
``cleanup_ctx`` generator, so it starts with the app and stops with it.
``serve(config)`` runs it until SIGTERM or SIGINT, then lets in-flight
requests finish for ``shutdown_grace_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import grp
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from ... import __version__
from ...config import Config, check_keys
from ...errors import ConfigError
from ...gpu.probe import GpuProbe
from ...scheduler import Scheduler
from ...store import Store
from ...store.worker import StoreWorker
from ..admin.api import setup_admin_routes
from ..admin.middleware import admin_middleware
from ..pollers.discover import discover_local_backends
from ..pollers.gpus import GpuState
from ..pollers.registry import AdapterFactory, Registry
from ..pollers.retention import retention_ctx
from ..pollers.stats import Stats
from ..process.appkeys import (
    AUTH,
    CONFIG,
    DECISIONS,
    DISPATCHER,
    GPUS,
    HANDLERS,
    QUOTAS,
    REGISTRY,
    SCHEDULER,
    SESSION,
    STATS,
    STORE,
    STORE_WORKER,
)
from ..process.listen import port_taken, refuse_a_busy_port
from ..process.logsafe import OneLineFormatter
from ..process.statelock import StateLock
from ..request.accounting import setup_accounting_routes
from ..request.decisions import DecisionLog
from ..request.dispatcher import Dispatcher
from ..request.quotas import Quotas
from ..request.settlement import Settlement
from ..request.weights import apply_user
from ..ui import setup_ui
from .answers import Runner, stamp
from .auth import Auth
from .catalog import setup_catalog_routes
from .cors import setup_cors
from .guard import guard_middleware
from .inference import end_handlers, setup_inference_routes
from .metrics import setup_metrics

__all__ = ["create_app", "make_runner", "serve"]

log = logging.getLogger("mindrouter.daemon")

YOUNG_COLLECTION_EVERY = 7000
"""Allocations between young collections (Python's default: 700). What a request allocates is almost
all freed by reference counting as it ends, but each young collection walks every in-flight request's
live objects. Ten times less often, the daemon spent 6-7% less CPU per request at 64 clients (within
the noise at 16) with a shorter tail, and its longest collection stayed 3-4 ms (docs/performance.md)."""


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
    )
    worker = StoreWorker(
        store.path, usage_retention=store.usage_retention, decision_days=server.decision_retention_days
    )
    store.checkpoint_in_background()  # a checkpoint's fsyncs never stall the loop (store/checkpoint.py)
    recovered = store.recover_open_usage()
    if recovered:
        log.info("recorded the usage of %d streams that were cut when the daemon last stopped", recovered)
    created = store.ensure_default_groups(config.scheduler.group_weights)
    if created:
        log.info("created the default groups %s", ", ".join(created))
    scheduler = Scheduler(config.scheduler)
    for group in store.list_groups():
        scheduler.set_group(group.name, group.scheduler_weight)
    for user in store.list_users():
        apply_user(scheduler, user.id, user)
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
    stats = Stats(store, on_usage=quotas.record)
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
        stats.settled(settlement)
        decisions.settled(settlement)

    dispatcher = Dispatcher(
        scheduler,
        registry,
        on_settled=settled,
        quotas=quotas,
        on_streamed=stats.streamed,
        max_retries=config.backends.max_retries,
    )

    app[CONFIG] = config
    app[STORE] = store
    app[STORE_WORKER] = worker
    app[SCHEDULER] = scheduler
    app[DISPATCHER] = dispatcher
    app[REGISTRY] = registry
    app[AUTH] = Auth(store, new_people_per_hour=server.new_people_per_hour)
    app[QUOTAS] = quotas
    app[STATS] = stats
    app[DECISIONS] = decisions
    app[GPUS] = gpus
    app[SESSION] = session

    want_discovery = server.discover if discover is None else discover

    async def resources(_app: web.Application) -> AsyncIterator[None]:
        try:
            if want_discovery and not store.list_backends():
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
            stats.write_usage()
            store.close()

    app.cleanup_ctx.append(resources)
    app.cleanup_ctx.append(retention_ctx(worker))
    app.cleanup_ctx.append(decisions.flush_ctx)
    app.cleanup_ctx.append(dispatcher.timer_ctx)
    app.cleanup_ctx.append(gpus.poll_ctx)
    app[HANDLERS] = {}
    app.on_shutdown.append(end_handlers)  # runs before the cleanup contexts close the resources
    setup_inference_routes(app)
    setup_catalog_routes(app)
    setup_cors(app, server.cors_origins)
    setup_admin_routes(app)
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


def _socket_gid(group: str) -> int | None:
    """The group id for ``[server] socket_group``, or None when unset."""
    if not group:
        return None
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(
            f"[server] socket_group {group!r} is not a group on this machine; create it or unset it"
        ) from None


def _restrict_socket(path: Path, gid: int | None) -> None:
    """The admin socket: 0600, or 0660 for the ``socket_group``."""
    if gid is None:
        os.chmod(path, 0o600)
        return
    os.chown(path, -1, gid)
    os.chmod(path, 0o660)


def _claim_socket(path: Path) -> None:
    """Make the socket's folder (0700) and remove a stale socket; refuse if a daemon answers there."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()
    else:
        raise ConfigError(f"another mr serve is already listening on {path}; stop it first or pass --socket")
    finally:
        probe.close()


async def _run(config: Config, *, discover: bool | None) -> None:
    """Lock the state and claim the socket before anything else, then serve."""
    server = config.server
    check_keys(server)  # as a typo is, before anything starts
    _socket_gid(server.socket_group)  # a typo is refused before anything starts
    refuse_a_busy_port(server.host, server.port)  # before the state, its log lines and the socket are made
    lock = StateLock(server.state_path)
    lock.acquire(listen=f"http://{server.host}:{server.port}", socket=str(server.socket_path))
    try:
        _claim_socket(server.socket_path)
        await _serve_app(config, discover=discover)
    finally:
        lock.release()


def make_runner(app: web.Application, config: Config) -> web.AppRunner:
    """The runner that serves ``app``: handlers cancelled when their client leaves, slow clients cut off.

    aiohttp closes a connection whose request headers are not complete ``keepalive_timeout``
    seconds after it opened or after its last answer, however slowly bytes trickle in;
    ``header_timeout`` sets that, so a slow-loris client cannot hold a connection
    (the body's own deadline is in ``guard.py``). The rest of a body refused unread
    is drained for at most a second, so the client sees its answer, then the
    connection closes.
    """
    server = config.server
    return Runner(
        app,
        handler_cancellation=True,
        shutdown_timeout=server.shutdown_grace_seconds,
        keepalive_timeout=server.header_timeout,
        lingering_time=1.0,  # reading an unwanted body's rest after a 408/413 (aiohttp's default: 10 s)
        access_log=logging.getLogger("mindrouter.access") if server.log_level == "debug" else None,
    )


async def _serve_app(config: Config, *, discover: bool | None) -> None:
    server = config.server
    app = await create_app(config, discover=discover)
    runner = make_runner(app, config)
    await runner.setup()
    socket_path = server.socket_path
    try:
        await web.TCPSite(runner, server.host, server.port, backlog=1024).start()
        old_umask = os.umask(0o177)
        try:
            unix = web.UnixSite(runner, str(socket_path))
            await unix.start()
        finally:
            os.umask(old_umask)
        _restrict_socket(socket_path, _socket_gid(server.socket_group))
    except OSError as exc:
        await runner.cleanup()
        if exc.errno == errno.EADDRINUSE:
            raise port_taken(server.host, server.port) from None
        raise ConfigError(
            f"cannot listen on {server.host}:{server.port} or {socket_path}: {exc.strerror or exc}"
        ) from None
    log.info(
        "mindrouter %s serving http://%s:%d (inference) and %s (admin)",
        __version__,
        server.host,
        server.port,
        socket_path,
    )
    # What start-up made (the imported modules: ~50,000 objects) lives as long as the process; a full
    # collection walked it every time, 15-17 ms once or twice a second under load, holding up every
    # request in flight. Frozen, a full collection walks only what requests made (docs/performance.md).
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_EVERY)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        log.info(
            "shutting down: no new requests; waiting up to %.0f s for %d in flight",
            server.shutdown_grace_seconds,
            app[SCHEDULER].running_count,
        )
    finally:
        await runner.cleanup()  # on_shutdown ends the handlers within the grace; then the resources close
        with contextlib.suppress(OSError):
            socket_path.unlink()
    log.info("stopped")


def serve(config: Config, *, discover: bool | None = None) -> None:
    """Run the daemon until SIGTERM/SIGINT (exit 0)."""
    level = getattr(logging, config.server.log_level.upper(), None)
    if not isinstance(level, int):
        raise ConfigError(f"[server] log_level {config.server.log_level!r} is not one of debug, info, warning, error")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(_run(config, discover=discover))


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when installed (``pip install 'mindrouter[fast]'``), else asyncio's default.

    ``MR_EVENT_LOOP=asyncio`` chooses the default loop even with uvloop installed;
    ``MR_EVENT_LOOP=uvloop`` insists on uvloop.
    """
    choice = os.environ.get("MR_EVENT_LOOP", "auto")
    if choice not in ("auto", "uvloop", "asyncio"):
        raise ConfigError(f"MR_EVENT_LOOP={choice!r} is not one of auto, uvloop, asyncio")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError(
                "MR_EVENT_LOOP=uvloop but uvloop is not installed; pip install 'mindrouter[fast]'"
            ) from None
        return None
    return uvloop.new_event_loop
