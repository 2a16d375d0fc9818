"""Ollama as it runs (issue 31): a model that cannot complete (an embedding model) gets one slot whatever
OLLAMA_NUM_PARALLEL (``--parallel``) says, as Ollama's scheduler (server/sched.go) loads it."""

from __future__ import annotations

from types import SimpleNamespace

from mindrouter.backends import Probe
from mindrouter.daemon.pollers.snapshot import backend_snapshot
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
