"""What the core knows about one backend.

``Backend`` is a frozen snapshot of a backend's configuration and latest
telemetry; the shell replaces it whenever a probe reports something new.
The counters the core itself owns (requests in flight, measured latency and
throughput) live in ``BackendLoad`` inside the core and are never handed in.
Unknown readings are ``None`` and never make a backend ineligible.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from .jobs import Modality

__all__ = ["ALL_MODALITIES", "Backend", "BackendLoad"]

ALL_MODALITIES: frozenset[Modality] = frozenset(Modality)


@dataclass(frozen=True, slots=True)
class Backend:
    id: Hashable
    name: str
    models: frozenset[str] = frozenset()
    """Models this backend can serve."""
    loaded_models: frozenset[str] = frozenset()
    """Models resident in memory now (Ollama ``/api/ps``; vLLM: all of ``models``)."""
    modalities: frozenset[Modality] = ALL_MODALITIES
    """What the backend's models can do, where the backend does not say per model."""
    model_modalities: Mapping[str, frozenset[Modality]] = field(default_factory=dict)
    """Per model, where the backend says (Ollama /api/show capabilities, llama-server /props)."""
    supports_json: bool = True
    max_concurrent: int = 4
    priority: float = 0.0
    """Admin-set points added to the score."""
    healthy: bool = True
    draining: bool = False
    """Takes no new work; the shell disables it once idle."""
    enabled: bool = True
    vram_free: int | None = None
    """Free bytes on the GPUs this backend is bound to, if known."""
    vram_total: int | None = None
    model_vram: Mapping[str, int] = field(default_factory=dict)
    """Estimated bytes each (not loaded) model needs to load here."""
    utilization: float | None = None
    """0..1: GPU utilization, or vLLM's KV-cache usage, if known."""
    backend_waiting: int = 0
    """Requests waiting in the backend's own queue (from its metrics)."""


@dataclass(slots=True)
class BackendLoad:
    """Counters the core keeps for a backend from real traffic."""

    in_flight: int = 0
    latency_ema: float | None = None
    """Seconds to the end of a response (non-streaming) or first chunk (streaming)."""
    tokens_per_second: float | None = None
    completed: int = 0
    failed: int = 0
