"""The daemon end to end: official clients -> mr serve -> fake backends on 127.0.0.1."""

from __future__ import annotations

import ollama
import openai
import pytest

from .fakes import FakeOllama, FakeOpenAI
from .harness import until
from .inprocess import InProcess

pytestmark = pytest.mark.asyncio


def oai(daemon, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)


def oll(daemon, key: str) -> ollama.AsyncClient:
    return ollama.AsyncClient(host=daemon.url, headers={"Authorization": f"Bearer {key}"})


@pytest.mark.parametrize("engine", ["ollama", "vllm"])
async def test_openai_client_both_engines_stream_and_not(daemon, engine):
    fake = FakeOllama(models=["llama3"]) if engine == "ollama" else FakeOpenAI(flavor="vllm", models=["llama3"])
    async with fake:
        await daemon.backend("b1", fake.url, engine)
        key = await daemon.user("alice", "faculty")
        client = oai(daemon, key)
        reply = await client.chat.completions.create(
            model="llama3", messages=[{"role": "user", "content": "one two three"}], max_tokens=5
        )
        assert reply.choices[0].message.content == "tok0 tok1 tok2 tok3 tok4"
        assert reply.usage.prompt_tokens == 3 and reply.usage.completion_tokens == 5
        chunks = [
            c
            async for c in await client.chat.completions.create(
                model="llama3", messages=[{"role": "user", "content": "a b"}], max_tokens=4, stream=True
            )
        ]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text.split() == ["tok0", "tok1", "tok2", "tok3"]
        assert all(c.usage is None for c in chunks)  # usage hidden: the client did not ask
        state = next(u for u in daemon.scheduler.share(0).users if u.name == "alice")
        # Charged from the backend's own counts, in service units: a prompt token 1, an answer token 2.
        assert state.served == (3 + 2 * 5) + (2 + 2 * 4)
        assert state.recent_tokens == (3 + 5) + (2 + 4)
        assert fake.in_flight == 0


@pytest.mark.parametrize("engine", ["ollama", "vllm"])
async def test_ollama_client_both_engines_stream_and_not(daemon, engine):
    fake = FakeOllama(models=["llama3"]) if engine == "ollama" else FakeOpenAI(flavor="vllm", models=["llama3"])
    async with fake:
        await daemon.backend("b1", fake.url, engine)
        key = await daemon.user("bob")
        client = oll(daemon, key)
        reply = await client.chat(
            model="llama3", messages=[{"role": "user", "content": "x y z w"}], options={"num_predict": 3}
        )
        assert reply.message.content == "tok0 tok1 tok2"
        assert reply.prompt_eval_count == 4 and reply.eval_count == 3
        parts = [
            p
            async for p in await client.generate(
                model="llama3", prompt="hello there", stream=True, options={"num_predict": 2}
            )
        ]
        assert "".join(p.response for p in parts).split() == ["tok0", "tok1"]
        assert parts[-1].done and parts[-1].eval_count == 2
        state = next(u for u in daemon.scheduler.share(0).users if u.name == "bob")
        assert state.served == (4 + 2 * 3) + (2 + 2 * 2)
        assert state.recent_tokens == (4 + 3) + (2 + 2)


async def test_models_tags_ps_version_need_no_queue(daemon):
    async with FakeOllama(models=["llama3", "mistral"], loaded=["llama3"]) as fake:
        await daemon.backend("b1", fake.url, "ollama")
        key = await daemon.user("carol")
        models = await oai(daemon, key).models.list()
        assert sorted(m.id for m in models.data) == ["llama3", "mistral"]
        client = oll(daemon, key)
        assert sorted(m.model for m in (await client.list()).models) == ["llama3:latest", "mistral:latest"]
        assert [m.model for m in (await client.ps()).models] == ["llama3:latest"]
        resp = await daemon.client.get("/api/version", headers={"Authorization": f"Bearer {key}"})
        assert resp.status == 200 and "version" in await resp.json()
        assert fake.requests == 0


async def test_error_statuses_in_each_dialect(daemon):
    fake = InProcess(models=("llama3",))
    await daemon.backend("b1", fake)
    key = await daemon.user("dave")
    auth = {"Authorization": f"Bearer {key}"}
    c = daemon.client
    r = await c.post("/v1/chat/completions", json={"model": "llama3", "messages": []})
    assert r.status == 401 and (await r.json())["error"]["type"] == "authentication_error"
    r = await c.post("/api/chat", json={"model": "llama3", "messages": []}, headers={"Authorization": "Bearer nope"})
    assert r.status == 401 and isinstance((await r.json())["error"], str)
    r = await c.post("/v1/chat/completions", data=b"{not json", headers=auth)
    assert r.status == 400 and "JSON" in (await r.json())["error"]["message"]
    r = await c.post(
        "/v1/chat/completions",
        json={"model": "gpt-99", "messages": [{"role": "user", "content": "x"}]},
        headers=auth,
    )
    said = (await r.json())["error"]["message"]
    assert r.status == 404 and "gpt-99" in said
    assert "`GET /v1/models`" in said and "mr models" not in said  # people cannot run admin commands
    r = await c.post(
        "/api/chat", json={"model": "gpt-99", "messages": [{"role": "user", "content": "x"}]}, headers=auth
    )
    said = (await r.json())["error"]
    assert r.status == 404 and "gpt-99" in said and "`GET /api/tags`" in said and "mr models" not in said
    big = "x" * (daemon.config.server.max_body_bytes + 10)
    r = await c.post("/v1/chat/completions", data=big.encode(), headers=auth)
    assert r.status == 413
    assert fake.requests == 0


async def test_503_when_every_backend_is_down(daemon):
    fake = FakeOllama(models=["llama3"])
    await fake.start()
    await daemon.backend("b1", fake.url, "ollama")
    key = await daemon.user("erin")
    await fake.go_down()
    await until(lambda: not daemon.registry.healthy(next(iter(daemon.registry.entries.values()))), "still healthy")
    r = await daemon.client.post(
        "/v1/chat/completions",
        json={"model": "llama3", "messages": [{"role": "user", "content": "x"}]},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status == 503 and r.headers.get("Retry-After")
