"""Requests that wait for a slot: answered when it frees, when the queue times out, the client leaves or the
daemon shuts down; and refused at once when the queue is full.

The daemon serves its TCP port as ``mr serve`` does. The in-process backend holds its answers
until the test lets them go, so the requests after the first wait in the daemon's queue for its one slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from mindrouter.daemon.edge.services import SERVICES

from .harness import Daemon, daemon, until
from .inprocess import InProcess

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class Client:
    """A session against a served daemon, as user ann."""

    def __init__(self, served: Daemon, session: aiohttp.ClientSession) -> None:
        self.served, self.session = served, session
        self.url, self.auth = served.url, {"Authorization": f"Bearer {served.key}"}

    @property
    def queued(self) -> int:
        return int(self.served.app[SERVICES].scheduler.queued_count)

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, str, aiohttp.ClientResponse]:
        async with self.session.post(self.url + path, json=body, headers=self.auth) as r:
            return r.status, await r.text(), r


@pytest.fixture
def vllm() -> InProcess:
    return InProcess(models=("m",), completion_tokens=3, held=True)


@contextlib.asynccontextmanager
async def served(tmp_path: Path, backend: InProcess, **scheduler: Any) -> AsyncIterator[Client]:
    """A daemon whose one backend has one slot, and a session as user ann."""
    async with daemon(tmp_path, scheduler=scheduler) as d, aiohttp.ClientSession() as session:
        await d.backend("gpu", backend, max_concurrent=1)
        d.key = await d.user("ann")
        yield Client(d, session)


@pytest.fixture
async def front(tmp_path: Path, vllm: InProcess) -> AsyncIterator[Client]:
    async with served(tmp_path, vllm) as client:
        yield client


async def occupy_the_slot(front: Client, fake: InProcess, path: str = "/v1/chat/completions") -> asyncio.Task[Any]:
    """A first request that holds the backend's only slot (held by the backend)."""
    body = CHAT if path.startswith("/v1") else {"model": "m", "messages": CHAT["messages"], "stream": False}
    task = asyncio.create_task(front.post(path, body))
    await until(lambda: fake.in_flight == 1, "the first request did not reach the backend")
    return task


async def test_queued_requests_are_answered_when_their_slot_frees(front, vllm):
    first = await occupy_the_slot(front, vllm)
    waiting = [asyncio.create_task(front.post("/v1/chat/completions", CHAT)) for _ in range(3)]
    await until(lambda: front.queued == 3, "three requests should wait")
    vllm.open_gate()
    answers = [await first, *await asyncio.gather(*waiting)]
    assert [status for status, _, _ in answers] == [200] * 4
    for _, text, response in answers:
        assert json.loads(text)["usage"]["completion_tokens"] == 3
        assert response.headers["X-Request-Id"].startswith("mr-")
    assert len({response.headers["X-Request-Id"] for _, _, response in answers}) == 4
    assert front.queued == 0 and vllm.requests == 4  # each admitted once, sent once


async def test_a_waiting_stream_gets_its_headers_and_position_at_once_then_its_answer(front, vllm):
    first = await occupy_the_slot(front, vllm)
    async with front.session.post(
        front.url + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=front.auth
    ) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        assert r.headers["X-Queue-Position"] == "1" and r.headers["X-Queue-Length"] == "1"
        assert r.headers["X-Request-Id"].startswith("mr-")
        assert await r.content.readline() == b": queued position=1 queue_length=1\n"
        vllm.open_gate()
        rest = (await r.content.read()).decode()
    assert rest.rstrip().endswith("data: [DONE]") and rest.count('"content"') >= 3
    assert (await first)[0] == 200
    await until(lambda: front.served.app[SERVICES].scheduler.running_count == 0, "the stream's slot should be released")
    assert front.queued == 0


async def test_the_openai_client_reads_a_stream_that_waited(front, vllm):
    first = await occupy_the_slot(front, vllm)
    client = openai.AsyncOpenAI(base_url=front.url + "/v1", api_key=front.served.key, max_retries=0)
    try:
        stream = await client.chat.completions.create(model="m", messages=CHAT["messages"], stream=True)
        await until(lambda: front.queued == 1, "the stream should wait")
        vllm.open_gate()
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    finally:
        await client.close()
    assert text and (await first)[0] == 200


async def test_an_ollama_stream_waits_in_its_own_dialect(front, vllm):
    first = await occupy_the_slot(front, vllm, "/api/chat")
    body = {"model": "m", "messages": CHAT["messages"]}  # Ollama streams unless told not to
    waiting = asyncio.create_task(front.session.post(front.url + "/api/chat", json=body, headers=front.auth))
    await until(lambda: front.queued == 1, "the stream should wait")
    assert not waiting.done()  # no headers until the slot: Ollama's clients read errors from the status
    vllm.open_gate()
    async with await waiting as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in (await r.content.read()).splitlines() if line]
    assert lines[-1]["done"] is True and len(lines) == 4
    assert (await first)[0] == 200


