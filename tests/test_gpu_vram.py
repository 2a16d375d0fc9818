"""VRAM estimates from Ollama's model facts, and fit / free memory / utilization over readings."""

from __future__ import annotations

import pytest

from mindrouter.gpu import (
    DEFAULT_CONTEXT,
    RUNTIME_OVERHEAD_BYTES,
    GpuReading,
    ModelShape,
    estimate_model_vram,
    fits,
    free_vram,
    parse_ollama_show,
    total_vram,
    utilization,
)

GIB = 1024**3
MIB = 1024**2

# Trimmed from a real `POST /api/show {"model": "llama3.1:8b"}` answer.
LLAMA31_SHOW = {
    "parameters": 'stop "<|start_header_id|>"\nstop "<|eot_id|>"',
    "details": {"format": "gguf", "family": "llama", "parameter_size": "8.0B", "quantization_level": "Q4_K_M"},
    "model_info": {
        "general.architecture": "llama",
        "general.parameter_count": 8030261248,
        "llama.attention.head_count": 32,
        "llama.attention.head_count_kv": 8,
        "llama.attention.layer_norm_rms_epsilon": 1e-05,
        "llama.block_count": 32,
        "llama.context_length": 131072,
        "llama.embedding_length": 4096,
        "llama.feed_forward_length": 14336,
        "llama.rope.freq_base": 500000,
        "tokenizer.ggml.tokens": None,
    },
}
LLAMA31_SIZE = 4_920_753_328  # /api/tags size of llama3.1:8b


def test_parse_ollama_show() -> None:
    shape = parse_ollama_show(LLAMA31_SHOW)
    assert shape == ModelShape(
        architecture="llama",
        n_layers=32,
        n_embd=4096,
        n_heads=32,
        n_kv_heads=8,
        head_dim=None,
        context_length=131072,
        default_context=None,
        parameter_count=8030261248,
        quantization="Q4_K_M",
    )
    assert shape.kv_dims == (32, 8, 128, 128)


def test_parse_ollama_show_tolerates_junk() -> None:
    assert parse_ollama_show({}) == ModelShape()
    assert parse_ollama_show("nope") == ModelShape()  # type: ignore[arg-type]
    shape = parse_ollama_show(
        {
            "parameters": "num_ctx 8192\ntemperature 0.2",
            "details": {"family": "qwen2"},
            "model_info": {
                "qwen2.block_count": "28",
                "qwen2.attention.head_count_kv": [4, 4, 8],
                "qwen2.attention.key_length": 128,
                "qwen2.attention.value_length": 64,
            },
        }
    )
    assert (shape.architecture, shape.n_layers, shape.n_kv_heads, shape.default_context) == ("qwen2", None, 8, 8192)
    assert shape.value_dim == 64 and shape.kv_dims is None


def test_estimate_with_the_models_shape() -> None:
    shape = parse_ollama_show(LLAMA31_SHOW)
    kv = 2 * 32 * 4096 * 8 * 128 * 2
    assert kv == 512 * MIB
    need = estimate_model_vram(LLAMA31_SIZE, shape=shape)
    assert need == LLAMA31_SIZE + kv + RUNTIME_OVERHEAD_BYTES  # about 5.99 GB
    # A bigger context costs KV cache in proportion; parallel slots multiply it; q8_0 roughly halves it.
    assert (
        estimate_model_vram(LLAMA31_SIZE, shape=shape, context_tokens=32768)
        == LLAMA31_SIZE + 8 * kv + RUNTIME_OVERHEAD_BYTES
    )
    assert estimate_model_vram(LLAMA31_SIZE, shape=shape, parallel=4) == LLAMA31_SIZE + 4 * kv + RUNTIME_OVERHEAD_BYTES
    assert (
        estimate_model_vram(LLAMA31_SIZE, shape=shape, kv_bytes_per_element=1.0)
        == LLAMA31_SIZE + kv // 2 + RUNTIME_OVERHEAD_BYTES
    )
    # Capped at the trained context.
    assert estimate_model_vram(LLAMA31_SIZE, shape=shape, context_tokens=10**7) == estimate_model_vram(
        LLAMA31_SIZE, shape=shape, context_tokens=131072
    )


