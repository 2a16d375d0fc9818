"""The official openai and ollama clients read what the adapters render, through a 20-line proxy on the seam."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import ollama
import openai
import pytest
from aiohttp import web

from mindrouter.backends import BackendError, Call, Dialect, error_body, make_adapter
from mindrouter.config import BackendSettings
from mindrouter.errors import RequestError
from tests.fakes import FakeOllama, FakeOpenAI, embedding

SETTINGS = BackendSettings(request_timeout=5, connect_timeout=1)

MESSAGES: Any = [{"role": "user", "content": "why is the sky blue"}]  # 5 words


def proxy(engine: str, url: str) -> web.Application:
    """What the daemon's inference handler does, minus auth and scheduling."""
    app = web.Application()
    session_key = web.AppKey("session", aiohttp.ClientSession)

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        app[session_key] = aiohttp.ClientSession()
        yield
        await app[session_key].close()

    async def handle(request: web.Request) -> web.StreamResponse:
        dialect: Dialect = "openai" if request.path.startswith("/v1/") else "ollama"
        adapter = make_adapter(engine, url, request.app[session_key], SETTINGS)
        try:
            call = Call.from_request(request.path, await request.read())
            up = await adapter.open(call, call.model)
        except RequestError as exc:
            return web.Response(
                status=exc.status, body=error_body(dialect, exc.status, exc.message), content_type="application/json"
            )
        except BackendError as exc:
            return web.Response(status=503, body=error_body(dialect, 503, exc.message), content_type="application/json")
        try:
            if up.body is not None:
                return web.Response(body=up.body, status=up.status, headers=up.headers)
            resp = web.StreamResponse(status=up.status, headers=up.headers)
            await resp.prepare(request)
            async for chunk in up:
                await resp.write(chunk)
            return resp
        finally:
            await up.close()

    app.cleanup_ctx.append(session_ctx)
    for path in (
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/api/chat",
        "/api/generate",
        "/api/embed",
    ):
        app.router.add_post(path, handle)
    return app


@pytest.fixture(params=["ollama", "vllm"])
async def routed(
    request: pytest.FixtureRequest, aiohttp_server: Any
) -> AsyncIterator[tuple[str, FakeOllama | FakeOpenAI]]:
    """A proxy in front of one fake backend, both engines in turn."""
    engine = request.param
    fake: FakeOllama | FakeOpenAI = (
        FakeOllama(models=["m:latest"]) if engine == "ollama" else FakeOpenAI(flavor="vllm", models=["m"])
    )
    async with fake:
        server = await aiohttp_server(proxy(engine, fake.url))
        yield str(server.make_url("")).rstrip("/"), fake


async def test_openai_client(routed: tuple[str, Any]) -> None:
    url, fake = routed
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    async with client:
        r = await client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=3)
        assert r.choices[0].message.content == "tok0 tok1 tok2" and r.choices[0].finish_reason == "length"
        assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (5, 3)

        stream = await client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in stream]
        assert (
            "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            == "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"
        )
        assert chunks[-1].usage is not None and (
            chunks[-1].usage.prompt_tokens,
            chunks[-1].usage.completion_tokens,
        ) == (5, 8)

        completions = await client.completions.create(model="m", prompt="once upon a time", max_tokens=2, stream=True)
        pieces = [c async for c in completions]
        assert "".join(c.choices[0].text for c in pieces if c.choices) == "tok0 tok1"
        assert all(c.usage is None for c in pieces), "usage stays hidden unless asked for"

        e = await client.embeddings.create(model="m", input=["red fox", "blue"])  # the client asks for base64
        assert e.data[1].embedding == pytest.approx(embedding("blue", 4), rel=1e-6) and e.usage.prompt_tokens == 3

        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="nope", messages=MESSAGES)
        with pytest.raises(openai.BadRequestError, match='"messages"'):
            await client.chat.completions.create(model="m", messages=[])

        fake.drop_next(after_chunks=2)
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        with pytest.raises(openai.APIError, match="cut off"):
            async for _ in stream:
                pass


async def test_ollama_client(routed: tuple[str, Any]) -> None:
    url, fake = routed
    client = ollama.AsyncClient(host=url)
    r = await client.chat(model="m", messages=MESSAGES, options={"num_predict": 3})
    assert r.message.content == "tok0 tok1 tok2" and r.done_reason == "length"
    assert (r.prompt_eval_count, r.eval_count) == (5, 3)

    parts = [p async for p in await client.chat(model="m", messages=MESSAGES, stream=True)]
    assert "".join(p.message.content or "" for p in parts) == "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"
    assert parts[-1].done and parts[-1].eval_count == 8 and parts[-1].prompt_eval_count == 5

    g = await client.generate(model="m", prompt="once upon a time", options={"num_predict": 2})
    assert g.response == "tok0 tok1" and g.eval_count == 2

    e = await client.embed(model="m", input=["red fox", "blue"])
    assert list(e.embeddings[0]) == pytest.approx(embedding("red fox", 4)) and e.prompt_eval_count == 3

    with pytest.raises(ollama.ResponseError) as info:
        await client.chat(model="nope", messages=MESSAGES)
    assert info.value.status_code == 404

    fake.drop_next(after_chunks=2)
    with pytest.raises(ollama.ResponseError, match="cut off"):
        async for _ in await client.chat(model="m", messages=MESSAGES, stream=True):
            pass
