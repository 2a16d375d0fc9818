"""The daemon as a process: one aiohttp app on the TCP port and the admin Unix socket, until a signal.

``serve(config)`` locks the state directory, claims the socket, builds the app
(``app.create_app``) and serves it on uvloop when installed, until SIGTERM or
SIGINT; then in-flight requests finish for ``shutdown_grace_seconds``.
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
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from ... import __version__
from ...config import Config, check_keys
from ...errors import ConfigError
from ..edge.answers import Runner
from ..edge.logsafe import OneLineFormatter
from ..edge.services import SERVICES
from .app import create_app
from .listen import port_taken, refuse_a_busy_port
from .statelock import StateLock

__all__ = ["event_loop_factory", "make_runner", "serve", "settle_process"]

log = logging.getLogger("mindrouter.daemon")

YOUNG_COLLECTION_EVERY = 7000
"""Allocations between young collections (Python's default: 700). What a request allocates is almost
all freed by reference counting as it ends, but each young collection walks every in-flight request's
live objects. Ten times less often, the daemon spent 6-7% less CPU per request at 64 clients (within
the noise at 16) with a shorter tail, and its longest collection stayed 3-4 ms (docs/performance.md)."""


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


SWITCH_INTERVAL = 0.001
"""Seconds a thread running Python keeps the GIL while another waits for it (Python's default: 0.005).
While the store's worker builds a report in Python the event loop waited up to the whole default for
each turn; at 1 ms it gets the GIL back sooner (docs/performance.md, "One machine at a campus's size")."""


def settle_process() -> None:
    """Freeze what start-up made and hand the GIL over sooner, once the daemon listens
    (benchmarks/bench_scale.py does the same).

    It (the imported modules, each registered user's scheduler state: 60,000-80,000 objects) lives as
    long as the process; a full collection walked it every time, 15-17 ms once or twice a second under
    load, and 40-170 ms at 10,000 users while the store's worker built `mr share`, holding up every request
    in flight (a collection holds the GIL, whichever thread runs it). Frozen, a full collection walks only
    what came after (docs/performance.md).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_EVERY)
    sys.setswitchinterval(SWITCH_INTERVAL)


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
    settle_process()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        log.info(
            "shutting down: no new requests; waiting up to %.0f s for %d in flight",
            server.shutdown_grace_seconds,
            app[SERVICES].scheduler.running_count,
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
