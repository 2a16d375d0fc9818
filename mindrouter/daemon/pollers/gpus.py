"""GPU readings for routing: this machine's NVML and the `mr agent` of other workstations.

Polled in the background (NVML in a worker thread, agents over HTTP), never on
the request path. A backend bound to GPUs (``--gpus``) reads those GPUs on its
node (``--node``, else this machine); a backend on this machine bound to none
reads all local GPUs; anything else has unknown VRAM, which never refuses it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from ...gpu.client import AgentClient
from ...gpu.node import NodeReadings
from ...gpu.probe import GpuProbe
from ...gpu.vram import estimate_model_vram, free_vram, ollama_slots, total_vram, utilization
from ...names import is_this_machine
from ...tasks import repeat, stop

__all__ = ["GpuState"]

log = logging.getLogger(__name__)


class GpuState:
    def __init__(
        self,
        probe: GpuProbe,
        session: aiohttp.ClientSession,
        *,
        poll_interval: float,
        agent_key: str | None = None,
        nodes: Callable[[], set[str]] = set,
        on_change: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.probe = probe
        self.session = session
        self.poll_interval = poll_interval
        self.agent_key = agent_key
        self.nodes_wanted = nodes
        self.on_change = on_change
        self.clock = clock
        self.local = NodeReadings("local", poll_interval)
        self.agents: dict[str, AgentClient] = {}

    async def poll_once(self) -> None:
        loop = asyncio.get_running_loop()
        readings = await loop.run_in_executor(None, self.probe.read)
        now = self.clock()
        self.local.record(readings, now)
        wanted = self.nodes_wanted()
        for url in list(self.agents):
            if url not in wanted:
                del self.agents[url]
        for url in wanted:
            await self.poll_node(url, now)
        self.on_change()

    async def poll_node(self, url: str, now: float | None = None) -> str | None:
        """Poll the ``mr agent`` at ``url`` once, logging when it stops or starts answering; returns its error."""
        agent = self.agents.get(url)
        if agent is None:
            agent = self.agents[url] = AgentClient(self.session, url, self.agent_key, poll_interval=self.poll_interval)
        before = agent.node.last_error
        await agent.poll(self.clock() if now is None else now)
        after = agent.node.last_error
        if after and after != before:
            log.warning("node=%s GPU agent does not answer: %s; its backends' VRAM reads as unknown", url, after)
        elif before and not after:
            log.info("node=%s GPU agent answers again", url)
        return after

    async def poll_ctx(self, _app: Any) -> AsyncIterator[None]:
        """aiohttp ``cleanup_ctx`` generator: poll every ``poll_interval`` seconds, then close NVML."""
        task = asyncio.create_task(repeat(self.poll_interval, self.poll_once, "GPU poll"), name="mindrouter-gpu-poll")
        yield
        await stop(task)
        self.probe.close()

    def _node_for(self, row: Any) -> NodeReadings | None:
        if row.node:
            agent = self.agents.get(row.node)
            return agent.node if agent is not None else None
        if row.gpus or is_this_machine(urlsplit(row.url).hostname or ""):
            return self.local
        return None

    def lookup(self, row: Any) -> tuple[int | None, int | None, float | None] | None:
        """(free bytes, total bytes, utilization) of ``row``'s GPUs, or None when unknown."""
        node = self._node_for(row)
        if node is None:
            return None
        readings = node.current(self.clock())
        if not readings:
            return None
        gpus = list(row.gpus) or None
        return free_vram(readings, gpus), total_vram(readings, gpus), utilization(readings, gpus)

    def vram_estimate(self, row: Any, model: str, probe: Any) -> int | None:
        """Bytes ``model`` needs to load on ``row``: from its size on disk, when the backend says; with its
        shape (Ollama's /api/show), the KV cache of every slot it will get (``ollama_slots``)."""
        size = probe.model_sizes.get(model) if probe.model_sizes else None
        if not size:
            return None
        shape = probe.shapes.get(model)
        if shape is None or shape.n_layers is None or row.engine != "ollama":
            return estimate_model_vram(size)
        slots = ollama_slots(row.parallel, probe.capabilities.get(model), shape) or 1
        return estimate_model_vram(size, shape=shape, parallel=slots)

    def node_error(self, url: str) -> str | None:
        """Why the ``mr agent`` at ``url`` did not answer its last poll; None when it did or is not polled yet."""
        agent = self.agents.get(url)
        return agent.node.last_error if agent is not None else None

    def nodes(self) -> list[dict[str, Any]]:
        now = self.clock()
        return [self.local.snapshot(now)] + [agent.node.snapshot(now) for agent in self.agents.values()]
