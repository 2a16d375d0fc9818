"""Hard constraints: which backends may take a job, now or ever.

Constraints that depend only on the backend and the kind of job (model, modality,
JSON mode) are *static*: they are evaluated once per job class and cached until a
backend changes. The rest (health, drain, capacity, memory fit) are checked per
decision. Which of the backends that pass is best is ``estimate.py``'s question.

Invariant: every reason a backend is refused is one of ``REASONS``, in the
words decision records show; busy models are never counted as free memory.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from ..jobs import ClassKey
from .backend import Backend, BackendLoad

__all__ = [
    "REASONS",
    "fit",
    "live_rejections",
    "rejected_map",
    "static_rejections",
]

#: Each rejection reason, as it appears in decision records.
REASONS = {
    "model": "model not available",
    "modality": "modality not supported",
    "json": "JSON mode not supported",
    "unhealthy": "unhealthy (circuit open)",
    "disabled": "drained",
    "draining": "draining",
    "capacity": "at capacity",
    "held": "a slot is held briefly for a user who is owed more and about to send again (anticipation)",
    "memory": "model does not fit in free VRAM, even after evicting idle models",
    "loaded": "no room to load the model: the most models are loaded and all are busy",
    "placement": "draining this model here so that another, whose queue waits with more demand per slot, can load"
    " in its place (placement)",
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


def fit(backend: Backend, load: BackendLoad, model: str, resident: frozenset[str]) -> tuple[str, ...] | str:
    """The idle models (in the order Ollama picks them) to evict so ``model`` fits, or why it cannot.

    A resident or loading model fits. Otherwise the estimate must fit in free VRAM plus what
    idle resident models would free, and a place must be left under ``max_loaded``; busy models
    are never counted as free. Unknown readings fit, as before. ``resident``: ``load.resident(...)`` now.
    """
    if model in resident:
        return ()
    # A model the last poll listed has no estimate among those not loaded (``model_vram``), only what it
    # held; evicted for a load under way, it needs as much to come back (issue 31: else unknown, and it fit).
    need = backend.model_vram.get(model) or backend.resident_vram.get(model)
    free = backend.vram_free
    if free is not None:  # a load under way takes its memory, and what it evicts frees theirs, before a reading
        free -= sum(backend.model_vram.get(m, 0) for m in load.loading if m not in backend.loaded_models)
        free += sum(backend.resident_vram.get(m, 0) for m in load.evicted if m not in resident)
        if backend.vram_total is not None:
            # The reading and the model list come from two polls: what the resident models hold
            # bounds what is free, lest a reading older than the list show room since taken.
            held = sum(backend.resident_vram.get(m) or backend.model_vram.get(m, 0) for m in resident)
            free = min(free, backend.vram_total - held)
    room = backend.max_loaded
    evict: list[str] = []
    idle: list[str] | None = None  # sorted once a model must go: most calls evict nothing
    while True:
        short = need is not None and free is not None and need > free
        full = room is not None and len(resident) >= room
        if not (short or full):
            return tuple(evict)
        if idle is None:
            # Ollama's findRunnerToUnload: idle runners by keep_alive (not reported: taken as equal), then model
            # path (a digest; the name stands in), not the least recently used.
            idle = sorted(m for m in resident if not load.model_in_flight.get(m) and m not in load.loading)
        if not idle:
            return REASONS["memory"] if short else REASONS["loaded"]
        victim = idle.pop(0)
        evict.append(victim)
        resident = resident - {victim}
        if free is not None:
            free += backend.resident_vram.get(victim, 0)


def live_rejections(backend: Backend, load: BackendLoad, model: str, now: float, confirm: float) -> tuple[str, ...]:
    """Reasons ``backend`` cannot take a job for ``model`` right now (``confirm``: ``BackendLoad.resident``'s)."""
    reasons = []
    if not backend.healthy:
        reasons.append(REASONS["unhealthy"])
    if not backend.enabled:
        reasons.append(REASONS["disabled"])
    if backend.draining:
        reasons.append(REASONS["draining"])
    slots = backend.slots(model)
    if load.in_flight >= backend.max_concurrent or (slots is not None and load.model_in_flight.get(model, 0) >= slots):
        reasons.append(REASONS["capacity"])
        if load.held:
            reasons.append(REASONS["held"])
    room = fit(backend, load, model, load.resident(backend, now, confirm))
    if isinstance(room, str):
        reasons.append(room)
    return tuple(reasons)


def rejected_map(
    static: Mapping[Hashable, tuple[str, ...]], live: Mapping[Hashable, tuple[str, ...]]
) -> dict[str, list[str]]:
    """Merge static and live rejections into a record's ``rejected`` field."""
    out = {str(bid): list(reasons) for bid, reasons in static.items()}
    for bid, reasons in live.items():
        out.setdefault(str(bid), []).extend(reasons)
    return out
