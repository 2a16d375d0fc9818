"""How much GPU memory a model needs, and whether a backend's GPUs have it.

The estimate, for a model that is NOT loaded yet (a loaded model, per
Ollama's ``/api/ps``, or any vLLM model, is resident: the caller passes 0
as its need and it always fits):

    need = weights + kv_cache + runtime_overhead

- weights: the model's size on disk (``/api/tags`` ``size``). A GGUF file is
  the quantized tensors themselves, loaded as they are, so its size is the
  weights' size in VRAM to within a few percent.
- kv_cache: ``2 (K and V) * n_layers * context * n_kv_heads * head_dim *
  bytes_per_element * parallel``, from ``/api/show`` ``model_info``
  (``<arch>.block_count``, ``<arch>.attention.head_count_kv``,
  ``<arch>.attention.key_length``, or ``embedding_length / head_count``;
  where ``value_length`` differs from ``key_length`` the two are added
  instead of doubling one).
  Ollama keeps an f16 cache (2 bytes) unless ``OLLAMA_KV_CACHE_TYPE`` says
  q8_0 (about 1.06) or q4_0 (about 0.56), and one context per parallel slot
  (``OLLAMA_NUM_PARALLEL``). Where the shape is unknown, a flat
  ``UNKNOWN_KV_FRACTION`` of the weights per ``DEFAULT_CONTEXT`` tokens
  stands in (grouped-query models need 3-15 %, older multi-head ones more).
- runtime_overhead: a fixed ``RUNTIME_OVERHEAD_BYTES`` for the CUDA context,
  cuBLAS workspace and llama.cpp's compute buffers.

Example: llama3.1:8b Q4_K_M, 4.92 GB on disk, 32 layers, 8 KV heads of 128,
at 4096 tokens: KV = 2*32*4096*8*128*2 B = 512 MiB, plus 512 MiB overhead,
about 5.99 GB; Ollama's ``/api/ps`` reports about 6.0-6.5 GB for it.

A model split across several GPUs (Ollama and llama.cpp split by layers)
needs the sum of their free memory, so ``fits`` compares with the sum.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .probe import GpuReading

__all__ = [
    "DEFAULT_CONTEXT",
    "RUNTIME_OVERHEAD_BYTES",
    "SINGLE_SLOT_FAMILIES",
    "UNKNOWN_KV_FRACTION",
    "ModelShape",
    "estimate_model_vram",
    "fits",
    "free_vram",
    "ollama_slots",
    "parse_ollama_show",
    "total_vram",
    "utilization",
]

SINGLE_SLOT_FAMILIES = frozenset(
    {
        "mllama",
        "qwen3vl",
        "qwen3vlmoe",
        "qwen35",
        "qwen35moe",
        "qwen3next",
        "lfm2",
        "lfm2moe",
        "nemotron_h",
        "nemotron_h_moe",
        "nemotron_h_omni",
    }
)
"""Architectures Ollama runs with one slot whatever ``OLLAMA_NUM_PARALLEL`` says (ollama issue 4165)."""


def ollama_slots(parallel: int | None, capabilities: frozenset[str] | None, shape: ModelShape | None) -> int | None:
    """Requests one runner of a model serves at once on an Ollama with ``OLLAMA_NUM_PARALLEL`` = ``parallel``:
    1 for a model that cannot complete (an embedding model) or of a single-slot family, as Ollama loads it."""
    if parallel is None:
        return None
    if capabilities is not None and "completion" not in capabilities:
        return 1
    if shape is not None and shape.architecture in SINGLE_SLOT_FAMILIES:
        return 1
    return parallel


#: Context Ollama gives a model when neither the request nor the Modelfile sets ``num_ctx``.
DEFAULT_CONTEXT = 4096
#: CUDA context, cuBLAS workspace and compute buffers, per loaded model.
RUNTIME_OVERHEAD_BYTES = 512 * 1024 * 1024
#: KV cache as a fraction of the weights per DEFAULT_CONTEXT tokens, when the shape is unknown.
UNKNOWN_KV_FRACTION = 0.15


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What ``/api/show`` says about a model's architecture; None where it says nothing."""

    architecture: str | None = None
    n_layers: int | None = None
    n_embd: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    """The largest per-layer count where layers differ (a safe overestimate)."""
    head_dim: int | None = None
    """Width of one key head (``attention.key_length``)."""
    value_dim: int | None = None
    """Width of one value head, where it differs from the key's (``attention.value_length``)."""
    context_length: int | None = None
    """The longest context the model was trained for."""
    default_context: int | None = None
    """``num_ctx`` from the Modelfile's parameters, if set."""
    parameter_count: int | None = None
    quantization: str | None = None

    @property
    def kv_dims(self) -> tuple[int, int, int, int] | None:
        """(layers, KV heads, key dimension, value dimension), when all are known."""
        heads = self.n_kv_heads or self.n_heads  # no head_count_kv means plain multi-head attention
        dim = self.head_dim
        if dim is None and self.n_embd and self.n_heads:
            dim = self.n_embd // self.n_heads
        if self.n_layers and heads and dim:
            return self.n_layers, heads, dim, self.value_dim or dim
        return None