def test_estimate_from_single_dimensions() -> None:
    # Multi-head (no KV-head count): every head is cached; head_dim from embedding / heads.
    mha = estimate_model_vram(3 * GIB, context_tokens=2048, n_layers=32, n_embd=4096, n_heads=32, runtime_overhead=0)
    assert mha == 3 * GIB + 2 * 32 * 2048 * 32 * 128 * 2
    # Different key and value widths are added, not doubled.
    shape = ModelShape(n_layers=10, n_kv_heads=2, head_dim=192, value_dim=128)
    assert (
        estimate_model_vram(0, shape=shape, context_tokens=1000, runtime_overhead=0) == 10 * 1000 * 2 * (192 + 128) * 2
    )
    # The Modelfile's num_ctx is the default context.
    assert (
        estimate_model_vram(
            0, shape=ModelShape(n_layers=1, n_kv_heads=1, head_dim=1, default_context=100), runtime_overhead=0
        )
        == 2 * 100 * 2
    )


def test_estimate_without_a_shape_uses_a_flat_fraction() -> None:
    size = 10 * GIB
    assert estimate_model_vram(size) == size + int(size * 0.15) + RUNTIME_OVERHEAD_BYTES
    assert (
        estimate_model_vram(size, context_tokens=2 * DEFAULT_CONTEXT)
        == size + int(size * 0.30) + RUNTIME_OVERHEAD_BYTES
    )


@pytest.mark.parametrize(
    "kwargs", [{"size_bytes": -1}, {"size_bytes": 1, "context_tokens": 0}, {"size_bytes": 1, "parallel": 0}]
)
def test_estimate_refuses_nonsense(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        estimate_model_vram(**kwargs)


def test_fits() -> None:
    assert fits(6 * GIB, [8 * GIB])
    assert not fits(6 * GIB, [4 * GIB])
    assert fits(6 * GIB, [4 * GIB, 3 * GIB])  # split by layers across both
    assert fits(0, [])  # already loaded: nothing more needed
    assert not fits(1, [])
    assert fits(6 * GIB, [6 * GIB])


def readings() -> list[GpuReading]:
    return [
        GpuReading(index=0, uuid="GPU-a", memory_total=24 * GIB, memory_free=4 * GIB, utilization_gpu=90),
        GpuReading(index=1, uuid="GPU-b", memory_total=24 * GIB, memory_free=20 * GIB, utilization_gpu=10),
        GpuReading(index=2, uuid="GPU-c", memory_total=None, memory_free=None, utilization_gpu=None),
    ]


def test_free_and_total_vram() -> None:
    r = readings()
    assert free_vram(r, [0]) == 4 * GIB
    assert free_vram(r, [0, 1]) == 24 * GIB
    assert free_vram(r, ["GPU-b"]) == 20 * GIB
    assert free_vram(r, [1, 2]) is None  # one bound GPU unreadable: unknown, not a partial sum
    assert free_vram(r, [7]) is None  # bound to a GPU that is not there
    assert free_vram([], [0]) is None and free_vram([], None) is None
    assert free_vram(r[:2], None) == 24 * GIB  # not bound: every GPU of the node
    assert total_vram(r, [0, 1]) == 48 * GIB and total_vram(r, [2]) is None


def test_utilization() -> None:
    r = readings()
    assert utilization(r, [0]) == pytest.approx(0.9)
    assert utilization(r, [0, 1]) == pytest.approx(0.5)
    assert utilization(r, [0, 1, 2]) == pytest.approx(0.5)  # unreadable one left out of the mean
    assert utilization(r, [2]) is None
    assert utilization(r, [9]) is None
    assert utilization([], None) is None


def test_memory_fit_decisions_for_two_backends() -> None:
    """The issue's case: refuse the backend whose GPU lacks room; the one with the model loaded needs nothing."""
    r = readings()
    shape = parse_ollama_show(LLAMA31_SHOW)
    cold = estimate_model_vram(LLAMA31_SIZE, shape=shape, context_tokens=8192)
    assert 6 * GIB < cold < 7 * GIB
    backend_on_gpu0 = free_vram(r, [0])  # 4 GiB free, model not loaded
    backend_on_gpu1 = free_vram(r, [1])  # 20 GiB free
    assert not fits(cold, [backend_on_gpu0])
    assert fits(cold, [backend_on_gpu1])
    assert fits(0, [backend_on_gpu0])  # /api/ps lists it there already: it fits whatever is free
