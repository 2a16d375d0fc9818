"""Upstream hygiene (issue 28 items 6 and 8, issue 29 item 6): what the daemon asks of a backend and believes.

A backend behind a compressing reverse proxy sent gzip that reached clients as gzip bytes labelled
JSON (or a 503); a backend's redirect was followed to another host; an SSE event written on two
``data:`` lines broke the stream; a whole answer's latency was its whole duration.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from mindrouter.backends import BackendError, Call, make_adapter
from mindrouter.config import BackendSettings

from .conftest import Daemon, until
from .fakes import FakeOllama

MESSAGES = [{"role": "user", "content": "hi"}]
SETTINGS = BackendSettings(request_timeout=5, connect_timeout=1)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def call(path: str, **body: Any) -> Call:
    return Call.from_request(path, json.dumps(body).encode())


class CompressingProxy:
    """A reverse proxy in front of a fake Ollama that gzips what it relays: when the client accepts
    gzip (as nginx's ``gzip on`` does), or ``always``. It remembers the Accept-Encoding each call sent."""

    def __init__(self, upstream: str, *, always: bool) -> None:
        self.upstream = upstream
        self.always = always
        self.accepted: list[str] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        accept = request.headers.get("Accept-Encoding", "")
        self.accepted.append(accept)
        async with (
            aiohttp.ClientSession() as session,
            session.request(request.method, self.upstream + request.path_qs, data=await request.read()) as resp,
        ):
            body = await resp.read()
            content_type = resp.headers.get("Content-Type", "application/json")
        headers = {"Content-Type": content_type}
        if self.always or "gzip" in accept:
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, status=resp.status, headers=headers)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


@pytest.mark.parametrize("always", [False, True], ids=["gzip-when-accepted", "gzip-always"])
async def test_answers_through_a_compressing_proxy_arrive_whole(daemon: Daemon, aiohttp_server: Any, always: bool):
    """Item 6: whole and streamed answers, in both dialects, arrive as JSON the client can read."""
    async with FakeOllama(models=["llama3"], completion_tokens=5) as fake:
        proxy = CompressingProxy(fake.url, always=always)
        server = await aiohttp_server(proxy.app())
        await daemon.backend("zipped", str(server.make_url("")).rstrip("/"), "ollama")
        key = await daemon.user("ana")
        await until(
            lambda: daemon.scheduler.load(1) is not None and daemon.registry.healthy(daemon.registry.entries[1])
        )
        for path in ("/api/chat", "/v1/chat/completions"):
            resp = await daemon.client.post(
                path, json={"model": "llama3", "messages": MESSAGES, "stream": False}, headers=bearer(key)
            )
            raw = await resp.read()
            assert resp.status == 200, (path, raw[:200])
            assert "Content-Encoding" not in resp.headers, (path, dict(resp.headers))
            answer = json.loads(raw)
            words = answer["message"]["content"] if path == "/api/chat" else answer["choices"][0]["message"]["content"]
            assert len(words.split()) == 5, answer
        resp = await daemon.client.post(
            "/api/chat", json={"model": "llama3", "messages": MESSAGES, "stream": True}, headers=bearer(key)
        )
        lines = [json.loads(line) for line in (await resp.read()).splitlines() if line]
        assert resp.status == 200 and lines[-1]["done"] and lines[-1]["eval_count"] == 5, lines[-1:]
        assert proxy.accepted and set(proxy.accepted) == {"identity"}, set(proxy.accepted)


