"""What the daemon learns about a backend by polling it: :class:`Probe`, one :class:`Reply` at a time."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..gpu.vram import ModelShape

__all__ = ["Probe", "Reply", "model_key", "set_aliases"]

_ALIASES: dict[str, str] = {}
"""The daemon's model aliases (``mr model alias``): a name -> the model it is another name of."""


def set_aliases(aliases: Mapping[str, str]) -> None:
    """Make each name in ``aliases`` one model with its target (the daemon's, from its store)."""
    _ALIASES.clear()
    _ALIASES.update({name.removesuffix(":latest"): target.removesuffix(":latest") for name, target in aliases.items()})


def model_key(name: str) -> str:
    """The one name a model goes by in the pool: Ollama's ``llama3.2`` and ``llama3.2:latest`` are one model, and
    so are a vLLM server's ``meta-llama/Llama-3.1-8B-Instruct`` and ``llama3.1:8b`` once one is an alias of the
    other (``mr model alias``)."""
    key = name.removesuffix(":latest")
    return _ALIASES.get(key, key)


@dataclass(frozen=True, slots=True)
class Probe:
    """What one poll of a backend found. ``None`` means the backend does not say."""

    healthy: bool
    models: frozenset[str] = frozenset()
    """As the backend spells them (Ollama: ``name:tag``)."""
    loaded_models: frozenset[str] = frozenset()
    """Resident now (Ollama /api/ps); OpenAI-family engines: all of ``models``."""
    loaded_vram: dict[str, int] = field(default_factory=dict)
    """Bytes of GPU memory per loaded model (Ollama ``size_vram``)."""
    model_sizes: dict[str, int] = field(default_factory=dict)
    """Bytes on disk per model (Ollama /api/tags), a floor for the VRAM estimate."""
    capabilities: dict[str, frozenset[str]] = field(default_factory=dict)
    """Per model, where the backend says: {"completion", "vision", "embedding", "tools"} (Ollama
    /api/show; llama-server /props: "completion", plus "vision" with a multimodal projector)."""
    shapes: dict[str, ModelShape] = field(default_factory=dict)
    """Per model, its architecture from Ollama's /api/show: the KV cache each slot of it takes, and whether
    Ollama runs it with one slot (``gpu.vram``)."""
    details: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per model, the backend's own entry for it: Ollama's /api/tags entry merged with its /api/ps one
    (digest, size, modified_at, details, expires_at, size_vram), or the /v1/models entry."""
    running: int | None = None
    waiting: int | None = None
    """Requests queued inside the backend (vLLM num_requests_waiting, llama.cpp deferred)."""
    kv_cache_usage: float | None = None
    """0..1."""
    slots_total: int | None = None
    slots_busy: int | None = None
    prompt_tokens_total: int | None = None
    """The engine's own counters since it started, for throughput from deltas."""
    completion_tokens_total: int | None = None
    error: str | None = None
    """One sentence when unhealthy."""
    version: str | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """A probe's GET: the status and body, or why there was none (``status`` None)."""

    status: int | None
    body: bytes = b""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def missing(self) -> bool:
        """The server has no such endpoint, or it is switched off (404, 405, 501)."""
        return self.status in (404, 405, 501)

    def json(self) -> Any:
        """The body as JSON, or None if it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None
