"""The fake Ollama workstation of bench_pool.py loads, evicts, keeps alive and limits slots as sched.go does.

It is the simulator's workstation model (``mindrouter.simulate.workstation``) on a
scaled clock behind Ollama's wire format. Lab seconds below; the workstation runs
``C`` times faster and reports wall nanoseconds, so a lab second reads as
``1e9 / C`` ns.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from _ollama_app import STATION, create_app, keep_alive_seconds

from mindrouter.simulate.scenario import GB, BackendSpec, ModelSpec

C = 50.0
NS = 1e9 / C
"""Reported nanoseconds per lab second."""
MODELS = {
    "a:latest": ModelSpec("a:latest", size=5, vram=10),
    "b:latest": ModelSpec("b:latest", size=5, vram=10),
    "c:latest": ModelSpec("c:latest", size=5, vram=10),
    "e:latest": ModelSpec("e:latest", size=0.5, vram=1, kind="embedding"),
}


def spec(**kw: Any) -> BackendSpec:
    fields: dict[str, Any] = {
        "name": "ws",
        "models": tuple(MODELS),
        "max_concurrent": 8,
        "tokens_per_second": 100.0,
        "prefill_tokens_per_second": 1000.0,
        "loaded_models": (),
        "vram": 24.0,
        "load_seconds_per_gb": 1.0,
        "load_start_seconds": 1.0,
        "parallel": 2,
        "max_loaded": 3,
        "keep_alive": 300.0,
        "slowdown": 0.25,
    }
    return BackendSpec(**{**fields, **kw})


@pytest.fixture
def workstation(aiohttp_client):  # type: ignore[no-untyped-def]
    async def make(**kw: Any) -> Any:
        return await aiohttp_client(create_app(spec(**kw), MODELS, C))

    return make


async def chat(client: Any, model: str, out: int = 10, prompt: int = 100, **extra: Any) -> dict[str, Any]:
    body = {"model": model, "prompt": " ".join(["w"] * prompt), "stream": False, "options": {"num_predict": out}}
    resp = await client.post("/api/generate", json={**body, **extra})
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def resident(client: Any) -> list[str]:
    return [m["name"] for m in (await (await client.get("/api/ps")).json())["models"]]


async def test_a_load_takes_size_times_speed_and_the_model_stays(workstation) -> None:  # type: ignore[no-untyped-def]
    client = await workstation()
    first = await chat(client, "a", out=20, prompt=500)
    assert first["load_duration"] == pytest.approx(6 * NS, rel=0.25)  # 1 s start + 5 GB at 1 s/GB
    assert first["prompt_eval_count"] == 500 and first["prompt_eval_duration"] == pytest.approx(0.5 * NS, rel=0.01)
    assert first["eval_count"] == 20 and first["eval_duration"] == pytest.approx(0.2 * NS, rel=0.01)
    ps = (await (await client.get("/api/ps")).json())["models"]
    assert [m["name"] for m in ps] == ["a:latest"] and ps[0]["size_vram"] == 10 * GB
    second = await chat(client, "a")
    assert second["load_duration"] < 0.5 * NS
    stats = await (await client.get("/bench/stats")).json()
    assert stats["loads"] == 1 and stats["load_seconds"] == pytest.approx(6.0)
    assert (await (await client.get("/gpus")).json())[0]["memory_free"] == 14 * GB


async def test_an_idle_model_is_evicted_when_vram_is_needed_first_by_keep_alive_then_name(workstation) -> None:  # type: ignore[no-untyped-def]
    client = await workstation()
    await chat(client, "b")
    await chat(client, "a", keep_alive="10m")  # longer keep_alive: evicted after b
    await chat(client, "c")  # 30 GB would not fit in 24
    assert sorted(await resident(client)) == ["a:latest", "c:latest"]
    stats = await (await client.get("/bench/stats")).json()
    assert stats["loads"] == 3 and stats["evictions"] == 1


async def test_a_busy_model_is_not_evicted_and_a_load_waits_when_all_are_busy(workstation) -> None:  # type: ignore[no-untyped-def]
    client = await workstation()
    await asyncio.gather(chat(client, "a"), chat(client, "b"))
    long_a = asyncio.create_task(chat(client, "a", out=2000))  # 20 lab s of decoding alone
    await asyncio.sleep(2 / C)
    await chat(client, "c")  # b is idle: it goes, a stays
    assert sorted(await resident(client)) == ["a:latest", "c:latest"] and not long_a.done()
    long_c = asyncio.create_task(chat(client, "c", out=4000))
    await asyncio.sleep(2 / C)
    waited = await chat(client, "b")  # a and c busy: wait for a (first by name) to finish, then load b
    assert long_a.done() and not long_c.done()
    assert waited["load_duration"] > 15 * NS
    assert sorted(await resident(client)) == ["b:latest", "c:latest"]
    await long_c


async def test_keep_alive_expires_and_zero_unloads_at_once(workstation) -> None:  # type: ignore[no-untyped-def]
    client = await workstation(keep_alive=5.0)
    await chat(client, "a")
    ps = (await (await client.get("/api/ps")).json())["models"]
    assert ps[0]["expires_at"].endswith("Z")
    await asyncio.sleep(1.0 / C)
    assert await resident(client) == ["a:latest"]
    await asyncio.sleep(5.0 / C)
    assert await resident(client) == []
    await chat(client, "b", keep_alive=0)
    assert await resident(client) == []
    stats = await (await client.get("/bench/stats")).json()
    assert stats["expiries"] == 1 and stats["loads"] == 2
    assert keep_alive_seconds("5m") == 300 and keep_alive_seconds(-1) == float("inf")


async def test_max_loaded_models_evicts_even_when_vram_is_free(workstation) -> None:  # type: ignore[no-untyped-def]
    client = await workstation(vram=80.0, max_loaded=2)
    for model in ("a", "b", "c"):
        await chat(client, model)
    assert sorted(await resident(client)) == ["b:latest", "c:latest"]


async def test_parallel_slots_per_model_and_streams_slow_each_other(workstation) -> None:  # type: ignore[no-untyped-def]
    client = await workstation()
    await chat(client, "a")
    ws = client.server.app[STATION]
    runs = [asyncio.create_task(chat(client, "a", out=500, prompt=1)) for _ in range(3)]
    await asyncio.sleep(2 / C)
    runner = ws.runners["a:latest"]
    assert runner.active == 2 and len(runner.queue) == 1  # OLLAMA_NUM_PARALLEL=2
    answers = await asyncio.gather(*runs)
    took = sorted(a["eval_duration"] for a in answers)
    # two streams in one batch: each at 100 / 1.25 tok/s (1.6x one stream's tokens/s together);
    # the third waited for a slot and ran alone
    assert took[-1] == pytest.approx(6.25 * NS, rel=0.05) and took[0] == pytest.approx(5 * NS, rel=0.05)
    body = {"model": "e", "input": ["w " * 2000]}
    embeds = await asyncio.gather(*(client.post("/api/embed", json=body) for _ in range(2)))
    replies = [await r.json() for r in embeds]
    assert ws.runners["e:latest"].slots == 1  # embedding models get one slot
    for reply in replies:  # one at a time: neither slowed by the other
        assert reply["embeddings"] and reply["prompt_eval_count"] == 2000
        assert reply["prompt_eval_duration"] == pytest.approx(2.0 * NS, rel=0.02)
    assert max(r["total_duration"] for r in replies) > 4 * NS


async def test_a_conversations_next_turn_prefills_only_its_new_message_and_counts_its_whole_prompt(
    workstation,
) -> None:  # type: ignore[no-untyped-def]
    """Ollama (llama-server) reports the whole prompt as prompt_eval_count, the part computed in its duration."""
    client = await workstation()
    system = {"role": "system", "content": " ".join(["s"] * 1000)}
    first = [system, {"role": "user", "content": " ".join(["q1"] * 100)}]
    body = {"model": "a", "stream": False, "options": {"num_predict": 10}}
    one = await (await client.post("/api/chat", json={**body, "messages": first})).json()
    assert one["prompt_eval_count"] == 1100 and one["prompt_eval_duration"] == pytest.approx(1.1 * NS, rel=0.02)
    history = [*first, one["message"], {"role": "user", "content": " ".join(["q2"] * 100)}]
    two = await (await client.post("/api/chat", json={**body, "messages": history})).json()
    assert two["prompt_eval_count"] == 1210  # 1100 + the 10-token answer + 100
    assert two["prompt_eval_duration"] == pytest.approx(0.1 * NS, rel=0.02)  # only the new message


async def test_a_vllm_face_reports_the_cached_tokens_of_its_prefix_blocks(workstation) -> None:  # type: ignore[no-untyped-def]
    client = await workstation(engine="vllm", vram=None, loaded_models=tuple(MODELS), parallel=None)
    body = {"model": "a:latest", "max_tokens": 5, "messages": [{"role": "user", "content": " ".join(["w"] * 100)}]}
    first = await (await client.post("/v1/chat/completions", json=body)).json()
    again = await (await client.post("/v1/chat/completions", json=body)).json()
    assert first["usage"]["prompt_tokens"] == again["usage"]["prompt_tokens"] == 100
    assert (first["usage"]["prompt_tokens_details"], again["usage"]["prompt_tokens_details"]) == (
        {"cached_tokens": 0},
        {"cached_tokens": 96},  # 6 whole blocks of 16; the last token is always computed
    )
