"""Slowdown learned per backend steers work (issue 31): a vLLM-like batch costs a stream little, Ollama's more.

With one ``stream_slowdown`` (0.2) for every engine, routing split a burst evenly between a vLLM server whose
streams barely slow each other and an Ollama whose streams slow each other a lot, though the vLLM server
finished its share far sooner. Pure core, time passed in.
"""

from __future__ import annotations

import dataclasses
import random

from mindrouter.scheduler import Backend, Job, Scheduler, Timings

MODEL = "chat"
VLLM = Backend(1, "vllm", models=frozenset({MODEL}), loaded_models=frozenset({MODEL}), max_concurrent=16)
OLLAMA = dataclasses.replace(VLLM, id=2, name="ollama")


def train(s: Scheduler, backend: Backend, other: Backend, true_slowdown: float, t: float, seed: int) -> float:
    """Answers on ``backend`` alone (``other`` off) whose streams slow each other by ``true_slowdown``, at 100
    tokens/s alone; returns the clock after them."""
    rng = random.Random(seed)
    s.set_backend(dataclasses.replace(other, enabled=False))
    for r in range(60):
        k = rng.randint(1, 12)
        jobs = [Job(f"{backend.name}{r}-{i}", "u", MODEL, t, prompt_tokens=100, max_tokens=200) for i in range(k)]
        for job in jobs:
            assert s.submit(job, t) is None
        assert {d.backend_id for d in s.dispatch(t)} == {backend.id}
        for i, job in enumerate(jobs):  # the i-th to end ran beside k - i - 1 others
            rate = 100.0 / (1 + true_slowdown * (k - i - 1))
            t += 1.0
            s.complete(
                job.id,
                t,
                prompt_tokens=100,
                completion_tokens=200,
                latency=0.05,
                duration=0.05 + 200 / rate,
                timings=Timings(load=0.0, prefill=0.05, decode=200 / rate),
            )
    s.set_backend(other)
    return t


def burst(vllm_slowdown: float, ollama_slowdown: float) -> int:
    """How many of a burst of 16 jobs go to the vLLM-like backend, after each learned its own slowdown."""
    s = Scheduler()
    s.set_backend(VLLM)
    s.set_backend(OLLAMA)
    s.set_user("u", 1.0)
    t = train(s, VLLM, OLLAMA, vllm_slowdown, 0.0, seed=1)
    t = train(s, OLLAMA, VLLM, ollama_slowdown, t, seed=2)
    jobs = [Job(f"b{i}", "u", MODEL, t, prompt_tokens=100, max_tokens=200) for i in range(16)]
    for job in jobs:
        assert s.submit(job, t) is None
    out = s.dispatch(t)
    assert len(out) == 16
    return sum(d.backend_id == VLLM.id for d in out)


def test_a_backend_whose_streams_barely_slow_each_other_gets_more_of_a_burst():
    """vLLM-like (0.03 per stream) beside Ollama-like (0.5): 15 of 16 go to the vLLM-like server, where two
    alike split 8 / 8."""
    assert burst(0.2, 0.2) == 8
    assert burst(0.03, 0.5) >= 13
