"""Issue 30, case 4: a service unit that follows the GPU (``service_unit = "gpu"``, ``fairness/prices.py``).

Three equal users on one 4-slot GPU (the ``reader-writer-embedder`` example): a reader of 8,000-token prompts
with 50-token answers, a writer of 100-token prompts with 1,000-token answers, an embedder of 2,000-token texts.
With tokens (1 and 2 units) each gets a third of the units, and the writer 70% of the GPU's slot time at 10x
prefill speed, 91% at 50x. With the GPU unit each gets a third of the slot time within a point.
"""

from __future__ import annotations

import dataclasses

import pytest

from mindrouter.scheduler import SchedulerSettings
from mindrouter.scheduler.fairness.prices import Prices
from mindrouter.scheduler.jobs import Job, Modality, Timings
from mindrouter.scheduler.routing.backend import BackendLoad
from mindrouter.scheduler.routing.estimate import Speeds
from mindrouter.scheduler.routing.learning import Sample, learn
from mindrouter.simulate import build, load_example, simulate


def gpu_shares(unit: str, speedup: int) -> dict[str, float]:
    sc = load_example("reader-writer-embedder")
    backends = tuple(dataclasses.replace(b, prefill_tokens_per_second=50.0 * speedup) for b in sc.backends)
    sc = sc.replace(duration=600, backends=backends, settings=SchedulerSettings(service_unit=unit))
    return {u["name"]: u["gpu_share"] for u in build(simulate(sc))["users"]}


@pytest.mark.parametrize("speedup", [10, 50])
def test_the_gpu_unit_gives_reader_writer_and_embedder_a_third_of_the_gpu_each(speedup):
    for name, share in gpu_shares("gpu", speedup).items():
        assert abs(share - 1 / 3) <= 0.05, (name, share)


@pytest.mark.parametrize(("speedup", "writer_at_least"), [(10, 0.65), (50, 0.85)])
def test_tokens_units_sell_the_gpu_to_the_writer(speedup, writer_at_least):
    shares = gpu_shares("tokens", speedup)
    assert shares["writer"] >= writer_at_least, shares
    assert shares["reader"] < 0.2 and shares["embedder"] < 0.2, shares


def test_a_prompt_token_weighs_the_answer_token_times_decode_over_prefill():
    prices = Prices(SchedulerSettings(service_unit="gpu"))
    assert prices.prompt_weight("llama3") == pytest.approx(2.0 / 20)  # prefill_speedup until measured
    prices.learned("llama3", 50.0, 2500.0)
    prices.learned("embed", None, 5000.0)
    assert prices.cost("llama3", 8000, 50) == pytest.approx(8000 * 2 * 50 / 2500 + 100)
    assert prices.prompt_weight("embed") == pytest.approx(2 * 50 / 5000)  # priced against the chat models' decode
    tokens = Prices(SchedulerSettings())
    tokens.learned("llama3", 50.0, 2500.0)
    assert tokens.cost("llama3", 8000, 50) == 8100


def test_an_unknown_service_unit_is_refused_in_words():
    with pytest.raises(ValueError, match='service_unit must be "tokens" or "gpu"'):
        SchedulerSettings(service_unit="seconds")


def test_an_embeddings_whole_answer_teaches_its_models_prefill_rate():
    """An embedding is all prompt: the time to its answer is its reading, which the gpu unit prices by."""
    load, speeds = BackendLoad(in_flight=1), Speeds()
    job = Job("e1", "embedder", "embed", 0.0, modality=Modality.EMBEDDINGS, prompt_tokens=2000)
    learn(load, speeds, job, Sample(2000, 0, 0.8, 0.8, Timings(), None), SchedulerSettings())
    assert speeds.best["embed"].prefill == pytest.approx(2500)
    assert speeds.best["embed"].decode is None
