"""The front door: a request that has to wait is held outside aiohttp, then answered as any other.

The daemon serves its TCP port as ``mr serve`` does (``FrontDoors`` in front of
aiohttp's runner). The fake backend's gate holds its one slot, so the
requests after the first wait in the daemon's queue: each test checks that
they wait at the front door (``doors.waiting``), and then what their clients
get when the slot frees, the queue times out, the client leaves or the
daemon shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindrouter.daemon import inference
from mindrouter.daemon.app import create_app, make_runner
from mindrouter.daemon.frontdoor import FrontDoor, FrontDoors, _plain_request
from mindrouter.daemon.keys import ADMITTED, DECISIONS, SCHEDULER, STATS

from .conftest import ADMIN_KEY, daemon_config
from .fake_nvml import FakeNvml
from .fakes import FakeOllama, FakeOpenAI
from .test_serve import free_port

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@dataclasses.dataclass
class Front:
    app: Any
    doors: FrontDoors
    session: aiohttp.ClientSession
    port: int
    key: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def queued(self) -> int:
        return int(self.app[SCHEDULER].queued_count)

    async def admin(self, path: str, body: dict[str, Any]) -> Any:
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        async with self.session.post(self.url + path, json=body, headers=headers) as r:
            assert r.status < 300, await r.text()
            return await r.json()

    def decision(self, request_id: str) -> Any:
        return self.app[DECISIONS].get(request_id)

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any, aiohttp.ClientResponse]:
        async with self.session.post(self.url + path, json=body, headers=self.auth) as r:
            text = await r.text()
            return r.status, text, r

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    async def until(self, predicate: Any, what: str, timeout: float = 5.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not predicate():
            assert asyncio.get_running_loop().time() < deadline, what
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def serve_front(tmp_path: Path, fake_url: str, engine: str, **scheduler: Any) -> AsyncIterator[Front]:
    config = daemon_config(tmp_path, **scheduler)
    app = await create_app(config, nvml=FakeNvml(init_error=FakeNvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    runner = make_runner(app, config)
    await runner.setup()
    assert runner.server is not None
    doors = FrontDoors(app, runner.server)
    port = free_port()
    await doors.listen("127.0.0.1", port, backlog=128)
    try:
        async with aiohttp.ClientSession() as session:
            front = Front(app, doors, session, port)
            await front.admin(
                "/admin/backends", {"name": "gpu", "url": fake_url, "engine": engine, "max_concurrent": 1}
            )
            await front.admin("/admin/users", {"name": "ann", "group": "student"})
            front.key = (await front.admin("/admin/users/ann/keys", {}))["key"]
            yield front
    finally:
        await doors.close(1.0)
        await runner.cleanup()


@pytest.fixture
async def vllm() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(flavor="vllm", models=["m"], completion_tokens=3, max_concurrent=0) as fake:
        yield fake


@pytest.fixture
async def front(tmp_path: Path, vllm: FakeOpenAI) -> AsyncIterator[Front]:
    async with serve_front(tmp_path, vllm.url, "vllm") as front:
        yield front


async def occupy_the_slot(front: Front, fake: Any, path: str = "/v1/chat/completions") -> asyncio.Task[Any]:
    """A first request that holds the backend's only slot (at the fake's shut gate)."""
    body = CHAT if path.startswith("/v1") else {"model": "m", "messages": CHAT["messages"], "stream": False}
    task = asyncio.create_task(front.post(path, body))
    await front.until(lambda: fake.in_flight == 1, "the first request did not reach the backend")
    return task


async def test_queued_requests_wait_at_the_front_door_and_are_answered_when_their_slot_frees(front, vllm):
    first = await occupy_the_slot(front, vllm)
    waiting = [asyncio.create_task(front.post("/v1/chat/completions", CHAT)) for _ in range(3)]
    await front.until(lambda: len(front.doors.waiting) == 3, "three requests should wait at the front door")
    assert front.queued == 3 and not front.app[ADMITTED]
    vllm.open_gate()
    answers = [await first, *await asyncio.gather(*waiting)]
    assert [status for status, _, _ in answers] == [200] * 4
    for _, text, response in answers:
        assert json.loads(text)["usage"]["completion_tokens"] == 3
        assert response.headers["X-Request-Id"].startswith("mr-")
    assert len({response.headers["X-Request-Id"] for _, _, response in answers}) == 4
    assert not front.doors.waiting and not front.app[ADMITTED] and front.queued == 0
    assert vllm.requests == 4  # each admitted once, sent once
    # The connections stay open for the next request (handed to aiohttp after the answer).
    status, _, _ = await front.post("/v1/chat/completions", CHAT)
    assert status == 200


async def test_while_many_wait_answers_close_their_connection_so_the_next_request_comes_fresh(front, vllm, monkeypatch):
    monkeypatch.setattr(inference, "CLOSE_WHEN_QUEUED", 2)  # 1,000 in production
    first = await occupy_the_slot(front, vllm)
    waiting = [asyncio.create_task(front.post("/v1/chat/completions", CHAT)) for _ in range(2)]
    await front.until(lambda: front.queued == 2, "two requests should wait")
    vllm.open_gate()
    crowded = await first  # answered while two waited
    quiet = await asyncio.gather(*waiting)  # answered with one and none waiting: connections kept
    assert crowded[2].headers["Connection"] == "close"
    assert [r.headers.get("Connection") for _, _, r in quiet] == [None, None]


async def test_a_waiting_stream_gets_its_headers_and_position_at_once_then_its_answer(front, vllm):
    first = await occupy_the_slot(front, vllm)
    async with front.session.post(
        front.url + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=front.auth
    ) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        assert r.headers["X-Queue-Position"] == "1" and r.headers["X-Queue-Length"] == "1"
        assert r.headers["X-Request-Id"].startswith("mr-")
        assert await r.content.readline() == b": queued position=1 queue_length=1\n"
        assert len(front.doors.waiting) == 1
        vllm.open_gate()
        rest = (await r.content.read()).decode()
    assert rest.rstrip().endswith("data: [DONE]") and rest.count('"content"') >= 3
    assert (await first)[0] == 200
    await front.until(lambda: not front.doors.waiting, "the stream's connection should be let go")
    assert front.queued == 0 and front.app[SCHEDULER].running_count == 0


async def test_the_openai_client_reads_a_stream_that_waited_at_the_front_door(front, vllm):
    first = await occupy_the_slot(front, vllm)
    client = openai.AsyncOpenAI(base_url=front.url + "/v1", api_key=front.key, max_retries=0)
    try:
        stream = await client.chat.completions.create(model="m", messages=CHAT["messages"], stream=True)
        await front.until(lambda: len(front.doors.waiting) == 1, "the stream should wait at the front door")
        vllm.open_gate()
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    finally:
        await client.close()
    assert text and (await first)[0] == 200


async def test_an_ollama_stream_waits_at_the_front_door_in_its_own_dialect(tmp_path):
    async with (
        FakeOllama(models=["m:latest"], completion_tokens=3, max_concurrent=0) as fake,
        serve_front(tmp_path, fake.url, "ollama") as front,
    ):
        first = await occupy_the_slot(front, fake, "/api/chat")
        body = {"model": "m", "messages": CHAT["messages"]}  # Ollama streams unless told not to
        async with front.session.post(front.url + "/api/chat", json=body, headers=front.auth) as r:
            assert r.headers["Content-Type"].startswith("application/x-ndjson")
            assert r.headers["X-Queue-Position"] == "1"
            await front.until(lambda: len(front.doors.waiting) == 1, "the stream should wait at the front door")
            fake.open_gate()
            lines = [json.loads(line) for line in (await r.content.read()).splitlines() if line]
        assert lines[-1]["done"] is True and len(lines) == 4
        assert (await first)[0] == 200


async def test_a_client_that_leaves_while_waiting_leaves_the_queue(front, vllm):
    first = await occupy_the_slot(front, vllm)
    sockets = []
    for stream in (False, True, False, True):
        body = json.dumps({**CHAT, "stream": stream}).encode()
        sock = socket.create_connection(("127.0.0.1", front.port))
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {front.key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        sockets.append(sock)
    await front.until(lambda: len(front.doors.waiting) == 4, "four requests should wait at the front door")
    for sock in sockets:
        sock.close()
    await front.until(lambda: front.queued == 0 and not front.doors.waiting, "the queue should be empty")
    vllm.open_gate()
    assert (await first)[0] == 200
    assert vllm.requests == 1 and front.app[SCHEDULER].running_count == 0


async def test_a_request_that_waits_too_long_gets_504_or_its_streams_error_tail(tmp_path, vllm):
    async with serve_front(tmp_path, vllm.url, "vllm", queue_timeout=0.3) as front:
        first = await occupy_the_slot(front, vllm)
        plain, stream = await asyncio.gather(
            front.post("/v1/chat/completions", CHAT), front.post("/v1/chat/completions", {**CHAT, "stream": True})
        )
        assert plain[0] == 504 and json.loads(plain[1])["error"]["code"]
        assert stream[0] == 200 and '"error"' in stream[1] and stream[1].rstrip().endswith("data: [DONE]")
        vllm.open_gate()
        assert (await first)[0] == 200
        assert front.queued == 0 and not front.doors.waiting and not front.app[ADMITTED]


async def test_refusals_at_the_front_door_come_once_in_the_dialect(front, vllm):
    errors = front.app[STATS].errors
    async with front.session.post(front.url + "/v1/chat/completions", json=CHAT) as r:
        assert r.status == 401 and (await r.json())["error"]["message"]
    async with front.session.post(front.url + "/api/chat", json={"model": 5}, headers=front.auth) as r:
        assert r.status == 400 and isinstance((await r.json())["error"], str)
    async with front.session.post(front.url + "/v1/chat/completions", data=b'{"model": [}', headers=front.auth) as r:
        assert r.status == 400 and (await r.json())["error"]["message"]
    assert errors[401] == 1 and errors[400] == 2


async def test_requests_the_front_door_does_not_read_go_to_aiohttp(front, vllm):
    vllm.open_gate()

    async def chunked() -> AsyncIterator[bytes]:
        yield json.dumps(CHAT).encode()

    async with front.session.post(front.url + "/v1/chat/completions", data=chunked(), headers=front.auth) as r:
        assert r.status == 200 and r.request_info.headers.get("Transfer-Encoding") == "chunked"
    async with front.session.get(front.url + "/v1/models", headers=front.auth) as r:
        assert r.status == 200 and [m["id"] for m in (await r.json())["data"]] == ["m"]
    async with front.session.get(front.url + "/health") as r:
        assert r.status == 200


async def test_shutting_down_answers_what_still_waits(front, vllm):
    first = await occupy_the_slot(front, vllm)
    plain = asyncio.create_task(front.post("/v1/chat/completions", CHAT))
    stream = asyncio.create_task(front.post("/v1/chat/completions", {**CHAT, "stream": True}))
    await front.until(lambda: len(front.doors.waiting) == 2, "two requests should wait at the front door")
    vllm.open_gate()  # the running request finishes within the grace
    await front.doors.close(2.0)
    status, text, response = await plain
    assert status == 503 and "shutting down" in json.loads(text)["error"]["message"]
    assert response.headers["Retry-After"] == "5"
    status, text, stream_response = await stream
    assert status == 200 and "shutting down" in text and text.rstrip().endswith("data: [DONE]")
    assert (await first)[0] == 200
    await front.until(lambda: front.queued == 0, "the queue should be empty")
    for answer in (response, stream_response):  # the decision records say why, not "the client went away"
        record = front.decision(answer.headers["X-Request-Id"])
        assert (record["outcome"], record["status"]) == ("rejected", 503) and "shutting down" in record["reason"]


@pytest.mark.parametrize(
    "head",
    [
        b"GET /v1/chat/completions HTTP/1.1\r\nContent-Length: 2",
        b"POST /v1/chat/completions HTTP/1.0\r\nContent-Length: 2",
        b"POST /v1/models HTTP/1.1\r\nContent-Length: 2",
        b"POST /v1/chat/%63ompletions HTTP/1.1\r\nContent-Length: 2",
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2",
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked",
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: +2",
        b"POST /v1/chat/completions HTTP/1.1\r\nX-A: 1\r\n folded\r\nContent-Length: 2",
        b"POST /v1/chat/completions HTTP/1.1\r\nX-Name: J\xc3\xb6rg\r\nContent-Length: 2",
        b"POST /v1/chat/completions HTTP/1.1\r\nBad Name: 1\r\nContent-Length: 2",
        b"POST /v1/chat/completions HTTP/1.1\r\nOrigin: https://chat.example\r\nContent-Length: 2",
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: 2",
        b"POST /v1/chat/completions HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2",
    ],
)
def test_only_a_plain_inference_post_is_read_at_the_front_door(head):
    assert _plain_request(head) is None


def test_a_plain_inference_post_is_read_at_the_front_door():
    plain = _plain_request(b"POST /api/chat HTTP/1.1\r\nHost: x\r\nauthorization:  Bearer k \r\nContent-Length: 17")
    assert plain is not None
    path, headers, length = plain
    assert (path, headers["Authorization"], length) == ("/api/chat", "Bearer k", 17)


class _Transport(asyncio.Transport):
    """A connection that records what was written and can be dropped at any moment."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def raw_request(key: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {key}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        + data
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_gone_in_the_same_moment_it_was_parked_leaves_nothing_queued(front, vllm, stream):
    """The lease ends even when the stream's task is cancelled before it ever ran."""
    first = await occupy_the_slot(front, vllm)
    door = FrontDoor(front.doors)
    transport = _Transport()
    door.connection_made(transport)
    door.data_received(raw_request(front.key, {**CHAT, "stream": stream}))
    assert front.queued == 1 and len(front.doors.waiting) == 1
    transport.closed = True
    door.connection_lost(None)  # in the same tick: the stream's task has not started
    await front.until(lambda: front.queued == 0, "the queue should be empty")
    assert not front.doors.waiting and transport.written == b""
    vllm.open_gate()
    assert (await first)[0] == 200 and vllm.requests == 1


