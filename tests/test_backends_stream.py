"""Opening calls on every engine, in every dialect, streaming and not, with exact usage and faults."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from mindrouter.backends import Adapter, BackendError, Call, Upstream, make_adapter
from mindrouter.config import BackendSettings
from tests.fakes import FakeOllama, FakeOpenAI, embedding
from tests.harness import until

SETTINGS = BackendSettings(request_timeout=5, connect_timeout=1)

TEXT3 = "tok0 tok1 tok2"
TEXT8 = "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "why is the sky blue"}]  # 7 words


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def ollama(session: aiohttp.ClientSession) -> AsyncIterator[tuple[FakeOllama, Adapter]]:
    async with FakeOllama(models=["llama3.2:latest", "embed:latest"]) as fake:
        yield fake, make_adapter("ollama", fake.url, session, SETTINGS)


@pytest.fixture
async def vllm(session: aiohttp.ClientSession) -> AsyncIterator[tuple[FakeOpenAI, Adapter]]:
    async with FakeOpenAI(flavor="vllm", models=["qwen"]) as fake:
        yield fake, make_adapter("vllm", fake.url, session, SETTINGS)


def call(path: str, **body: Any) -> Call:
    return Call.from_request(path, json.dumps(body).encode())


async def drain(up: Upstream) -> bytes:
    try:
        return b"".join([chunk async for chunk in up])
    finally:
        await up.close()


def sse(data: bytes) -> list[Any]:
    """The payloads of an SSE stream; "[DONE]" stays a string."""
    assert data.endswith(b"\n\n")
    events = [e for e in data.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in events), data
    return [e[6:].decode() if e == b"data: [DONE]" else json.loads(e[6:]) for e in events]


def ndjson(data: bytes) -> list[dict[str, Any]]:
    """NDJSON lines, or the one JSON body of a non-streaming answer."""
    assert data.endswith(b"\n") or b"\n" not in data
    return [json.loads(line) for line in data.splitlines()]


def check_openai_stream(events: list[Any], kind: str, text: str, finish: str, usage: tuple[int, int] | None) -> None:
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    for c in chunks:
        assert c["object"] == obj and c["id"] and isinstance(c["created"], int) and c["model"]
    with_choices = [c for c in chunks if c["choices"]]
    if kind == "chat":
        assert with_choices[0]["choices"][0]["delta"]["role"] == "assistant"
        got = "".join(c["choices"][0]["delta"].get("content") or "" for c in with_choices)
    else:
        got = "".join(c["choices"][0]["text"] for c in with_choices)
    assert got == text
    assert [c["choices"][0]["finish_reason"] for c in with_choices if c["choices"][0]["finish_reason"]] == [finish]
    usage_chunks = [c for c in chunks if c.get("usage")]
    if usage is None:
        assert usage_chunks == []
    else:
        assert len(usage_chunks) == 1 and usage_chunks[0]["choices"] == []
        assert usage_chunks[0]["usage"] == {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": sum(usage),
        }


def check_ollama_stream(lines: list[dict[str, Any]], key: str, text: str, reason: str, usage: tuple[int, int]) -> None:
    for line in lines:
        assert line["model"] and line["created_at"].endswith("Z") and isinstance(line["done"], bool)
    *parts, final = lines
    assert all(not p["done"] for p in parts) and final["done"] is True
    if key == "message":
        assert all(p["message"]["role"] == "assistant" for p in lines)
    got = "".join(p["message"]["content"] if key == "message" else p["response"] for p in lines)
    assert got == text
    assert final["done_reason"] == reason
    assert (final["prompt_eval_count"], final["eval_count"]) == usage
    assert final["total_duration"] > 0 and final["eval_duration"] >= 0


# ---- OpenAI client -------------------------------------------------------------------------


@pytest.mark.parametrize("wants_usage", [False, True])
async def test_openai_stream_on_vllm_hides_usage_unless_asked(
    vllm: tuple[FakeOpenAI, Adapter], wants_usage: bool
) -> None:
    fake, a = vllm
    extra = {"stream_options": {"include_usage": True}} if wants_usage else {}
    up = await a.open(
        call("/v1/chat/completions", model="qwen", messages=MESSAGES, stream=True, max_tokens=3, **extra), "qwen"
    )
    assert up.headers["Content-Type"] == "text/event-stream" and up.status == 200 and up.body is None
    check_openai_stream(sse(await drain(up)), "chat", TEXT3, "length", (7, 3) if wants_usage else None)
    assert (up.usage.prompt_tokens, up.usage.completion_tokens) == (7, 3)
    assert up.error is None and up.done
    assert fake.received[-1].body["stream_options"] == {"include_usage": True}, (
        "the daemon always asks upstream for usage"
    )


@pytest.mark.parametrize("wants_usage", [False, True])
@pytest.mark.parametrize("kind", ["chat", "completion"])
async def test_openai_stream_on_ollama(ollama: tuple[FakeOllama, Adapter], kind: str, wants_usage: bool) -> None:
    fake, a = ollama
    extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if wants_usage else {}
    extra.update({"messages": MESSAGES} if kind == "chat" else {"prompt": "why is the sky blue"})
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    up = await a.open(call(path, model="llama3.2", stream=True, max_tokens=3, **extra), "llama3.2")
    prompt = 7 if kind == "chat" else 5
    check_openai_stream(sse(await drain(up)), kind, TEXT3, "length", (prompt, 3) if wants_usage else None)
    assert (up.usage.prompt_tokens, up.usage.completion_tokens) == (prompt, 3)
    sent = fake.received[-1]
    assert sent.path == ("/api/chat" if kind == "chat" else "/api/generate")
    assert sent.body["options"] == {"num_predict": 3} and sent.body["stream"] is True


@pytest.mark.parametrize("kind", ["chat", "completion"])
async def test_openai_non_stream_on_ollama(ollama: tuple[FakeOllama, Adapter], kind: str) -> None:
    _fake, a = ollama
    path, extra = (
        ("/v1/chat/completions", {"messages": MESSAGES})
        if kind == "chat"
        else ("/v1/completions", {"prompt": "why is the sky blue"})
    )
    up = await a.open(call(path, model="llama3.2", **extra), "llama3.2")
    assert up.body is not None and up.headers["Content-Type"] == "application/json"
    body = json.loads(await drain(up))
    prompt = 7 if kind == "chat" else 5
    assert body["object"] == ("chat.completion" if kind == "chat" else "text_completion")
    assert (
        body["id"].startswith("chatcmpl-" if kind == "chat" else "cmpl-")
        and body["model"] == "llama3.2"
        and isinstance(body["created"], int)
    )
    choice = body["choices"][0]
    assert (choice["message"] if kind == "chat" else choice)["content" if kind == "chat" else "text"] == TEXT8
    assert choice["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": prompt, "completion_tokens": 8, "total_tokens": prompt + 8}
    assert (up.usage.prompt_tokens, up.usage.completion_tokens) == (prompt, 8)


async def test_openai_non_stream_passthrough_counts_usage(vllm: tuple[FakeOpenAI, Adapter]) -> None:
    fake, a = vllm
    c = call("/v1/completions", model="qwen", prompt="one two", max_tokens=5)
    up = await a.open(c, "qwen")
    body = json.loads(await drain(up))
    assert body["choices"][0]["text"] == "tok0 tok1 tok2 tok3 tok4" and body["usage"]["total_tokens"] == 7
    assert (up.usage.prompt_tokens, up.usage.completion_tokens) == (2, 5)
    assert fake.received[-1].raw == c.raw


@pytest.mark.parametrize("fmt", ["float", "base64"])
async def test_openai_embeddings_on_ollama(ollama: tuple[FakeOllama, Adapter], fmt: str) -> None:
    fake, a = ollama
    up = await a.open(call("/v1/embeddings", model="embed", input=["red fox", "blue"], encoding_format=fmt), "embed")
    body = json.loads(await drain(up))
    assert fake.received[-1].path == "/api/embed" and fake.received[-1].body["input"] == ["red fox", "blue"]
    assert body["object"] == "list" and body["model"] == "embed"
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    assert (up.usage.prompt_tokens, up.usage.completion_tokens) == (3, 0)
    vecs = [d["embedding"] for d in body["data"]]
    if fmt == "base64":
        vecs = [list(struct.unpack("<4f", base64.b64decode(v))) for v in vecs]
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert vecs[0] == pytest.approx(embedding("red fox", 4), rel=1e-6)
    assert vecs[1] == pytest.approx(embedding("blue", 4), rel=1e-6)


# ---- Ollama client -------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_ollama_chat_passthrough(ollama: tuple[FakeOllama, Adapter], stream: bool) -> None:
    fake, a = ollama
    c = call("/api/chat", model="llama3.2", messages=MESSAGES, stream=stream, options={"num_predict": 3})
    up = await a.open(c, "llama3.2")
    data = await drain(up)
    assert fake.received[-1].raw == c.raw
    assert up.headers["Content-Type"] == ("application/x-ndjson" if stream else "application/json")
    check_ollama_stream(ndjson(data), "message", TEXT3, "length", (7, 3))
    assert (up.usage.prompt_tokens, up.usage.completion_tokens) == (7, 3)


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("kind", ["chat", "generate", "generate-raw"])
async def test_ollama_client_on_vllm(vllm: tuple[FakeOpenAI, Adapter], kind: str, stream: bool) -> None:
    fake, a = vllm
    if kind == "chat":
        c = call("/api/chat", model="qwen", messages=MESSAGES, stream=stream, options={"num_predict": 3})
    else:
        c = call(
            "/api/generate",
            model="qwen",
            prompt="why is the sky blue",
            system="be brief",
            raw=kind == "generate-raw",
            stream=stream,
            options={"num_predict": 3},
        )
    up = await a.open(c, "qwen")
    data = await drain(up)
    prompt = 5 if kind == "generate-raw" else 7  # raw mode has no system prompt
    check_ollama_stream(ndjson(data), "message" if kind == "chat" else "response", TEXT3, "length", (prompt, 3))
    assert (up.usage.prompt_tokens, up.usage.completion_tokens) == (prompt, 3)
    assert fake.received[-1].path == ("/v1/completions" if kind == "generate-raw" else "/v1/chat/completions")
    assert fake.received[-1].body["max_tokens"] == 3


async def test_ollama_embeddings_on_vllm(vllm: tuple[FakeOpenAI, Adapter]) -> None:
    _fake, a = vllm
    up = await a.open(call("/api/embed", model="qwen", input=["red fox", "blue"]), "qwen")
    body = json.loads(await drain(up))
    assert body["model"] == "qwen" and body["prompt_eval_count"] == 3
    assert body["embeddings"] == [embedding("red fox", 4), embedding("blue", 4)]
    up = await a.open(call("/api/embeddings", model="qwen", prompt="red fox"), "qwen")
    assert json.loads(await drain(up)) == {"embedding": embedding("red fox", 4)}
    assert up.usage.prompt_tokens == 2


async def test_ollama_load_call_needs_no_openai_backend(vllm: tuple[FakeOpenAI, Adapter]) -> None:
    fake, a = vllm
    up = await a.open(call("/api/generate", model="qwen"), "qwen")
    assert json.loads(await drain(up))["done_reason"] == "load"
    assert fake.requests == 0


# ---- the backend's bytes, unchanged -----------------------------------------------------------


async def test_passthrough_bytes_are_unchanged_both_ways(aiohttp_server, session: aiohttp.ClientSession) -> None:  # type: ignore[no-untyped-def]
    """Against a handler that answers fixed bytes, as httpx's MockTransport does."""
    seen: list[bytes] = []
    answer = b'{"id": "x",  "object": "chat.completion", "usage": {"prompt_tokens": 11, "completion_tokens": 22}}'
    stream = (
        b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
        b'data: {"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}\n\n'
        b"data: [DONE]\n\n"
    )

    async def handler(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        seen.append(raw)
        if not json.loads(raw).get("stream"):
            return web.Response(body=answer, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in stream.split(b"\n\n")[:-1]:
            await resp.write(event + b"\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    server = await aiohttp_server(app)
    a = make_adapter("openai", str(server.make_url("/v1")), session, SETTINGS)
    raw = b'{"model":"m", "messages":[{"role":"user","content":"hi"}]}'
    up = await a.open(Call.from_request("/v1/chat/completions", raw), "m")
    assert up.body is answer or up.body == answer
    assert await drain(up) == answer and seen[-1] == raw
    assert (up.usage.prompt_tokens, up.usage.completion_tokens) == (11, 22)
    raw = (
        b'{"model":"m", "messages":[{"role":"user","content":"hi"}], '
        b'"stream":true, "stream_options":{"include_usage":true}}'
    )
    up = await a.open(Call.from_request("/v1/chat/completions", raw), "m")
    assert await drain(up) == stream and seen[-1] == raw
    assert (up.usage.prompt_tokens, up.usage.completion_tokens) == (4, 1)


# ---- errors ---------------------------------------------------------------------------------


async def test_4xx_comes_back_in_the_clients_shape(
    ollama: tuple[FakeOllama, Adapter], vllm: tuple[FakeOpenAI, Adapter]
) -> None:
    _, oa = ollama
    _, va = vllm
    up = await va.open(call("/v1/chat/completions", model="nope", messages=MESSAGES, stream=True), "nope")
    assert up.status == 404 and up.headers["Content-Type"] == "application/json"
    assert json.loads(await drain(up)) == {
        "error": {"message": "The model `nope` does not exist.", "type": "not_found_error", "param": None, "code": None}
    }
    assert up.error == "The model `nope` does not exist."
    up = await va.open(call("/api/chat", model="nope", messages=MESSAGES), "nope")
    assert up.status == 404 and json.loads(await drain(up)) == {"error": "The model `nope` does not exist."}
    up = await oa.open(call("/v1/chat/completions", model="nope", messages=MESSAGES), "nope")
    assert up.status == 404
    assert json.loads(await drain(up))["error"]["message"] == 'model "nope" not found, try pulling it first'


@pytest.mark.parametrize("status", [500, 503, 429])
async def test_5xx_and_429_are_backend_errors_before_the_first_byte(
    vllm: tuple[FakeOpenAI, Adapter], status: int
) -> None:
    fake, a = vllm
    fake.fail_next(1, status)
    with pytest.raises(BackendError) as info:
        await a.open(call("/v1/chat/completions", model="qwen", messages=MESSAGES, stream=True), "qwen")
    assert info.value.before_first_byte and info.value.status == status
    assert f"HTTP {status}" in info.value.message and "injected failure" in info.value.message
    assert fake.failed == 1
    assert (await a.open(call("/v1/chat/completions", model="qwen", messages=MESSAGES), "qwen")).status == 200


async def test_connection_refused_is_a_backend_error(ollama: tuple[FakeOllama, Adapter]) -> None:
    fake, a = ollama
    await fake.go_down()
    with pytest.raises(BackendError) as info:
        await a.open(call("/api/chat", model="llama3.2", messages=MESSAGES), "llama3.2")
    assert info.value.before_first_byte and info.value.status is None and "cannot connect" in info.value.message
    assert isinstance(info.value.__cause__, aiohttp.ClientConnectorError)


@pytest.mark.parametrize("stream", [True, False])
async def test_drop_before_the_first_chunk_is_a_backend_error(vllm: tuple[FakeOpenAI, Adapter], stream: bool) -> None:
    fake, a = vllm
    fake.drop_next(after_chunks=0)
    with pytest.raises(BackendError) as info:
        await a.open(call("/api/chat", model="qwen", messages=MESSAGES, stream=stream), "qwen")
    assert info.value.before_first_byte and fake.dropped == 1


async def test_timeouts_are_backend_errors_per_phase(session: aiohttp.ClientSession) -> None:
    async with FakeOpenAI(models=["m"], first_byte_delay=2) as fake:
        a = make_adapter(
            "openai",
            fake.url,
            session,
            BackendSettings(request_timeout=0.2, connect_timeout=1, first_byte_timeout=0.3, load_timeout=0),
        )
        with pytest.raises(BackendError, match=r"sent nothing for 0\.3 s") as info:
            await a.open(call("/v1/chat/completions", model="m", messages=MESSAGES, stream=True), "m")
        assert info.value.before_first_byte
        with pytest.raises(BackendError, match="did not answer in time"):  # a whole answer: request_timeout
            await a.open(call("/v1/chat/completions", model="m", messages=MESSAGES), "m")


@pytest.mark.parametrize(
    ("engine", "path"),
    [
        ("vllm", "/v1/chat/completions"),
        ("vllm", "/api/chat"),
        ("ollama", "/api/chat"),
        ("ollama", "/v1/chat/completions"),
    ],
)
async def test_drop_mid_stream_ends_cleanly_with_an_error(
    ollama: tuple[FakeOllama, Adapter], vllm: tuple[FakeOpenAI, Adapter], engine: str, path: str
) -> None:
    fake, a = ollama if engine == "ollama" else vllm
    model = "llama3.2" if engine == "ollama" else "qwen"
    fake.drop_next(after_chunks=3)
    up = await a.open(call(path, model=model, messages=MESSAGES, stream=True), model)
    data = await drain(up)  # does not raise
    assert up.error == "the backend's answer was cut off" and up.done
    if path.startswith("/v1"):
        events = sse(data)
        assert events[-1] == "[DONE]" and events[-2] == {
            "error": {"message": up.error, "type": "server_error", "param": None, "code": "backend_error"}
        }
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2]) == "tok0 tok1 tok2"
    else:
        lines = ndjson(data)
        assert lines[-1] == {"error": up.error}
        assert "".join(line["message"]["content"] for line in lines[:-1]) == "tok0 tok1 tok2"
    assert fake.dropped == 1 and fake.cancelled == 0


async def test_error_event_before_any_output_fails_over_and_after_ends_cleanly(
    aiohttp_server, session: aiohttp.ClientSession
) -> None:  # type: ignore[no-untyped-def]
    events: list[bytes] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        for line in events:
            await resp.write(line)
        return resp

    app = web.Application()
    app.router.add_post("/api/chat", handler)
    server = await aiohttp_server(app)
    a = make_adapter("ollama", str(server.make_url("")), session, SETTINGS)
    events[:] = [b'{"error":"an error was encountered while running the model"}\n']
    with pytest.raises(BackendError, match="running the model") as info:
        await a.open(call("/api/chat", model="m", messages=MESSAGES), "m")
    assert info.value.before_first_byte
    events[:] = [
        b'{"model":"m","created_at":"x","message":{"role":"assistant","content":"hi"},"done":false}\n',
        events[0],
    ]
    up = await a.open(call("/v1/chat/completions", model="m", messages=MESSAGES, stream=True), "m")
    data = sse(await drain(up))
    assert data[0]["choices"][0]["delta"]["content"] == "hi"
    assert data[-2]["error"]["message"] == "the backend reported: an error was encountered while running the model"
    assert up.error == data[-2]["error"]["message"]


@pytest.mark.parametrize("engine", ["ollama", "vllm"])
async def test_close_mid_stream_cancels_at_the_backend(session: aiohttp.ClientSession, engine: str) -> None:
    fake = FakeOllama(models=["m"]) if engine == "ollama" else FakeOpenAI(flavor="vllm", models=["m"])
    fake.tokens_per_second = 200
    fake.completion_tokens = 1000
    async with fake:
        a = make_adapter(engine, fake.url, session, SETTINGS)
        path = "/api/chat" if engine == "ollama" else "/v1/chat/completions"
        async with await a.open(call(path, model="m", messages=MESSAGES, stream=True), "m") as up:
            assert fake.in_flight == 1
            await up.__anext__()
            await up.__anext__()
        await until(lambda: fake.cancelled == 1, "the backend should see the stream closed")
        assert (fake.cancelled, fake.in_flight, fake.completed) == (1, 0, 0)
        assert up.chunks >= 2 and not up.done  # events passed: one read may bring several
        with pytest.raises(StopAsyncIteration):
            await up.__anext__()
