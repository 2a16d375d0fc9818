"""Poll a ``mr agent`` on another workstation for its GPU readings.

Every failure (refused connection, timeout, 401, a body that is not readings)
becomes one ``AgentError`` with a sentence naming the agent, at this one
boundary, so the daemon's poller needs a single ``except``.
"""

from __future__ import annotations

import json

import aiohttp

from ..errors import MindRouterError
from .node import NodeReadings
from .probe import GpuReading, readings_from_json

__all__ = ["AgentClient", "AgentError", "agent_base_url", "fetch_agent"]


class AgentError(MindRouterError):
    """A ``mr agent`` did not answer with readings."""


def agent_base_url(url: str) -> str:
    """The agent's base URL without a trailing slash; ``http://`` is assumed when no scheme is given."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    return url


async def fetch_agent(
    session: aiohttp.ClientSession, url: str, key: str | None = None, *, timeout: float = 5.0
) -> list[GpuReading]:
    """Ask the agent at ``url`` for its readings (``GET /gpus``).

    Args:
        session: the daemon's pooled client session.
        url: the agent's base URL (the backend's ``--node``).
        key: the agent's ``--key``, sent as a bearer token. Defaults to none.
        timeout: seconds for the whole request. Defaults to 5.

    Raises:
        AgentError: no answer, a refused key, or a body that is not readings.
    """
    base = agent_base_url(url)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        async with session.get(
            f"{base}/gpus", headers=headers, timeout=aiohttp.ClientTimeout(total=timeout), allow_redirects=False
        ) as resp:
            if resp.status == 401:
                raise AgentError(
                    f"GPU agent at {base} refused the key (401); give the node the key its `mr agent --key` uses"
                )
            if resp.status != 200:
                raise AgentError(f"GPU agent at {base} answered HTTP {resp.status}; is `mr agent` what listens there?")
            body = await resp.read()
    except AgentError:
        raise
    except TimeoutError as exc:
        raise AgentError(f"GPU agent at {base} did not answer within {timeout:g} s") from exc
    except aiohttp.ClientError as exc:
        raise AgentError(f"cannot reach GPU agent at {base} ({exc}); is `mr agent` running there?") from exc
    try:
        return readings_from_json(json.loads(body), base)
    except ValueError as exc:  # JSONDecodeError or the wrong shape
        raise AgentError(f"GPU agent at {base} sent something that is not GPU readings ({exc})") from exc


class AgentClient:
    """One remote node as the daemon polls it: fetch, then record into ``node``.

    Args:
        session: the daemon's pooled client session.
        url: the agent's base URL.
        key: the agent's key, if it has one.
        poll_interval: seconds between polls; also sets when the node goes stale.
        stale_after: missed intervals before the node is stale. Defaults to 3.
        timeout: seconds per request. Defaults to the poll interval, at most 10.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        key: str | None = None,
        *,
        poll_interval: float = 5.0,
        stale_after: int = 3,
        timeout: float | None = None,
    ) -> None:
        self.session = session
        self.url = agent_base_url(url)
        self.key = key
        self.timeout = timeout if timeout is not None else min(poll_interval, 10.0)
        self.node = NodeReadings(self.url, poll_interval, stale_after)

    async def fetch(self) -> list[GpuReading]:
        """The agent's readings now. Raises AgentError as ``fetch_agent`` does."""
        return await fetch_agent(self.session, self.url, self.key, timeout=self.timeout)

    async def poll(self, now: float) -> bool:
        """Fetch once and record the outcome in ``node`` at ``now``; True on success. Never raises AgentError."""
        try:
            readings = await self.fetch()
        except AgentError as exc:
            self.node.record_failure(str(exc), now)
            return False
        self.node.record(readings, now)
        return True
