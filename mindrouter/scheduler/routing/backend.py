"""What the core knows about one backend.

``Backend`` is a frozen snapshot of a backend's configuration and latest
telemetry; the shell replaces it whenever a probe reports something new.
The counters the core itself owns (requests in flight, measured latency and
throughput) live in ``BackendLoad`` inside the core and are never handed in.

Invariants: unknown readings are ``None`` and never make a backend
ineligible; only the router moves a ``BackendLoad`` (``router.py``), and what
leaves the core is a copy.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from ..jobs import Modality

__all__ = ["ALL_MODALITIES", "Backend", "BackendLoad", "ModelSpeed"]

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
    model_sizes: Mapping[str, int] = field(default_factory=dict)
    """Bytes on disk per model (Ollama /api/tags), for the time a load takes."""
    resident_vram: Mapping[str, int] = field(default_factory=dict)
    """Bytes of GPU memory each loaded model holds (Ollama ``size_vram``): what evicting it frees."""
    resident_context: Mapping[str, int] = field(default_factory=dict)
    """Context each loaded model's runner holds (Ollama ``/api/ps`` ``context_length``): a request asking
    another ``num_ctx`` makes Ollama reload it (``needsReload``)."""
    parallel: int | None = None
    """Requests each loaded model serves at once (Ollama ``OLLAMA_NUM_PARALLEL``); None: per server only."""
    model_parallel: Mapping[str, int] = field(default_factory=dict)
    """Per model, where it serves fewer than ``parallel`` at once: Ollama runs embedding models (and a few
    vision families) with one slot whatever ``OLLAMA_NUM_PARALLEL`` says."""
    max_loaded: int | None = None
    """Models resident at once (Ollama ``OLLAMA_MAX_LOADED_MODELS``); None: as many as fit."""
    utilization: float | None = None
    """0..1: GPU utilization, or vLLM's KV-cache usage, if known."""
    backend_waiting: int = 0
    """Requests waiting in the backend's own queue (from its metrics)."""
    prefill_stalls: bool = False
    """A prompt read here stalls every decoding stream for the time it takes (vLLM's chunked prefill fills each
    step's token budget with one token of each decoding stream, then prompt tokens), so reading one costs every
    stream there its time; elsewhere a prompt being read slows the others as one more stream does."""

    def slots(self, model: str) -> int | None:
        """Requests ``model`` serves at once here; None where only the server's ``max_concurrent`` bounds it."""
        return None if self.parallel is None else self.model_parallel.get(model, self.parallel)

    @property
    def takes_work(self) -> bool:
        """Healthy, enabled and not draining: it may be given new work."""
        return self.healthy and self.enabled and not self.draining


@dataclass(slots=True)
class ModelSpeed:
    """What answers taught about one model on one backend: rates of one stream alone, and one stream's as seen."""

    decode: float | None = None
    """Completion tokens per second."""
    prefill: float | None = None
    """Prompt tokens per second."""
    observed: float | None = None
    """Completion tokens per second one stream got, under the load it ran with: not scaled to one
    stream alone by the slowdown model, so a running whole answer is charged by it (``ledger.py``)."""
    answers: int = 0
    crowd: list[float] = field(default_factory=lambda: [0.0] * 5)
    """Moving sums (weight, x, y, x², xy) of y = seconds per token against x = other streams beside it: the
    line through them says how much each stream slows another here (``learning.py``)."""


@dataclass(slots=True)
class BackendLoad:
    """Counters the core keeps for a backend from real traffic, and what it expects of the backend's models."""

    in_flight: int = 0
    """Jobs running here, and slots held for a user about to send again (``held``; ``holds.py``)."""
    held: int = 0
    hold_ended: float = float("-inf")
    """When the last slot held here was given back (``DecisionRecord.slot_held``)."""
    latency_ema: float | None = None
    """Seconds to the end of a response (non-streaming) or first chunk (streaming)."""
    tokens_per_second: float | None = None
    completed: int = 0
    failed: int = 0
    model_in_flight: dict[str, int] = field(default_factory=dict)
    loading: dict[str, float] = field(default_factory=dict)
    """Models the core sent a job to while not resident: when each is expected to be loaded."""
    evicted: dict[str, float] = field(default_factory=dict)
    """Idle models that load is expected to have evicted, and when."""
    speeds: dict[str, ModelSpeed] = field(default_factory=dict)
    load_bytes_per_second: float | None = None
    """Measured from Ollama's ``load_duration``."""
    slowdown: float | None = None
    """How much each stream already here slows a new one, learned from its answers (``learning.py``): a vLLM
    server's batch slows a stream far less than Ollama's; None until learned (``stream_slowdown``)."""
    loaders: set[str] = field(default_factory=set)
    """Jobs running here that the core sent while their model was not resident: only theirs time a whole load."""
    read: float = 0.0
    """Seconds of prompt reading sent here so far (each job's part not cached, at its prefill rate alone): where
    prompts stall decoding (``Backend.prefill_stalls``), what a stream waited for beside its own work."""
    backlog: float = 0.0
    """Seconds of that reading not yet done as of ``backlog_at`` (a queue drained at one second a second): the
    prompts a new one is read behind."""
    backlog_at: float = 0.0
    reading: float = 0.0
    """Seconds of prompt reading of the jobs running here: a prompt is read before its job ends, so the backlog
    is never more (a learned prefill rate too low for a while cannot pile up a backlog no job holds)."""

    def pending(self, now: float) -> float:
        """Seconds of prompt reading sent here and expected not done by ``now``."""
        return max(0.0, min(self.reading, self.backlog - (now - self.backlog_at)))

    def resident(self, backend: Backend, now: float, confirm: float) -> frozenset[str]:
        """Models resident or loading now, as far as the core can tell before the next poll.

        ``confirm``: seconds a load or an eviction the core triggered stands without a poll
        (``SchedulerSettings.load_confirm_seconds``).
        """
        loaded = backend.loaded_models
        if self.loading and (coming := {m for m, ready in self.loading.items() if now < ready + confirm}):
            loaded = loaded | coming
        if self.evicted and (going := {m for m, at in self.evicted.items() if now < at + confirm}):
            loaded = loaded - going
        return loaded

    def polled(self, backend: Backend) -> None:
        """A poll reported what is resident: it replaces what the core expected."""
        self.loading = {m: t for m, t in self.loading.items() if m not in backend.loaded_models}
        self.evicted = {m: t for m, t in self.evicted.items() if m in backend.loaded_models}
