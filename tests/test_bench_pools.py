"""bench_pool's pools (``benchmarks/_pools.py``): every model their users send has a workstation that holds it.

Besides issue 17's lab and the vLLM replicas, three pools the router was not tuned on (issue 31's held-out
pools): ``six`` (a second RTX 4090, and an RTX A6000 that the 70B fills alone), ``two-popular`` (two
8B-class chat models and a 32B that loads on the RTX 4090 only into an empty GPU) and ``mixed`` (a vLLM
server that lists the chat model by its Hugging Face id). The fakes run the
simulator's workstation model, so what loads beside what is the simulator's rule (``HEADROOM``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mindrouter.simulate.scenario import SHARING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from _lab import capacity, full_batch, mean_work, users, workload
from _ollama_app import create_app
from _pool_sim import lab_scenario, scenario_requests
from _pools import BIG, CHAT, EMBED, GEMMA, KINDS, MODELS, POOL, POOL_KINDS, POOLS, QWEN32

from .test_workstation import chat, resident

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
C = 200.0
"""Lab seconds per wall second for the fakes below: the 32B's 8 s load takes 40 ms."""


def station(pool_name: str, name: str) -> Any:
    return next(ws for ws in POOLS[pool_name] if ws.name == name)


@pytest.mark.parametrize("name", POOLS)
def test_every_pool_has_a_positive_finite_capacity(name: str) -> None:
    rate = capacity(POOLS[name], POOL_KINDS[name])
    assert 0 < rate < math.inf


def test_the_lab_estimate_is_as_before_and_two_equal_homes_of_the_70b_double_it() -> None:
    assert capacity() == pytest.approx(1.7687, rel=1e-4)  # what bench_pool printed before the held-out pools
    twins = (*POOL, *(dataclasses.replace(ws, name=ws.name + "b") for ws in POOL))
    assert capacity(twins, KINDS) == pytest.approx(2 * capacity(), rel=1e-9)
    # a second, slower home for the 70B (the A6000) costs the estimate under 2% against the H100 alone
    six = POOLS["six"]
    without = (*six[:-1], dataclasses.replace(six[-1], models=tuple(m for m in six[-1].models if m != BIG)))
    assert 0.98 * capacity(without, KINDS) < capacity(six, KINDS) < capacity(without, KINDS)


@pytest.mark.parametrize("name", POOLS)
def test_every_model_users_send_is_on_a_workstation_that_holds_it(name: str) -> None:
    for kind in POOL_KINDS[name]:
        assert any(kind.model in ws.models for ws in POOLS[name]), kind.model
    for ws in POOLS[name]:
        if ws.vram is None:  # a vLLM-style replica: its one model is resident for good
            continue
        assert all(MODELS[m].vram <= ws.vram for m in ws.models), ws.name
        assert sum(MODELS[m].vram for m in ws.loaded_models) <= ws.vram, ws.name


@pytest.mark.parametrize("name", POOLS)
def test_user_names_are_unique_and_every_user_sends(name: str) -> None:
    names = [user for user, _ in users(POOL_KINDS[name])]
    assert len(names) == len(set(names)) == sum(k.users for k in POOL_KINDS[name])
    sent = workload(17, 120.0, 90.0, pool_name=name)
    assert {r.user for r in sent} == set(names)
    assert {r.model for r in sent} == {k.model for k in POOL_KINDS[name]}


def test_the_held_out_pools_are_the_lab_and_more_and_the_lab_gpus_with_other_models() -> None:
    six = POOLS["six"]
    assert six[:4] == POOL and [ws.name for ws in six[4:]] == ["ws-4090b", "ws-a6000"]
    assert six[4].rates == POOL[1].rates and six[4].vram == POOL[1].vram == 24
    assert [ws.name for ws in six if BIG in ws.models] == ["ws-h100", "ws-a6000"]
    two = POOLS["two-popular"]
    assert [ws.vram for ws in two] == [ws.vram for ws in POOL] == [80, 24, 16, 12]
    assert [ws.name for ws in two if GEMMA in ws.loaded_models] == ["ws-4090", "ws-4080", "ws-3060"]
    assert [ws.name for ws in two if QWEN32 in ws.models] == ["ws-h100", "ws-4090"]