def _positive_int(value: Any) -> int | None:
    if isinstance(value, list):  # per-layer values (e.g. OpenELM): take the largest
        ints = [v for v in (_positive_int(x) for x in value) if v is not None]
        return max(ints) if ints else None
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value > 0 else None


def _num_ctx(parameters: Any) -> int | None:
    # ``parameters`` is the Modelfile's PARAMETER lines: "num_ctx 8192\nstop ..."
    if not isinstance(parameters, str):
        return None
    for line in parameters.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "num_ctx":
            try:
                return _positive_int(int(parts[1]))
            except ValueError:
                return None
    return None


def parse_ollama_show(show_json: Mapping[str, Any]) -> ModelShape:
    """Read a model's shape from Ollama's ``POST /api/show`` answer; missing or odd values read as None."""
    if not isinstance(show_json, Mapping):
        return ModelShape()
    info = show_json.get("model_info")
    info = info if isinstance(info, Mapping) else {}
    details = show_json.get("details")
    details = details if isinstance(details, Mapping) else {}
    arch = info.get("general.architecture")
    arch = (
        arch
        if isinstance(arch, str) and arch
        else (details.get("family") if isinstance(details.get("family"), str) else None)
    )

    def key(name: str) -> int | None:
        return _positive_int(info.get(f"{arch}.{name}")) if arch else None

    quant = details.get("quantization_level")
    return ModelShape(
        architecture=arch,
        n_layers=key("block_count"),
        n_embd=key("embedding_length"),
        n_heads=key("attention.head_count"),
        n_kv_heads=key("attention.head_count_kv"),
        head_dim=key("attention.key_length"),
        value_dim=key("attention.value_length"),
        context_length=key("context_length"),
        default_context=_num_ctx(show_json.get("parameters")),
        parameter_count=_positive_int(info.get("general.parameter_count")),
        quantization=quant if isinstance(quant, str) and quant else None,
    )