async def test_a_request_given_a_slot_at_once_whose_client_leaves_before_aiohttp_reads_it_frees_the_slot(front, vllm):
    """Admitted at the front door with a slot, handed to aiohttp, gone before the handler took it over."""
    door = FrontDoor(front.doors)
    transport = _Transport()
    door.connection_made(transport)
    door.data_received(raw_request(front.key, CHAT))
    assert front.app[SCHEDULER].running_count == 1 and transport in front.app[ADMITTED]
    transport.closed = True
    door.connection_lost(None)  # in the same tick: aiohttp's handler never ran
    assert not front.app[ADMITTED]
    await front.until(lambda: front.app[SCHEDULER].running_count == 0, "the slot should be free")
    vllm.open_gate()
    status, _, _ = await front.post("/v1/chat/completions", CHAT)
    assert status == 200 and vllm.requests == 1


async def test_a_request_read_a_byte_at_a_time_still_waits_at_the_front_door(front, vllm):
    first = await occupy_the_slot(front, vllm)
    door = FrontDoor(front.doors)
    transport = _Transport()
    door.connection_made(transport)
    for byte in raw_request(front.key, CHAT):
        door.data_received(bytes([byte]))
    assert len(front.doors.waiting) == 1 and front.queued == 1
    vllm.open_gate()
    assert (await first)[0] == 200
    await front.until(lambda: transport.written.startswith(b"HTTP/1.1 200"), "answered through aiohttp")
    assert json.loads(transport.written.partition(b"\r\n\r\n")[2])["usage"]["completion_tokens"] == 3


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                b"POST /v1/chat/completions HTTP/1.1",
                b"POST /api/chat HTTP/1.1",
                b"Content-Length: 12",
                b"Content-Length: 0",
                b"content-length:3",
                b"Authorization: Bearer k",
                b"Transfer-Encoding: chunked",
                b"Host: x",
                b"",
                b" ",
                b"X: \xff\xfe",
                b"\x00",
                b":",
                b"Content-Length: 99999999999999999999999",
            ]
        )
        | st.binary(max_size=40),
        max_size=8,
    ).map(b"\r\n".join)
)
def test_the_front_doors_reader_never_raises(head):
    plain = _plain_request(head)
    if plain is not None:
        path, headers, length = plain
        assert (
            path in ("/v1/chat/completions", "/api/chat") and length >= 0 and len(headers.getall("Content-Length")) == 1
        )