@pytest.mark.parametrize(
    ("pool_name", "name", "alone", "other"),
    [("two-popular", "ws-4090", QWEN32, CHAT), ("six", "ws-a6000", BIG, CHAT)],
)
async def test_a_model_that_fits_only_alone_clears_the_gpu_and_leaves_for_the_next(
    aiohttp_client: Any, pool_name: str, name: str, alone: str, other: str
) -> None:
    spec = station(pool_name, name)
    client = await aiohttp_client(create_app(spec, MODELS, C))
    assert sorted(await resident(client)) == sorted(spec.loaded_models)
    for model in (alone, other, alone):  # each evicts what is idle there, the embedding model too
        await chat(client, model, out=5)
        assert await resident(client) == [model]


def test_the_conversations_workload_has_gemma2_users_converse_and_the_32b_users_ask_once() -> None:
    sc = lab_scenario(17, 120.0, 90.0, 300.0, SHARING[0], conversations=True, pool_name="two-popular")
    requests = scenario_requests(sc, 120.0)
    by_model = {m: [r for r in requests if r.model == m] for m in (CHAT, GEMMA, QWEN32, EMBED)}
    assert all(by_model.values())
    assert all(r.conversation is not None for r in by_model[GEMMA] + by_model[CHAT])
    assert all(r.conversation is None for r in by_model[QWEN32] + by_model[EMBED])


def test_a_pool_refuses_a_workload_it_does_not_run_in_one_sentence() -> None:
    cmd = [sys.executable, str(BENCHMARKS / "bench_pool.py"), "--pool", "replicas"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith("error: --pool replicas runs --workload scenario or conversations, not lab")
    )


async def test_the_vllm_server_lists_its_hugging_face_id_and_the_baselines_map_the_tag_to_it(
    aiohttp_server: Any, aiohttp_client: Any
) -> None:
    """``mixed``: the fake vLLM server serves the chat model as ``meta-llama/...`` only; a baseline told the alias
    (as a LiteLLM model_list is) sends it requests for ``llama3.1:8b`` under that name."""
    import aiohttp
    from _pools import ALIASES, HF_CHAT, served
    from _routers import create_router, learn_models

    spec = served(station("mixed", "vllm-a100"))
    assert spec.models == spec.loaded_models == (HF_CHAT,) and set(spec.rates) == {HF_CHAT}
    vllm = await aiohttp_server(create_app(spec, MODELS, C))
    url = str(vllm.make_url("")).rstrip("/")
    async with aiohttp.ClientSession() as s:
        assert await learn_models(s, [url]) == {HF_CHAT: {url: HF_CHAT}}
        models = await learn_models(s, [url], ALIASES)
    assert models == {CHAT: {url: HF_CHAT}}
    router = await aiohttp_client(create_router("least-busy", models))
    body = {"model": CHAT, "messages": [{"role": "user", "content": "a b c"}], "max_tokens": 3}
    answer = await router.post("/v1/chat/completions", json=body)
    assert answer.status == 200, await answer.text()
    assert (await answer.json())["usage"]["completion_tokens"] == 3
    direct = await (await aiohttp_client(create_app(spec, MODELS, C))).post("/v1/chat/completions", json=body)
    assert direct.status == 404  # the tag alone is not a name this server knows


def test_the_litellm_targets_without_litellm_are_refused_in_one_sentence() -> None:
    cmd = [sys.executable, str(BENCHMARKS / "bench_pool.py"), "--only", "litellm least-busy"]
    env = {k: v for k, v in os.environ.items() if k != "MR_BENCH_LITELLM"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, env=env)
    assert done.returncode == 2, done.stderr  # was a TypeError from deep inside the run
    assert done.stderr.strip().splitlines()[-1].endswith("pass --litellm PATH or set MR_BENCH_LITELLM")


@pytest.mark.parametrize("name", POOLS)
def test_no_model_arrives_faster_than_its_homes_serve_it_alone(name: str) -> None:
    """At 1x the pool's capacity each model's arrivals fit what its workstations serve with nothing else there:
    with the lab's shares, ``mixed`` (a vLLM server adding chat capacity) sent the 70B twice what the H100
    serves, and both routers lost requests to its timeouts."""
    rate = capacity(POOLS[name], POOL_KINDS[name])
    for kind in POOL_KINDS[name]:
        alone = sum(
            full_batch(ws) / mean_work(kind, ws.rates[kind.model]) for ws in POOLS[name] if kind.model in ws.models
        )
        assert kind.share * rate <= 1.01 * alone, (kind.model, kind.share * rate, alone)
