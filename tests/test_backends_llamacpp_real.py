"""The llama.cpp adapter against what a real llama-server sent (recorded in tests/data by the llama-server work).

A handler replays the recorded bodies, so these run everywhere; the live server
is exercised by the ``real`` tests.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from mindrouter.backends import Adapter, Call, Probe, make_adapter
from mindrouter.backends.llamacpp import LlamaCppAdapter
from mindrouter.backends.probe import Reply
from mindrouter.config import BackendSettings

DATA = Path(__file__).parent / "data"
pytestmark = pytest.mark.skipif(
    not (DATA / "llamacpp_metrics.txt").exists(), reason="no recorded llama-server samples in tests/data"
)

STREAM_TEXT = "xn temwee"  # the content deltas of llamacpp_chat_stream.txt


def sample(name: str) -> bytes:
    return (DATA / name).read_bytes()


@pytest.mark.parametrize(
    ("metrics", "slots", "expected"),
    [
        ("llamacpp_metrics.txt", "llamacpp_slots.json", (2, 0, 4, 2, 163, 1856)),
        ("llamacpp_metrics_deferred.txt", "llamacpp_slots_full.json", (4, 2, 4, 4, 246, 2812)),
        ("llamacpp_metrics_idle.txt", "llamacpp_slots_idle.json", (0, 0, 2, 0, 0, 0)),
    ],
)
def test_telemetry_from_recorded_metrics_and_slots(metrics: str, slots: str, expected: tuple[Any, ...]) -> None:
    a = LlamaCppAdapter("http://x", None)  # type: ignore[arg-type]
    replies = {
        "/health": Reply(200, b'{"status":"ok"}'),
        "/slots": Reply(200, sample(slots)),
        "/metrics": Reply(200, sample(metrics)),
        "/props": Reply(200, sample("llamacpp_props.json")),
    }
    p = a.telemetry(Probe(healthy=True), replies)
    got = (p.running, p.waiting, p.slots_total, p.slots_busy, p.prompt_tokens_total, p.completion_tokens_total)
    assert p.healthy and got == expected
    assert p.version == "b1-0c1e570"


@pytest.fixture
async def replay(aiohttp_server: Any) -> AsyncIterator[Adapter]:
    """A server that answers every llama-server endpoint with the recorded bodies."""

    def serve(name: str, content_type: str = "application/json", status: int = 200) -> Any:
        async def handler(request: web.Request) -> web.Response:
            return web.Response(body=sample(name), status=status, content_type=content_type)

        return handler

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body["messages"][0]["content"] == "too long":
            return await serve("llamacpp_error_context.json", status=400)(request)
        if not body.get("stream"):
            return await serve("llamacpp_chat.json")(request)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in sample("llamacpp_chat_stream.txt").split(b"\n\n"):
            if event.strip():
                await resp.write(event + b"\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/health", serve("llamacpp_health.json") if (DATA / "llamacpp_health.json").exists() else _ok)
    app.router.add_get("/v1/models", serve("llamacpp_models.json"))
    app.router.add_get("/slots", serve("llamacpp_slots.json"))
    app.router.add_get("/metrics", serve("llamacpp_metrics.txt", "text/plain"))
    app.router.add_get("/props", serve("llamacpp_props.json"))
    app.router.add_post("/v1/chat/completions", chat)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as session:
        yield make_adapter(
            "llamacpp", str(server.make_url("")), session, BackendSettings(request_timeout=5, connect_timeout=1)
        )


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def chat_call(dialect: str, stream: bool, content: str = "hello", wants_usage: bool = False) -> Call:
    body: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": content}], "stream": stream}
    if wants_usage:
        body["stream_options"] = {"include_usage": True}
    return Call.from_request("/v1/chat/completions" if dialect == "openai" else "/api/chat", json.dumps(body).encode())


async def read(adapter: Adapter, call: Call) -> tuple[bytes, Any]:
    up = await adapter.open(call, "tiny")
    async with up:
        return b"".join([c async for c in up]), up


async def test_probe_of_a_recorded_server(replay: Adapter) -> None:
    p = await replay.probe()
    assert p.healthy and p.models == {"tiny"} and p.loaded_models == {"tiny"}
    assert (p.running, p.waiting, p.slots_total, p.slots_busy) == (2, 0, 4, 2)


@pytest.mark.parametrize("wants_usage", [False, True])
async def test_recorded_stream_to_an_openai_client(replay: Adapter, wants_usage: bool) -> None:
    data, up = await read(replay, chat_call("openai", True, wants_usage=wants_usage))
    events = [e[6:] for e in data.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == STREAM_TEXT
    assert [c for c in chunks if "usage" in c] == ([] if not wants_usage else [chunks[-1]])
    assert (up.usage.prompt_tokens, up.usage.completion_tokens) == (27, 8)
    if wants_usage:
        assert data == sample("llamacpp_chat_stream.txt").rstrip(b"\n") + b"\n\n", (
            "passthrough leaves the server's bytes alone"
        )


async def test_recorded_stream_to_an_ollama_client(replay: Adapter) -> None:
    data, up = await read(replay, chat_call("ollama", True))
    lines = [json.loads(line) for line in data.splitlines()]
    assert "".join(line["message"]["content"] for line in lines) == STREAM_TEXT
    final = lines[-1]
    assert final["done"] is True and final["done_reason"] == "length"
    assert (
        (final["prompt_eval_count"], final["eval_count"])
        == (27, 8)
        == (up.usage.prompt_tokens, up.usage.completion_tokens)
    )


async def test_recorded_answer_in_both_dialects(replay: Adapter) -> None:
    data, up = await read(replay, chat_call("openai", False))
    assert data == sample("llamacpp_chat.json") and (up.usage.prompt_tokens, up.usage.completion_tokens) == (27, 16)
    data, up = await read(replay, chat_call("ollama", False))
    answer = json.loads(data)
    assert answer["message"] == {"role": "assistant", "content": "wukheheinnlinvyyzrxw"}
    assert (answer["done_reason"], answer["prompt_eval_count"], answer["eval_count"]) == ("length", 27, 16)


async def test_recorded_context_error_in_both_dialects(replay: Adapter) -> None:
    message = "request (3519 tokens) exceeds the available context size (512 tokens), try increasing it"
    data, up = await read(replay, chat_call("openai", True, content="too long"))
    assert up.status == 400 and json.loads(data)["error"]["message"] == message
    data, up = await read(replay, chat_call("ollama", True, content="too long"))
    assert up.status == 400 and json.loads(data) == {"error": message}
