"""A backend as the core sees it: its store row, a probe and its GPUs' readings folded into one ``Backend``.

Pure: the registry (``registry.py``) probes and reads the GPUs, and hands the
core what this builds; the core's own counters (in flight, latency, tokens/s)
stay in the core. A model the backend answered "not supported" for loses that
modality here, so routing sends such requests elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ...backends import Probe, model_key
from ...gpu.vram import ollama_slots
from ...names import STALLING_ENGINES
from ...scheduler import ALL_MODALITIES, Backend, Modality

__all__ = ["GpuReading", "VramEstimate", "backend_snapshot"]

#: (free bytes, total bytes, utilization 0..1) of a backend's GPUs; each None when unknown.
GpuReading = tuple[int | None, int | None, float | None]
#: Returns the bytes a model needs to load on a backend, or None when unknown.
VramEstimate = Callable[[Any, str, Probe], int | None]


def _modalities(capabilities: frozenset[str]) -> frozenset[Modality]:
    """What a model reported to have ``capabilities`` can be asked: embeddings always (Ollama embeds with
    any model), chat and completion with "completion", images with "vision"."""
    out = {Modality.EMBEDDINGS}
    if "completion" in capabilities:
        out |= {Modality.CHAT, Modality.COMPLETION}
        if "vision" in capabilities:
            out.add(Modality.VISION)
    return frozenset(out)


def _contexts(probe: Probe) -> dict[str, int]:
    """The context each loaded model's runner holds, where the backend says (Ollama /api/ps ``context_length``)."""
    out = {}
    for model in probe.loaded_models:
        ctx = probe.details.get(model, {}).get("context_length")
        if isinstance(ctx, int) and not isinstance(ctx, bool) and ctx > 0:
            out[model_key(model)] = ctx
    return out


def backend_snapshot(
    row: Any,
    probe: Probe | None,
    lacks: Mapping[str, frozenset[Modality]],
    gpu: GpuReading | None,
    vram_estimate: VramEstimate | None,
    *,
    healthy: bool,
    inherited: int = 0,
) -> Backend:
    """The core's snapshot of the backend in ``row``.

    Args:
        probe: the probe to trust (the registry's choice: a backend that is down names the models it last had).
        lacks: per model key, the modalities the backend answered "not supported" to.
        gpu: its GPUs' readings, if known.
        vram_estimate: what each model not loaded would need, asked only when free VRAM is known.
        healthy: whether the registry counts it healthy now.
        inherited: slots another router's requests may still hold (``Registry.inherit``).
    """
    vram_free, vram_total, gpu_util = gpu if gpu is not None else (None, None, None)
    utilization = probe.kv_cache_usage if probe is not None and probe.kv_cache_usage is not None else gpu_util
    models = probe.models if probe is not None else frozenset()
    model_vram: dict[str, int] = {}
    if probe is not None and vram_estimate is not None and vram_free is not None:
        for model in models - probe.loaded_models:
            need = vram_estimate(row, model, probe)
            if need is not None:
                model_vram[model_key(model)] = need
    capabilities = probe.capabilities if probe is not None else {}
    modalities = {model_key(m): _modalities(c) for m, c in capabilities.items()}
    for key, lacking in lacks.items():
        modalities[key] = modalities.get(key, ALL_MODALITIES) - lacking
    # Ollama runs a model that cannot complete (an embedding model), or of a few families, with one slot
    # whatever OLLAMA_NUM_PARALLEL says (server/sched.go).
    shapes = probe.shapes if probe is not None else {}
    one_slot = {
        model_key(m): 1
        for m in models
        if row.parallel is not None and ollama_slots(row.parallel, capabilities.get(m), shapes.get(m)) == 1
    }
    return Backend(
        id=row.id,
        name=row.name,
        models=frozenset(map(model_key, models)),
        loaded_models=frozenset(map(model_key, probe.loaded_models)) if probe is not None else frozenset(),
        model_modalities=modalities,
        max_concurrent=max(0, row.max_concurrent - inherited),
        priority=row.priority,
        healthy=healthy,
        draining=row.state == "draining",
        enabled=row.state != "disabled",
        vram_free=vram_free,
        vram_total=vram_total,
        model_vram=model_vram,
        model_sizes={model_key(m): size for m, size in probe.model_sizes.items()} if probe else {},
        resident_vram={model_key(m): size for m, size in probe.loaded_vram.items()} if probe else {},
        resident_context=_contexts(probe) if probe is not None else {},
        parallel=row.parallel,
        model_parallel=one_slot if row.engine == "ollama" and row.parallel is not None else {},
        max_loaded=row.max_loaded,
        utilization=utilization,
        backend_waiting=(probe.waiting or 0) if probe is not None else 0,
        prefill_stalls=row.engine in STALLING_ENGINES,
    )
