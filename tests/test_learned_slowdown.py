"""Slowdown with concurrent streams learned per backend (issue 31): a vLLM server's batch is not Ollama's.

The estimate divided every backend's rates by ``1 + stream_slowdown x streams`` (0.2): a vLLM server whose
streams each lose 5% to another was priced as if each lost 20%, so routing spread work (and lost cached
prefixes) to spare a batch that costs almost nothing.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from mindrouter.scheduler import Backend, Job, Scheduler, Timings
from mindrouter.simulate import simulate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from _pool_sim import lab_scenario

MODEL = "chat"


def learned(true_slowdown: float, rounds: int = 60, seed: int = 1) -> float:
    """Answers of one backend whose streams slow each other by ``true_slowdown``; the slowdown it learns."""
    rng = random.Random(seed)
    s = Scheduler()
    s.set_backend(Backend(1, "srv", models=frozenset({MODEL}), loaded_models=frozenset({MODEL}), max_concurrent=16))
    s.set_user("u", 1.0)
    n, t = 0, 0.0
    for _ in range(rounds):
        k = rng.randint(1, 12)
        jobs = []
        for _ in range(k):
            n += 1
            job = Job(f"j{n}", "u", MODEL, t, prompt_tokens=100, max_tokens=200, stream=True)
            assert s.submit(job, t) is None
            jobs.append(job)
        assert len(s.dispatch(t)) == k
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
    load = s.router.load(1)
    assert load is not None and load.slowdown is not None
    return load.slowdown


@pytest.mark.parametrize("true_slowdown", [0.05, 0.2, 0.6])
def test_a_backend_learns_how_much_its_streams_slow_each_other(true_slowdown: float):
    assert learned(true_slowdown) == pytest.approx(true_slowdown, abs=0.03)


def test_equal_replicas_learn_one_slowdown_under_conversations():
    """bench_pool's pool (a): four equal vLLM-like replicas, each stream slowed 5% by each other one.

    The streams beside an answer are counted at its end, a noisy reading of what it ran beside; weighing the
    newest answers 0.05, the four learned 0.033-0.057 (seed 19) and drifted apart all run, routing herded onto the
    lowest, and turns after the first waited for their first token 0.50 s at p95 (mean of 8 seeds) against 0.43 s
    with the line fitted over 16 times as many answers.
    """
    run = simulate(lab_scenario(19, 300.0, 180.0, 300.0, "time-share", conversations=True, pool_name="replicas"))
    router = run.scheduler.router
    slopes = [router.load(bid).slowdown for bid in router.backends]  # type: ignore[union-attr]
    assert len(slopes) == 4
    assert all(s == pytest.approx(0.05, abs=0.01) for s in slopes), slopes  # type: ignore[misc]
