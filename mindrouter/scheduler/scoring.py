"""Hard constraints and soft scores: which backends may take a job, and which is best.

Constraints that depend only on the backend and the kind of job (model, modality,
JSON mode) are *static*: they are evaluated once per job class and cached until a
backend changes. The rest (health, drain, capacity, memory fit) are checked per
decision. Score terms that depend only on telemetry are cached per backend and
model; the only per-decision term is the queue depth. That keeps one decision at
a small constant per candidate backend.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from .backend import Backend, BackendLoad
from .jobs import Modality
from .settings import SchedulerSettings

__all__ = [
    "REASONS",
    "BackendScorer",
    "ClassKey",
    "ScoreRow",
    "live_rejections",
    "static_rejections",
]

#: (model, modality, json_mode): jobs of one class are interchangeable for routing.
ClassKey = tuple[str, Modality, bool]

#: Each rejection reason, as it appears in decision records.
REASONS = {
    "model": "model not available",
    "modality": "modality not supported",
    "json": "JSON mode not supported",
    "unhealthy": "unhealthy (circuit open)",
    "disabled": "disabled",
    "draining": "draining",
    "capacity": "at capacity",
    "memory": "model does not fit in free VRAM",
}


def static_rejections(backend: Backend, key: ClassKey) -> tuple[str, ...]:
    """Reasons ``backend`` can never serve jobs of class ``key`` as configured now."""
    model, modality, json_mode = key
    reasons = []
    if model not in backend.models:
        reasons.append(REASONS["model"])
    if modality not in backend.model_modalities.get(model, backend.modalities):
        reasons.append(REASONS["modality"])
    if json_mode and not backend.supports_json:
        reasons.append(REASONS["json"])
    return tuple(reasons)


def fits_memory(backend: Backend, model: str) -> bool:
    """A loaded model fits; otherwise its estimate must not exceed free VRAM (unknown passes)."""
    if model in backend.loaded_models or backend.vram_free is None:
        return True
    need = backend.model_vram.get(model)
    return need is None or need <= backend.vram_free


def live_rejections(backend: Backend, load: BackendLoad, model: str) -> tuple[str, ...]:
    """Reasons ``backend`` cannot take a job for ``model`` right now."""
    reasons = []
    if not backend.healthy:
        reasons.append(REASONS["unhealthy"])
    if not backend.enabled:
        reasons.append(REASONS["disabled"])
    if backend.draining:
        reasons.append(REASONS["draining"])
    if load.in_flight >= backend.max_concurrent:
        reasons.append(REASONS["capacity"])
    if not fits_memory(backend, model):
        reasons.append(REASONS["memory"])
    return tuple(reasons)


@dataclass(frozen=True, slots=True)
class ScoreRow:
    """One candidate's score, term by term (what ``mr why`` shows)."""

    backend_id: Hashable
    total: float
    model_loaded: float
    low_utilization: float
    latency: float
    short_queue: float
    high_throughput: float
    priority: float
    penalty: float = 0.0
    """Subtracted when this backend already failed this request."""

    def to_dict(self) -> dict[str, float]:
        return {
            "total": round(self.total, 3),
            "model_loaded": round(self.model_loaded, 3),
            "low_utilization": round(self.low_utilization, 3),
            "latency": round(self.latency, 3),
            "short_queue": round(self.short_queue, 3),
            "high_throughput": round(self.high_throughput, 3),
            "priority": self.priority,
            "penalty": self.penalty,
        }


#: Points taken from a backend that already failed this request, so a retry goes elsewhere if it can.
RETRY_PENALTY = 1000.0


class BackendScorer:
    """Computes a backend's score; caches the telemetry-only terms per (backend, model)."""

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings
        self._cache: dict[tuple[Hashable, str], tuple[float, float, float, float, float]] = {}

    def invalidate(self, backend_id: Hashable) -> None:
        for key in [k for k in self._cache if k[0] == backend_id]:
            del self._cache[key]

    def clear(self) -> None:
        self._cache.clear()

    def static_terms(self, backend: Backend, load: BackendLoad, model: str) -> tuple[float, float, float, float, float]:
        """(sum, model_loaded, low_utilization, latency, high_throughput)."""
        key = (backend.id, model)
        terms = self._cache.get(key)
        if terms is None:
            s = self.settings
            w = s.scores
            loaded = w.model_loaded if model in backend.loaded_models else 0.0
            util = 0.5 if backend.utilization is None else min(1.0, max(0.0, backend.utilization))
            low_util = w.low_utilization * (1.0 - util)
            ema = load.latency_ema
            latency = w.latency * (0.5 if ema is None else s.latency_reference / (s.latency_reference + ema))
            tps = load.tokens_per_second
            throughput = w.high_throughput * (0.5 if tps is None else tps / (tps + s.throughput_reference))
            terms = (loaded + low_util + latency + throughput + backend.priority, loaded, low_util, latency, throughput)
            self._cache[key] = terms
        return terms

    def score(self, backend: Backend, load: BackendLoad, model: str, penalty: float = 0.0) -> float:
        depth = load.in_flight + backend.backend_waiting
        return self.static_terms(backend, load, model)[0] + self.settings.scores.short_queue / (1 + depth) - penalty

    def row(self, backend: Backend, load: BackendLoad, model: str, penalty: float = 0.0) -> ScoreRow:
        total, loaded, low_util, latency, throughput = self.static_terms(backend, load, model)
        queue = self.settings.scores.short_queue / (1 + load.in_flight + backend.backend_waiting)
        return ScoreRow(
            backend.id, total + queue - penalty, loaded, low_util, latency, queue, throughput, backend.priority, penalty
        )


def rejected_map(
    static: Mapping[Hashable, tuple[str, ...]], live: Mapping[Hashable, tuple[str, ...]]
) -> dict[str, list[str]]:
    """Merge static and live rejections into a record's ``rejected`` field."""
    out = {str(bid): list(reasons) for bid, reasons in static.items()}
    for bid, reasons in live.items():
        out.setdefault(str(bid), []).extend(reasons)
    return out
