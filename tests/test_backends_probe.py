"""Probing every engine against the fakes: health, models, load."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from mindrouter.backends import Call, make_adapter
from mindrouter.backends._prometheus import Samples
from mindrouter.backends.probe import Reply
from mindrouter.config import BackendSettings
from mindrouter.errors import ConfigError
from tests.fakes import FakeOllama, FakeOpenAI
from tests.harness import until


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def adapter(engine: str, url: str, session: aiohttp.ClientSession):  # type: ignore[no-untyped-def]
    return make_adapter(engine, url, session, BackendSettings(request_timeout=5, connect_timeout=0.5))


async def test_ollama_probe_reads_tags_ps_version_and_show(session: aiohttp.ClientSession) -> None:
    models = {"llama3.2:latest": 2_019_393_189, "llava:7b": 4_733_363_377}
    async with FakeOllama(
        models=models, loaded=["llava:7b"], capabilities={"llava:7b": ["completion", "vision"]}
    ) as fake:
        a = adapter("ollama", fake.url + "/", session)
        p = await a.probe()
        assert p.healthy and p.error is None and p.version == "0.6.5"
        assert p.models == {"llama3.2:latest", "llava:7b"}, "as Ollama spells them; model_key makes them one"
        assert p.loaded_models == {"llava:7b"}
        assert p.loaded_vram == {"llava:7b": 4_733_363_377}
        assert p.model_sizes["llama3.2:latest"] == 2_019_393_189
        assert p.details["llava:7b"]["expires_at"] == "2030-01-01T00:00:00Z"
        assert p.capabilities["llava:7b"] == {"completion", "vision"}
        assert p.capabilities["llama3.2:latest"] == {"completion", "tools"}
        assert fake.show_requests == 2
        await a.probe()
        assert fake.show_requests == 2, "capabilities are asked once per model digest"
        # Serving a request loads the model, as Ollama does; the next probe sees it.
        up = await a.open(
            Call.from_request("/api/generate", b'{"model": "llama3.2", "prompt": "hi", "stream": false}'), "llama3.2"
        )
        await up.close()
        assert (await a.probe()).loaded_models == {"llava:7b", "llama3.2:latest"}


async def test_openai_probe_without_health_endpoint(session: aiohttp.ClientSession) -> None:
    async with FakeOpenAI(flavor="openai", models=["a", "b"]) as fake:
        p = await adapter("openai", fake.url + "/v1", session).probe()
        assert p.healthy and p.models == {"a", "b"} and p.loaded_models == {"a", "b"}
        assert p.running is None and p.kv_cache_usage is None


async def test_vllm_probe_reads_metrics(session: aiohttp.ClientSession) -> None:
    async with FakeOpenAI(
        flavor="vllm", models=["qwen"], max_concurrent=2, tokens_per_second=500, completion_tokens=50
    ) as fake:
        a = adapter("vllm", fake.url, session)
        body = json.dumps({"model": "qwen", "prompt": "one two three", "max_tokens": 50}).encode()
        tasks = [asyncio.create_task(a.open(Call.from_request("/v1/completions", body), "qwen")) for _ in range(3)]
        await until(lambda: fake.running + fake.waiting == 3, "two running and one waiting")
        p = await a.probe()
        assert p.healthy and p.version == "0.9.1" and p.loaded_models == {"qwen"}
        assert (p.running, p.waiting, p.kv_cache_usage) == (2, 1, 1.0)
        for t in tasks:
            await (await t).close()
        p = await a.probe()
        assert (p.running, p.waiting, p.prompt_tokens_total, p.completion_tokens_total) == (0, 0, 9, 150)


async def test_vllm_falls_back_to_gpu_cache_usage(session: aiohttp.ClientSession) -> None:
    async with FakeOpenAI(flavor="vllm", models=["qwen"]) as fake:
        fake.legacy_metrics = True
        fake.kv_cache_usage = 0.375
        assert (await adapter("vllm", fake.url, session).probe()).kv_cache_usage == 0.375


async def test_vllm_unhealthy_when_health_fails(session: aiohttp.ClientSession) -> None:
    async with FakeOpenAI(flavor="vllm", models=["qwen"]) as fake:
        fake.health_status = 503
        p = await adapter("vllm", fake.url, session).probe()
        assert not p.healthy and "/health answered HTTP 503" in (p.error or "")


async def test_llamacpp_probe_reads_slots_and_metrics(session: aiohttp.ClientSession) -> None:
    async with FakeOpenAI(
        # 2 s answers: the probe must see three running and one waiting however busy the machine is.
        flavor="llamacpp",
        models=["tiny"],
        max_concurrent=3,
        tokens_per_second=25,
        completion_tokens=50,
    ) as fake:
        a = adapter("llamacpp", fake.url, session)
        body = json.dumps(
            {"model": "tiny", "messages": [{"role": "user", "content": "a b"}], "max_tokens": 50}
        ).encode()
        tasks = [asyncio.create_task(a.open(Call.from_request("/v1/chat/completions", body), "tiny")) for _ in range(4)]
        await until(lambda: fake.running + fake.waiting == 4, "three running and one waiting")
        p = await a.probe()
        assert p.healthy and p.version == "b5000-fake"
        assert (p.slots_total, p.slots_busy, p.running, p.waiting) == (3, 3, 3, 1)
        for t in tasks:
            async with await t as upstream:
                async for _ in upstream:  # each answer read whole, so the server counts all its tokens
                    pass
        p = await a.probe()
        assert (p.slots_busy, p.prompt_tokens_total, p.completion_tokens_total) == (0, 8, 200)


async def test_llamacpp_without_slots_or_metrics_is_still_healthy(session: aiohttp.ClientSession) -> None:
    async with FakeOpenAI(flavor="llamacpp", models=["tiny"], slots=2) as fake:
        fake.slots_enabled = fake.metrics_enabled = False
        p = await adapter("llamacpp", fake.url, session).probe()
        assert p.healthy and p.models == {"tiny"}
        assert (p.slots_total, p.slots_busy, p.running, p.waiting) == (2, None, None, None)


async def test_llamacpp_loading_model_is_unhealthy(session: aiohttp.ClientSession) -> None:
    async with FakeOpenAI(flavor="llamacpp", models=["tiny"]) as fake:
        fake.health_status = 503
        p = await adapter("llamacpp", fake.url, session).probe()
        assert not p.healthy and "Loading model" in (p.error or "")


@pytest.mark.parametrize("engine", ["ollama", "openai", "vllm", "llamacpp"])
async def test_unhealthy_when_down_and_healthy_again_when_up(engine: str, session: aiohttp.ClientSession) -> None:
    fake = (
        FakeOllama(models=["m"])
        if engine == "ollama"
        else FakeOpenAI(flavor="openai" if engine == "openai" else engine, models=["m"])
    )
    async with fake:
        a = adapter(engine, fake.url, session)
        await fake.go_down()
        p = await a.probe()
        assert not p.healthy and p.models == frozenset()
        assert p.error and "cannot connect" in p.error and str(fake.port) in p.error
        await fake.come_up()
        assert (await a.probe()).healthy


async def test_wrong_kind_of_server_is_unhealthy(aiohttp_server, session: aiohttp.ClientSession) -> None:  # type: ignore[no-untyped-def]
    app = web.Application()

    async def tags(request: web.Request) -> web.Response:
        return web.json_response({"hello": "world"})

    async def models(request: web.Request) -> web.Response:
        return web.Response(text="<html>")

    app.router.add_get("/api/tags", tags)
    app.router.add_get("/v1/models", models)
    server = await aiohttp_server(app)
    url = str(server.make_url(""))
    assert "is this an Ollama server" in ((await adapter("ollama", url, session).probe()).error or "")
    assert "OpenAI-compatible" in ((await adapter("openai", url, session).probe()).error or "")


def test_make_adapter_refuses_unknown_engines() -> None:
    with pytest.raises(ConfigError, match="unknown engine 'tgi'"):
        make_adapter("tgi", "http://x", None)  # type: ignore[arg-type]


def test_prometheus_samples_tolerate_garbage_and_sum_labels() -> None:
    text = (
        b"# TYPE vllm:num_requests_running gauge\n"
        b'vllm:num_requests_running{model_name="a"} 2\n'
        b'vllm:num_requests_running{model_name="b"} 3\n'
    )
    m = Samples(Reply(200, text + b'# TYPE other histogram\nother_bucket{le="1"} 4\n'), ("vllm:num_requests_running",))
    assert m.count("vllm:num_requests_running") == 5 and m.highest("vllm:num_requests_running") == 3
    assert m.total("missing") is None and "other_bucket" not in m.values
    assert not Samples(Reply(200, b"vllm:num_requests_running <html>not metrics</html>"), ("vllm:",))
    assert not Samples(Reply(501, b""), ("vllm:",))