def estimate_model_vram(
    size_bytes: int,
    *,
    context_tokens: int | None = None,
    shape: ModelShape | None = None,
    n_layers: int | None = None,
    n_kv_heads: int | None = None,
    head_dim: int | None = None,
    n_embd: int | None = None,
    n_heads: int | None = None,
    parallel: int = 1,
    kv_bytes_per_element: float = 2.0,
    runtime_overhead: int = RUNTIME_OVERHEAD_BYTES,
) -> int:
    """Bytes of VRAM a model that is not loaded yet needs to load and serve ``context_tokens``.

    Args:
        size_bytes (int): the model's size on disk (Ollama ``/api/tags``).
        context_tokens (int | None): the context the request asks for
            (``options.num_ctx``). Defaults to the Modelfile's ``num_ctx``,
            else ``DEFAULT_CONTEXT``; capped at the model's trained context.
        shape (ModelShape | None): from ``parse_ollama_show``; the single
            dimensions below, where given, win over it.
        n_layers, n_kv_heads, head_dim, n_embd, n_heads (int | None): the
            architecture; head_dim defaults to n_embd / n_heads and n_kv_heads
            to n_heads.
        parallel (int): contexts kept at once (``OLLAMA_NUM_PARALLEL``). Defaults to 1.
        kv_bytes_per_element (float): 2 for f16, about 1.06 for q8_0. Defaults to 2.
        runtime_overhead (int): fixed bytes per loaded model. Defaults to 512 MiB.

    Raises:
        ValueError: a negative size, or a context or parallel below 1.
    """
    if size_bytes < 0:
        raise ValueError(f"size_bytes must be at least 0, not {size_bytes}")
    if parallel < 1:
        raise ValueError(f"parallel must be at least 1, not {parallel}")
    shape = shape or ModelShape()
    merged = ModelShape(
        n_layers=n_layers or shape.n_layers,
        n_embd=n_embd or shape.n_embd,
        n_heads=n_heads or shape.n_heads,
        n_kv_heads=n_kv_heads or shape.n_kv_heads,
        head_dim=head_dim or shape.head_dim,
        value_dim=None if head_dim else shape.value_dim,
    )
    context = context_tokens if context_tokens is not None else (shape.default_context or DEFAULT_CONTEXT)
    if context < 1:
        raise ValueError(f"context_tokens must be at least 1, not {context}")
    if shape.context_length:
        context = min(context, shape.context_length)
    dims = merged.kv_dims
    if dims is not None:
        layers, heads, k_dim, v_dim = dims
        kv = layers * context * heads * (k_dim + v_dim) * kv_bytes_per_element * parallel
    else:
        kv = size_bytes * UNKNOWN_KV_FRACTION * (context / DEFAULT_CONTEXT) * parallel
    return int(size_bytes + math.ceil(kv) + runtime_overhead)


def fits(need_bytes: int, free_bytes_by_gpu: Sequence[int]) -> bool:
    """Whether ``need_bytes`` fit in the free memory of these GPUs together.

    A need of 0 or less (a model already loaded) always fits, even with no
    GPU. Call this only when the free memory is known; an unknown reading
    (``free_vram`` answering None) must not refuse a backend.
    """
    if need_bytes <= 0:
        return True
    return need_bytes <= sum(max(0, free) for free in free_bytes_by_gpu)


def _bound(readings: Iterable[GpuReading], gpus: Iterable[Hashable] | None) -> list[GpuReading] | None:
    """The readings of the GPUs a backend is bound to; None when one of them has no reading."""
    readings = list(readings)
    if gpus is None:
        return readings or None
    wanted = list(gpus)
    chosen = []
    for gpu in wanted:
        match = next((r for r in readings if r.index == gpu or (r.uuid is not None and r.uuid == gpu)), None)
        if match is None:
            return None
        chosen.append(match)
    return chosen or None


def free_vram(readings: Iterable[GpuReading], gpu_indexes: Iterable[int | str] | None = None) -> int | None:
    """Free bytes on the GPUs a backend is bound to, summed.

    Args:
        readings: the node's latest readings.
        gpu_indexes: indexes (or UUIDs) from ``mr backend add --gpus``; None
            means every GPU of the node.

    Returns:
        The sum, or None when it is unknown: no readings, a bound GPU missing,
        or one of them without a memory reading (a partial sum would refuse
        backends that have room).
    """
    chosen = _bound(readings, gpu_indexes)
    if chosen is None or any(r.memory_free is None for r in chosen):
        return None
    return sum(r.memory_free for r in chosen)  # type: ignore[misc]


def total_vram(readings: Iterable[GpuReading], gpu_indexes: Iterable[int | str] | None = None) -> int | None:
    """Total bytes on the GPUs a backend is bound to; None when unknown, as for ``free_vram``."""
    chosen = _bound(readings, gpu_indexes)
    if chosen is None or any(r.memory_total is None for r in chosen):
        return None
    return sum(r.memory_total for r in chosen)  # type: ignore[misc]


def utilization(readings: Iterable[GpuReading], gpu_indexes: Iterable[int | str] | None = None) -> float | None:
    """Mean GPU utilization (0..1) of the GPUs a backend is bound to.

    GPUs whose utilization could not be read are left out of the mean; None
    when none of them could be read or a bound GPU has no reading.
    """
    chosen = _bound(readings, gpu_indexes)
    if chosen is None:
        return None
    known = [r.utilization_gpu for r in chosen if r.utilization_gpu is not None]
    if not known:
        return None
    return min(1.0, max(0.0, sum(known) / len(known) / 100.0))
