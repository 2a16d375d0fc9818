"""One backend as the registry runs it: its store row, adapter, breaker, probes and what it lacks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...backends import Adapter, Probe
from ...scheduler import Modality
from .breaker import Breaker

__all__ = ["Entry"]


@dataclass(slots=True)
class Entry:
    row: Any
    """The store's backend row (id, name, url, engine, max_concurrent, gpus, node, priority, state)."""
    adapter: Adapter
    breaker: Breaker
    clock: Callable[[], float]
    """The registry's clock (tests replace it)."""
    probe: Probe | None = None
    known: Probe | None = None
    """The last healthy probe: a backend that is down still names its models, so requests get 503, not 404."""
    probe_streak: int = 0
    """Failed probes in a row."""
    error: str | None = None
    lacks: dict[str, frozenset[Modality]] = field(default_factory=dict)
    """Per model key, what the backend answered "not supported" to."""
    said: dict[tuple[str, Modality], str] = field(default_factory=dict)
    """Per (model key, modality) it lacks, what it said (llama-server: start it with ``--embeddings``)."""
    task: asyncio.Task[None] | None = None
    probed: asyncio.Event = field(default_factory=asyncio.Event)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Set to probe again at once (a request met the backend failing)."""
    probed_at: float = float("-inf")
    """When the last probe ended."""
    inherited: int = 0
    """Slots a leader before this router may still hold with generations it started (``Registry.inherit``)."""
    inherited_streams: int = 0
    """Of those, the ones its open streams held: what stays busy, without gauges, until the hold ends."""

    @property
    def circuit_open(self) -> bool:
        return self.breaker.open

    @property
    def failures(self) -> int:
        """Faults counted toward the circuit breaker now."""
        return self.breaker.failures(self.clock())
