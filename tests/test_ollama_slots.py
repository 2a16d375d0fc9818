"""Ollama as it runs (issue 31): a model that cannot complete (an embedding model) gets one slot whatever
OLLAMA_NUM_PARALLEL (``--parallel``) says, as Ollama's scheduler (server/sched.go) loads it."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from mindrouter.backends import Probe
from mindrouter.daemon.pollers.gpus import GpuState
from mindrouter.daemon.pollers.snapshot import backend_snapshot
from mindrouter.gpu.vram import ModelShape
from mindrouter.scheduler import Backend, Job, Modality, Scheduler

EMBED, CHAT = "nomic-embed-text:v1.5", "llama3.1:8b"


def row(engine: str = "ollama", parallel: int | None = 4) -> SimpleNamespace:
    return SimpleNamespace(
        id=1,
        name="ws",
        engine=engine,
        max_concurrent=12,
        priority=0.0,
        state="enabled",
        parallel=parallel,
        max_loaded=3,
    )


def probe() -> Probe:
    models = frozenset({EMBED, CHAT})
    return Probe(
        healthy=True,
        models=models,
        loaded_models=models,
        capabilities={EMBED: frozenset({"embedding"}), CHAT: frozenset({"completion", "tools"})},
    )


def test_an_ollama_embedding_model_counts_one_slot_and_a_chat_model_parallel():
    backend = backend_snapshot(row(), probe(), {}, None, None, healthy=True)
    assert (backend.slots(EMBED), backend.slots(CHAT)) == (1, 4)


def test_a_server_without_slots_per_model_is_bounded_by_its_max_concurrent_alone():
    backend = backend_snapshot(row("openai", None), probe(), {}, None, None, healthy=True)
    assert (backend.slots(EMBED), backend.slots(CHAT)) == (None, None)


def test_a_second_embedding_request_waits_for_the_one_slot_while_chats_share_four():
    s = Scheduler()
    s.set_backend(backend_snapshot(row(), probe(), {}, None, None, healthy=True))
    s.set_user("u", 1.0)
    jobs = [Job(f"e{i}", "u", EMBED, 0.0, modality=Modality.EMBEDDINGS, prompt_tokens=100) for i in range(2)]
    jobs += [Job(f"c{i}", "u", CHAT, 0.0, prompt_tokens=100, max_tokens=50) for i in range(3)]
    for job in jobs:
        assert s.submit(job, 0.0) is None
    started = sorted(d.job.id for d in s.dispatch(0.0))
    assert len(started) == 4 and started[:3] == ["c0", "c1", "c2"], started  # one embedding of the two


def test_slots_default_to_parallel_for_a_model_the_backend_does_not_name():
    assert Backend(1, "ws", parallel=4, model_parallel={EMBED: 1}).slots("other") == 4


def _llama_shape(arch: str = "llama") -> ModelShape:
    return ModelShape(architecture=arch, n_layers=32, n_embd=4096, n_heads=32, n_kv_heads=8, head_dim=128)


def test_a_family_ollama_runs_with_one_slot_counts_one():
    vision = "llama3.2-vision:11b"
    p = dataclasses.replace(
        probe(),
        models=frozenset({CHAT, vision}),
        capabilities={CHAT: frozenset({"completion"}), vision: frozenset({"completion", "vision"})},
        shapes={CHAT: _llama_shape(), vision: _llama_shape("mllama")},
    )
    backend = backend_snapshot(row(), p, {}, None, None, healthy=True)
    assert (backend.slots(vision), backend.slots(CHAT)) == (1, 4)


def test_the_vram_estimate_of_a_model_not_loaded_counts_the_kv_cache_of_every_slot_it_will_get():
    """llama3.1:8b at 4,096 tokens: 32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes = 512 MiB a slot."""
    size = 4_920_000_000
    p = dataclasses.replace(probe(), model_sizes={CHAT: size}, shapes={CHAT: _llama_shape()})
    mib = 1024 * 1024
    four = GpuState.vram_estimate(None, row(parallel=4), CHAT, p)  # type: ignore[arg-type]
    one = GpuState.vram_estimate(None, row(parallel=1), CHAT, p)  # type: ignore[arg-type]
    assert (four, one) == (size + 4 * 512 * mib + 512 * mib, size + 512 * mib + 512 * mib)


def test_a_request_asking_another_context_than_the_runner_holds_is_priced_as_a_reload():
    """Ollama reloads a runner for a request with other options (needsReload): not a free start."""
    ollama = Backend(
        1,
        "ws",
        models=frozenset({CHAT}),
        loaded_models=frozenset({CHAT}),
        resident_context={CHAT: 8192},
        model_sizes={CHAT: 5 * 10**9},
        parallel=4,
    )
    s = Scheduler()
    s.set_backend(ollama)
    s.set_user("u", 1.0)
    starts = []
    for i, ctx in enumerate((8192, None, 32768)):
        job = Job(f"j{i}", "u", CHAT, 0.0, prompt_tokens=100, max_tokens=10, context_tokens=ctx)
        assert s.submit(job, 0.0) is None
        [d] = s.dispatch(0.0)
        starts.append(d.record.to_dict()["score_components"]["1"]["start"])
        s.cancel(job.id, 0.0)
    assert starts == [0.0, 0.0, 2.5]  # 5 GB at the default 2 GB/s


def test_a_request_with_keep_alive_0_leaves_its_model_expected_unloaded_once_idle():
    """Ollama honours a request's keep_alive: with 0 the model goes once idle, and its next request loads it."""
    from mindrouter.backends import Call

    body = b'{"model": "llama3.1:8b", "messages": [{"role": "user", "content": "hi"}], "keep_alive": "0s"}'
    assert Call.from_request("/api/chat", body).unload_after
    assert not Call.from_request("/api/chat", body.replace(b'"0s"', b'"5m"')).unload_after
    backend = Backend(1, "ws", models=frozenset({CHAT}), loaded_models=frozenset({CHAT}), model_sizes={CHAT: 5 * 10**9})
    s = Scheduler()
    s.set_backend(backend)
    s.set_user("u", 1.0)
    starts = []
    for i, unload in enumerate((True, False)):
        job = Job(f"j{i}", "u", CHAT, 1.0, prompt_tokens=100, max_tokens=10, unload_after=unload)
        assert s.submit(job, 1.0) is None
        [d] = s.dispatch(1.0)
        starts.append(d.record.to_dict()["score_components"]["1"]["start"])
        s.complete(job.id, 2.0, prompt_tokens=100, completion_tokens=10)
    assert starts == [0.0, 2.5]  # the second loads it again (5 GB at 2 GB/s)