class Redirecting:
    """A backend that answers every call with a redirect to ``target``, and a target that counts what reaches it."""

    def __init__(self) -> None:
        self.reached: list[str] = []
        self.target = ""

    async def redirect(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(self.target + request.path)

    async def count(self, request: web.Request) -> web.StreamResponse:
        self.reached.append(f"{request.method} {request.path}")
        return web.json_response({"models": [{"name": "llama3"}], "message": {"content": "from elsewhere"}})


async def test_a_backends_redirect_is_a_bad_answer_never_followed(daemon: Daemon, aiohttp_server: Any) -> None:
    """Item 8: a 302 to another host made the daemon re-send the request there as a GET and relay its answer."""
    r = Redirecting()
    redirecting, elsewhere = web.Application(), web.Application()
    redirecting.router.add_route("*", "/{tail:.*}", r.redirect)
    elsewhere.router.add_route("*", "/{tail:.*}", r.count)
    target = await aiohttp_server(elsewhere)
    r.target = str(target.make_url("")).rstrip("/")
    server = await aiohttp_server(redirecting)
    # The adapter alone: a probe that is redirected finds the backend down, a request fails before its first byte.
    async with aiohttp.ClientSession() as session:
        adapter = make_adapter("ollama", str(server.make_url("")), session, SETTINGS)
        probe = await adapter.probe()
        assert not probe.healthy and "302" in (probe.error or ""), probe
        for stream in (False, True):
            with pytest.raises(BackendError, match="302") as info:
                await adapter.open(call("/api/chat", model="llama3", messages=MESSAGES, stream=stream), "llama3")
            assert info.value.before_first_byte
    # Through the daemon: the client gets a 503, never the other host's answer.
    await daemon.backend("hops", str(server.make_url("")).rstrip("/"), "ollama")
    key = await daemon.user("ana")
    resp = await daemon.client.post(
        "/api/chat", json={"model": "llama3", "messages": MESSAGES, "stream": False}, headers=bearer(key)
    )
    assert resp.status in (404, 503), await resp.text()
    assert "from elsewhere" not in await resp.text()
    assert r.reached == [], r.reached


async def chat_backend(aiohttp_server: Any, chat: Any) -> str:
    """The URL of an OpenAI-compatible server whose chat completions ``chat`` answers."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return str((await aiohttp_server(app)).make_url(""))


SPLIT_EVENTS = (
    b": a comment\n"
    b'data: {"id": "c1", "object": "chat.completion.chunk", "model": "m",\n'
    b'data:  "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}]}\n'
    b"\n"
    b'data: {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": '
    b'[{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]}\n'
    b"\n"
    b'data: {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [],\n'
    b'data: "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}\n'
    b"\n"
    b"data: [DONE]\n"
    b"\n"
)


async def test_an_sse_event_on_several_data_lines_is_one_event(aiohttp_server: Any) -> None:
    """Issue 29 item 6: each ``data:`` line was taken as a whole event, so an event the SSE way split
    over two lines (joined with a newline, which JSON reads as space) broke the stream."""

    async def chat(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in (SPLIT_EVENTS[:70], SPLIT_EVENTS[70:200], SPLIT_EVENTS[200:]):  # events cut across reads
            await resp.write(piece)
            await asyncio.sleep(0.01)
        return resp

    url = await chat_backend(aiohttp_server, chat)
    async with aiohttp.ClientSession() as session:
        adapter = make_adapter("openai", url, session, SETTINGS)
        for path, text in (("/v1/chat/completions", "Hello"), ("/api/chat", "Hello")):
            up = await adapter.open(call(path, model="m", messages=MESSAGES, stream=True), "m")
            out = b"".join([chunk async for chunk in up])
            await up.close()
            assert up.error is None, (up.error, out)
            assert text in _text_of(path, out), out
            if path.startswith("/v1/"):  # passed on as SSE: every line of an event is a data: line
                assert all(line.startswith(b"data: ") for line in out.splitlines() if line), out
            assert (up.usage.prompt_tokens, up.usage.completion_tokens) == (3, 2)


def _text_of(path: str, out: bytes) -> str:
    """The answer's text from a stream in the client's dialect."""
    if path.startswith("/api/"):
        return "".join(json.loads(line)["message"]["content"] for line in out.splitlines() if line)
    text = ""
    for event in out.split(b"\n\n"):  # as an SSE client reads it: an event's data lines joined by newlines
        data = b"\n".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))
        if data.startswith(b"{"):
            for choice in json.loads(data)["choices"]:
                text += choice["delta"].get("content") or ""
    return text


async def test_a_whole_answers_first_byte_is_when_its_answer_began(aiohttp_server: Any) -> None:
    """Issue 29 item 6: ``first_byte_at`` was set when the Upstream was built, after the whole body was
    read, so a whole answer's latency was its whole duration. The backend here sends its headers at
    once and its body only once the test lets it."""
    release = asyncio.Event()

    async def chat(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await release.wait()
        body = {
            "id": "c1",
            "object": "chat.completion",
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
        await resp.write(json.dumps(body).encode())
        return resp

    url = await chat_backend(aiohttp_server, chat)
    async with aiohttp.ClientSession() as session:
        adapter = make_adapter("openai", url, session, SETTINGS)
        opening = asyncio.create_task(adapter.open(call("/v1/chat/completions", model="m", messages=MESSAGES), "m"))
        await asyncio.sleep(0.2)
        released_at = time.monotonic()
        release.set()
        up = await opening
        assert up.body is not None and up.first_byte_at is not None
        assert up.opened_at <= up.first_byte_at < released_at, (up.opened_at, up.first_byte_at, released_at)