async def test_a_client_that_leaves_while_waiting_leaves_the_queue(front, vllm):
    first = await occupy_the_slot(front, vllm)
    sockets = []
    for stream in (False, True, False, True):
        body = json.dumps({**CHAT, "stream": stream}).encode()
        sock = socket.create_connection(("127.0.0.1", front.served.port))
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {front.served.key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        sockets.append(sock)
    await until(lambda: front.queued == 4, "four requests should wait")
    for sock in sockets:
        sock.close()
    await until(lambda: front.queued == 0, "the queue should be empty")
    vllm.open_gate()
    assert (await first)[0] == 200
    assert vllm.requests == 1 and front.served.app[SERVICES].scheduler.running_count == 0


async def test_a_request_that_waits_too_long_gets_504_or_its_streams_error_tail(tmp_path, vllm):
    async with served(tmp_path, vllm, queue_timeout=0.3) as front:
        first = await occupy_the_slot(front, vllm)
        plain, stream = await asyncio.gather(
            front.post("/v1/chat/completions", CHAT), front.post("/v1/chat/completions", {**CHAT, "stream": True})
        )
        assert plain[0] == 504 and json.loads(plain[1])["error"]["code"]
        assert stream[0] == 200 and '"error"' in stream[1] and stream[1].rstrip().endswith("data: [DONE]")
        vllm.open_gate()
        assert (await first)[0] == 200
        assert front.queued == 0


async def test_refusals_come_once_in_the_dialect(front, vllm):
    errors = front.served.app[SERVICES].stats.errors
    async with front.session.post(front.url + "/v1/chat/completions", json=CHAT) as r:
        assert r.status == 401 and (await r.json())["error"]["message"]
    async with front.session.post(front.url + "/api/chat", json={"model": 5}, headers=front.auth) as r:
        assert r.status == 400 and isinstance((await r.json())["error"], str)
    async with front.session.post(front.url + "/v1/chat/completions", data=b'{"model": [}', headers=front.auth) as r:
        assert r.status == 400 and (await r.json())["error"]["message"]
    assert errors["401"] == 1 and errors["400"] == 2


async def test_shutting_down_answers_what_still_waits(front, vllm):
    first = await occupy_the_slot(front, vllm)
    plain = asyncio.create_task(front.post("/v1/chat/completions", CHAT))
    stream = asyncio.create_task(front.post("/v1/chat/completions", {**CHAT, "stream": True}))
    await until(lambda: front.queued == 2, "two requests should wait")
    followed = front.served.app[SERVICES].decisions.follow()
    closing = asyncio.create_task(front.served.server.close())
    status, text, response = await plain  # answered while the running request still holds the slot
    assert status == 503 and "shutting down" in json.loads(text)["error"]["message"]
    assert response.headers["Retry-After"] == "5"
    status, text, stream_response = await stream
    assert status == 200 and "shutting down" in text and text.rstrip().endswith("data: [DONE]")
    vllm.open_gate()  # the running request finishes within the grace
    assert (await first)[0] == 200
    await closing
    assert front.queued == 0
    records = [json.loads(followed.get_nowait()) for _ in range(followed.qsize())]
    by_id = {record["request_id"]: record for record in records}
    for answer in (response, stream_response):  # the decision records say why, not "the client went away"
        record = by_id[answer.headers["X-Request-Id"]]
        assert (record["outcome"], record["status"]) == ("shutdown", 503) and "shutting down" in record["reason"]


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT), ("/api/chat", {**CHAT, "stream": False})])
async def test_a_full_queue_refuses_at_once_with_429_and_retry_after_in_the_dialect(tmp_path, vllm, path, body):
    async with served(tmp_path, vllm, max_queued=2) as front:
        first = await occupy_the_slot(front, vllm)
        waiting = [asyncio.create_task(front.post("/v1/chat/completions", CHAT)) for _ in range(2)]
        await until(lambda: front.queued == 2, "two requests should wait")
        status, text, response = await front.post(path, body)
        assert status == 429 and response.headers["Retry-After"] == "5"
        error = json.loads(text)["error"]
        message = error["message"] if path.startswith("/v1") else error
        assert "requests queued" in message
        vllm.open_gate()
        assert [answer[0] for answer in [await first, *await asyncio.gather(*waiting)]] == [200] * 3


async def test_an_in_process_backend_drives_the_queue_without_a_backend_socket(tmp_path):
    backends = InProcess(completion_tokens=4, held=True)
    async with served(tmp_path, backends) as front:
        answers = [asyncio.create_task(front.post("/v1/chat/completions", CHAT)) for _ in range(3)]
        await until(lambda: backends.in_flight == 1 and front.queued == 2, "one should run and two wait")
        backends.open_gate()
        done = await asyncio.gather(*answers)
    assert [status for status, _, _ in done] == [200] * 3
    assert [json.loads(text)["usage"]["completion_tokens"] for _, text, _ in done] == [4] * 3
    assert backends.requests == 3
