"""Request smuggling and desync: malformed or ambiguous HTTP is refused before it costs anything.

Each case is sent over a raw socket to the daemon served as ``mr serve`` serves
it, with a valid key and a valid body, while the backend's only slot is free.
A refused request must not be authenticated, queued, dispatched or charged:
nothing reaches the backend, nothing is queued or running, nothing lands in the
decision log. Every case gets one answer (or, for a head that never ends, a
closed connection) within the documented timeouts (``header_timeout``,
``body_timeout``; 1 s each here).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mindrouter.daemon.edge.services import SERVICES

from .fakes import FakeOpenAI
from .harness import Daemon, daemon, until

CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
TIMEOUT = 1.0
"""``header_timeout`` and ``body_timeout`` for these tests."""
_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


@pytest.fixture
async def vllm() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(flavor="vllm", models=["m"], completion_tokens=3) as fake:
        yield fake


@pytest.fixture
async def served(tmp_path: Path, vllm: FakeOpenAI) -> AsyncIterator[Daemon]:
    """A daemon as ``mr serve`` serves it, short header and body deadlines, one backend (vllm), user ann."""
    async with daemon(tmp_path, server={"header_timeout": TIMEOUT, "body_timeout": TIMEOUT}) as d:
        await d.backend("gpu", vllm.url, "vllm", max_concurrent=1)
        d.key = await d.user("ann")
        yield d


async def exchange(served: Daemon, data: bytes, *, wait: float = 3 * TIMEOUT + 2) -> bytes:
    """Send ``data`` and read until the daemon closes the connection or ``wait`` seconds pass."""
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(data)
    await writer.drain()
    received = b""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    try:
        while (left := deadline - loop.time()) > 0:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), left)
            except (TimeoutError, ConnectionError):
                break
            if not chunk:
                break
            received += chunk
    finally:
        writer.close()
    return received


def statuses(received: bytes) -> list[int]:
    return [int(m[1]) for m in _STATUS.finditer(received)]


def post(key: str, *fields: bytes, body: bytes = CHAT, version: bytes = b"1.1") -> bytes:
    head = [b"POST /v1/chat/completions HTTP/" + version, b"Authorization: Bearer " + key.encode(), *fields]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def length(body: bytes = CHAT) -> bytes:
    return b"Content-Length: %d" % len(body)


HOST = b"Host: x"
JSON = b"Content-Type: application/json"


def cases(key: str) -> dict[str, bytes]:
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(CHAT), CHAT)
    return {
        "content-length with transfer-encoding": post(
            key, HOST, JSON, length(chunked), b"Transfer-Encoding: chunked", body=chunked
        ),
        "two content-lengths that differ": post(key, HOST, JSON, length(), b"Content-Length: 3"),
        "two equal content-lengths": post(key, HOST, JSON, length(), length()),
        "obs-fold": post(key, HOST, JSON, b"X-A: 1", b" folded", length()),
        "bare LF": post(key, HOST, JSON, length()).replace(b"\r\n", b"\n"),
        "NUL in a header": post(key, HOST, JSON, b"X-A: a\x00b", length()),
        "no Host in HTTP/1.1": post(key, JSON, length()),
        "two Hosts": post(key, HOST, b"Host: y", JSON, length()),
        "a signed content-length": post(key, HOST, JSON, b"Content-Length: +%d" % len(CHAT)),
    }


CASES = list(cases("k"))


def assert_answered_as_ours(received: bytes) -> None:
    """One JSON error in the OpenAI shape, with a request id, and no version banner."""
    head, _, body = received.partition(b"\r\n\r\n")
    assert re.search(rb"\r\nX-Request-Id: mr-\S+", head), head
    assert re.search(rb"\r\nServer: mindrouter\r\n", head), head
    assert b"aiohttp" not in head and b"Python" not in head
    error = json.loads(body)["error"]
    assert error["message"].endswith("fix the client or the proxy in front of the router") or error["code"]


def assert_nothing_charged(served: Daemon, vllm: FakeOpenAI) -> None:
    scheduler = served.app[SERVICES].scheduler
    assert (scheduler.queued_count, scheduler.running_count) == (0, 0)
    assert vllm.requests == 0, "a refused request reached the backend"
    served.app[SERVICES].decisions.flush()
    assert served.app[SERVICES].decisions.recent(10) == [], "a refused request was recorded as a decision"


@pytest.mark.parametrize("case", CASES)
async def test_a_malformed_or_ambiguous_request_is_refused_before_it_costs_anything(served, vllm, case):
    received = await exchange(served, cases(served.key)[case])
    assert statuses(received) == [400], received[:300]
    assert_answered_as_ours(received)
    assert_nothing_charged(served, vllm)


async def test_a_head_that_never_ends_is_closed_with_nothing_charged(served, vllm):
    received = await exchange(served, post(served.key, HOST, JSON, length()).split(b"\r\n\r\n")[0] + b"\r\n")
    assert statuses(received) in ([], [408]), received[:300]
    assert_nothing_charged(served, vllm)


async def test_a_head_without_its_body_gets_408_within_the_body_timeout(served, vllm):
    loop = asyncio.get_running_loop()
    started = loop.time()
    received = await exchange(served, post(served.key, HOST, JSON, b"Content-Length: 1000"))
    assert statuses(received) == [408], received[:300]
    assert_answered_as_ours(received)
    assert loop.time() - started < TIMEOUT + 2  # the body's deadline, not the header's, with slack for a busy machine
    assert vllm.requests == 0 and served.app[SERVICES].scheduler.queued_count == 0


async def test_pipelined_requests_are_answered_in_order_once_each(served, vllm):
    one = post(served.key, HOST, JSON, length())
    received = await exchange(served, one + one + post(served.key, HOST, JSON, length(), b"Connection: close"))
    assert statuses(received) == [200, 200, 200], received[:300]
    assert vllm.requests == 3
    assert len(set(re.findall(rb"X-Request-Id: (\S+)", received))) == 3


async def test_a_smuggled_request_behind_a_good_one_is_not_run(served, vllm):
    """A first request's body claims the second's bytes under one reading and not the other."""
    smuggled = post(served.key, HOST, JSON, length())
    first = post(served.key, HOST, JSON, length(smuggled), b"Transfer-Encoding: chunked", body=b"0\r\n\r\n" + smuggled)
    received = await exchange(served, first)
    assert statuses(received) == [400], received[:300]
    assert_nothing_charged(served, vllm)


async def test_a_half_closed_client_is_treated_as_gone(served, vllm):
    """Shutting the write side after a whole request reads as leaving (docs/reliability.md, "A client that
    half-closes"): EOF is how a waiting request notices its client left, so the connection closes unanswered
    and nothing stays queued or running; a record, where the request got that far, says ``client_gone``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(post(served.key, HOST, JSON, length()))
    writer.write_eof()
    received = await asyncio.wait_for(reader.read(), 3 * TIMEOUT + 2)
    writer.close()
    assert received == b"", received[:300]
    scheduler = served.app[SERVICES].scheduler
    await until(lambda: (scheduler.queued_count, scheduler.running_count) == (0, 0), "the request stayed")
    assert {record["outcome"] for record in served.app[SERVICES].decisions.recent(10)} <= {"client_gone"}
