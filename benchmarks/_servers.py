"""Processes for the benchmarks: a fast fake OpenAI backend, a bare aiohttp pass-through proxy, a holder.

python benchmarks/_servers.py backend PORT
python benchmarks/_servers.py proxy PORT UPSTREAM_URL
python benchmarks/_servers.py hold PORT

The backend answers at once: what is measured is everything in front of it.
The holder (bench_memory.py) reads each chat request's body and answers only after
``POST /release``, then as the backend does; ``GET /held`` says how many it holds.
"""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
from aiohttp import web

ANSWER = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "tok0 tok1 tok2 tok3"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
    }
).encode()
CHUNK = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"bench",'
    b'"choices":[{"index":0,"delta":{"content":"tok%d "},"finish_reason":null}]}\n\n'
)
USAGE = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"bench","choices":[],'
    b'"usage":{"prompt_tokens":5,"completion_tokens":20,"total_tokens":25}}\n\n'
)
CHUNKS = [CHUNK % i for i in range(20)] + [USAGE, b"data: [DONE]\n\n"]
"""A 20-chunk stream, then the usage chunk an engine sends for ``stream_options.include_usage``."""


async def answer(request: web.Request, body: dict[str, object]) -> web.StreamResponse:
    """The answer to a chat request, whole or streamed as the body asks."""
    if not body.get("stream"):
        return web.Response(body=ANSWER, content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for chunk in CHUNKS:
        await resp.write(chunk)
    await resp.write_eof()
    return resp


def backend(port: int) -> None:
    async def chat(request: web.Request) -> web.StreamResponse:
        return await answer(request, await request.json())

    async def models(_request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "bench", "object": "model", "created": 0, "owned_by": "bench"}]}
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def proxy(port: int, upstream: str) -> None:
    """The bare pass-through DESIGN §9 compares against: one pooled session, bytes in, bytes out."""

    async def session_ctx(app: web.Application):
        app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        yield
        await app["session"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with request.app["session"].post(
            upstream + request.path, data=body, headers={"Content-Type": "application/json"}
        ) as up:
            resp = web.StreamResponse(
                status=up.status, headers={"Content-Type": up.headers.get("Content-Type", "application/json")}
            )
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    app = web.Application()
    app.cleanup_ctx.append(session_ctx)
    app.router.add_post("/v1/chat/completions", forward)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def hold(port: int) -> None:
    """The least a plain aiohttp app keeps for a request it is serving: the body read, then a wait."""
    held = 0
    released = asyncio.Event()

    async def chat(request: web.Request) -> web.StreamResponse:
        nonlocal held
        body = await request.json()
        held += 1
        try:
            await released.wait()
        finally:
            held -= 1
        return await answer(request, body)

    async def release(_request: web.Request) -> web.Response:
        released.set()
        return web.json_response({"held": held})

    async def count(_request: web.Request) -> web.Response:
        return web.json_response({"held": held})

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "bench", "object": "model", "owned_by": "b"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/held", count)
    app.router.add_post("/release", release)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, backlog=4096)


if __name__ == "__main__":
    if sys.argv[1] == "backend":
        backend(int(sys.argv[2]))
    elif sys.argv[1] == "hold":
        hold(int(sys.argv[2]))
    else:
        proxy(int(sys.argv[2]), sys.argv[3])
