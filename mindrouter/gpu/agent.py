"""``mr agent``: serve this workstation's GPU readings to a daemon on another machine.

    GET /gpus    JSON array of readings, the shape of ``mr gpu --json``
    GET /health  {"status": "ok", "version", "gpus", "nvml", "reading_age_seconds"}

NVML is polled in the background every ``poll_interval`` seconds (in a
thread, since NVML calls block); requests only read the latest snapshot, so
a scrape costs nothing on the GPU side. With a key, every path requires
``Authorization: Bearer KEY`` and answers 401 otherwise.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from .. import __version__
from ..errors import MindRouterError
from ..tasks import repeat, stop
from .probe import GpuProbe, GpuReading

__all__ = ["AGENT_STATE", "DEFAULT_AGENT_HOST", "DEFAULT_AGENT_PORT", "AgentState", "create_agent_app", "run_agent"]

log = logging.getLogger(__name__)

DEFAULT_AGENT_HOST = "127.0.0.1"
DEFAULT_AGENT_PORT = 8485


@dataclass(slots=True)
class AgentState:
    """What the poller last read; handlers only read it."""

    probe: GpuProbe
    poll_interval: float
    clock: Callable[[], float] = time.monotonic
    readings: list[GpuReading] = field(default_factory=list)
    polled_at: float | None = None
    polls: int = 0

    async def poll(self) -> None:
        """Read NVML once in a worker thread and keep the result."""
        loop = asyncio.get_running_loop()
        self.readings = await loop.run_in_executor(None, self.probe.read)
        self.polled_at = self.clock()
        self.polls += 1

    def age(self) -> float | None:
        return None if self.polled_at is None else max(0.0, self.clock() - self.polled_at)


AGENT_STATE = web.AppKey("agent_state", AgentState)


async def _poller(app: web.Application) -> AsyncIterator[None]:
    state = app[AGENT_STATE]
    await state.poll()  # the first request already finds readings

    task = asyncio.create_task(repeat(state.poll_interval, state.poll, "GPU poll", wait_first=True))
    yield
    await stop(task)
    await asyncio.get_running_loop().run_in_executor(None, state.probe.close)


def _auth_middleware(key: str) -> Callable[..., Awaitable[web.StreamResponse]]:
    expected = f"Bearer {key}".encode()

    @web.middleware
    async def auth(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode("utf-8", "replace")
        if not hmac.compare_digest(given, expected):
            return web.json_response(
                {"error": "missing or wrong key; send Authorization: Bearer <the key given to mr agent --key>"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="mr agent"'},
            )
        return await handler(request)

    return auth


async def _gpus(request: web.Request) -> web.Response:
    state = request.app[AGENT_STATE]
    age = state.age()
    headers = {"X-Reading-Age": f"{age:.3f}"} if age is not None else {}
    return web.json_response([r.to_dict() for r in state.readings], headers=headers)


async def _health(request: web.Request) -> web.Response:
    state = request.app[AGENT_STATE]
    return web.json_response(
        {
            "status": "ok",
            "version": __version__,
            "gpus": len(state.readings),
            "nvml": state.probe.unavailable_reason or "ok",
            "reading_age_seconds": state.age(),
        }
    )


def create_agent_app(
    probe: GpuProbe | None = None,
    *,
    key: str | None = None,
    poll_interval: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
) -> web.Application:
    """Build the agent's app; it owns ``probe`` and closes it at cleanup.

    Args:
        probe: the NVML probe. Defaults to ``GpuProbe()`` on the real pynvml.
        key: when set, required as ``Authorization: Bearer KEY`` on every path.
        poll_interval: seconds between NVML reads. Defaults to 5.
        clock: monotonic seconds, for the reading's age. Defaults to ``time.monotonic``.

    Raises:
        ValueError: poll_interval is not above 0.
    """
    if not poll_interval > 0:
        raise ValueError(f"poll_interval must be above 0, not {poll_interval}")
    app = web.Application(middlewares=[_auth_middleware(key)] if key else [])
    app[AGENT_STATE] = AgentState(probe or GpuProbe(), poll_interval, clock)
    app.router.add_get("/gpus", _gpus)
    app.router.add_get("/health", _health)
    app.cleanup_ctx.append(_poller)
    return app


def run_agent(
    host: str = DEFAULT_AGENT_HOST,
    port: int = DEFAULT_AGENT_PORT,
    key: str | None = None,
    *,
    poll_interval: float = 5.0,
    probe: GpuProbe | None = None,
) -> None:
    """Serve until interrupted.

    Raises:
        MindRouterError: the address cannot be listened on.
    """
    app = create_agent_app(probe, key=key, poll_interval=poll_interval)

    async def announce(app: web.Application) -> None:
        state = app[AGENT_STATE]
        found = (
            f"{len(state.readings)} GPU(s)"
            if state.readings
            else f"no GPU ({state.probe.unavailable_reason or 'none found'})"
        )
        log.info("serving %s at http://%s:%d/gpus, %s", found, host, port, "key required" if key else "no key")

    app.on_startup.append(announce)
    try:
        web.run_app(app, host=host, port=port, print=None, access_log=None)
    except OSError as exc:
        raise MindRouterError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); "
            "is another `mr agent` running? Choose another --port"
        ) from exc
