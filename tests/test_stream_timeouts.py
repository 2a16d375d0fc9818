"""Streams to a hung backend end in bounded time, in their dialect, charged for what was delivered (issue 19).

A backend that accepts a request and then sends nothing (a hung GPU, a runner stuck
in a driver call) held a stream for ``first_byte_timeout``, 300 s by default. Now a
backend with the model resident has ``first_byte_timeout`` (60 s) to start, one
that must load it first ``load_timeout`` (180 s) more, and a stream that falls
silent mid-answer is cut after ``chunk_timeout`` (60 s). Real daemon, fake Ollama
on 127.0.0.1 that hangs before its first byte or between chunks.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from mindrouter.config import BackendSettings
from mindrouter.daemon.edge.services import SERVICES

from .conftest import Daemon, until
from .fakes import FakeOllama
from .test_request_path import auth

PATHS = {"openai": "/v1/chat/completions", "ollama": "/api/chat"}


def chat(stream: bool = True, **kw: Any) -> dict[str, Any]:
    return {"model": "llama3", "messages": [{"role": "user", "content": "hi there"}], "stream": stream, **kw}


def events(raw: bytes, dialect: str) -> list[Any]:
    """The stream's events as JSON (OpenAI's ``[DONE]`` as the string)."""
    lines = [line for line in raw.decode().splitlines() if line and not line.startswith(":")]
    if dialect == "openai":
        return [line[6:] if line == "data: [DONE]" else json.loads(line[6:]) for line in lines]
    return [json.loads(line) for line in lines]


def error_of(items: list[Any], dialect: str) -> str:
    if dialect == "openai":
        assert items[-1] == "[DONE]"
        return str(items[-2]["error"]["message"])
    return str(items[-1]["error"])


async def usage_rows(d: Daemon) -> list[tuple[int, int]]:
    d.app[SERVICES].usage.write()
    rows = (
        d.app[SERVICES].store._db.execute("SELECT prompt_tokens, completion_tokens FROM usage ORDER BY id").fetchall()
    )
    return [tuple(r) for r in rows]


def test_the_defaults_bound_a_hung_stream_within_minutes_and_allow_a_cold_70b_load():
    s = BackendSettings()
    assert s.first_byte_timeout == 60 and s.load_timeout == 180 and s.chunk_timeout == 60
    # A 70B model at 4 bits is about 40 GB: 180 s is 220 MB/s, a SATA disk's pace or a busy NFS.
    assert 40e9 / s.load_timeout > 200e6


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_a_backend_that_hangs_before_the_first_byte_is_cut_after_first_byte_timeout(new_daemon, dialect):
    d = await new_daemon(backends={"poll_interval": 60, "first_byte_timeout": 0.4, "load_timeout": 30})
    async with FakeOllama(models=["llama3"], first_byte_delay=3600) as hung:
        await d.backend("b1", hung.url, "ollama")
        await until(lambda: d.registry.healthy(d.registry.by_name("b1")))
        key = await d.user("h")
        started = time.monotonic()
        resp = await d.client.post(PATHS[dialect], json=chat(), headers=auth(key))
        took = time.monotonic() - started
        body = await resp.json()
        message = body["error"]["message"] if dialect == "openai" else body["error"]
        assert resp.status == 503 and "sent nothing for 0.4 s" in message, (resp.status, body)
        assert 0.4 <= took < 15, took  # the model was resident: no load allowance (30 s)
        assert resp.headers["X-Request-Id"].startswith("mr-") and resp.headers.get("Server") == "mindrouter"
        await until(lambda: hung.in_flight == 0 and d.scheduler.running_count == 0)
        assert await usage_rows(d) == []  # nothing delivered, nothing charged


async def test_a_model_that_must_load_first_gets_the_load_allowance(new_daemon):
    d = await new_daemon(backends={"poll_interval": 60, "first_byte_timeout": 0.4, "load_timeout": 3})
    async with FakeOllama(models=["llama3", "other"], loaded=["other"], load_seconds=1.0) as cold:
        await d.backend("b1", cold.url, "ollama")
        await until(lambda: d.registry.healthy(d.registry.by_name("b1")))
        key = await d.user("c")
        resp = await d.client.post("/api/chat", json=chat(), headers=auth(key))
        items = events(await resp.read(), "ollama")
        assert resp.status == 200 and items[-1]["done"] is True and "error" not in items[-1]
        assert cold.requests == 1


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_a_stream_that_hangs_between_chunks_ends_in_its_dialect_charged_what_it_delivered(new_daemon, dialect):
    d = await new_daemon(backends={"poll_interval": 60, "chunk_timeout": 0.4})
    async with FakeOllama(models=["llama3"], completion_tokens=20) as fake:
        fake.hang_after = 3
        await d.backend("b1", fake.url, "ollama")
        key = await d.user("s")
        started = time.monotonic()
        resp = await d.client.post(PATHS[dialect], json=chat(), headers=auth(key))
        items = events(await asyncio.wait_for(resp.read(), 15), dialect)
        assert resp.status == 200 and time.monotonic() - started < 15  # the backend hangs for an hour
        assert "sent nothing for 0.4 s" in error_of(items, dialect)
        if dialect == "openai":
            tokens = [e for e in items[:-2] if e["choices"] and e["choices"][0]["delta"].get("content")]
        else:
            tokens = [e for e in items[:-1] if e["message"]["content"]]
        assert len(tokens) == 3
        await until(lambda: fake.in_flight == 0 and d.scheduler.running_count == 0)
        assert await usage_rows(d) == [(2, 3)]  # "hi there" and the 3 tokens the client got


async def test_one_users_hung_streams_never_open_the_breaker_but_two_users_do(new_daemon):
    d = await new_daemon(backends={"poll_interval": 60, "chunk_timeout": 0.3})
    async with FakeOllama(models=["llama3"], completion_tokens=20) as fake:
        fake.hang_after = 2
        await d.backend("b1", fake.url, "ollama")
        mallory, bob = await d.user("mallory"), await d.user("bob")
        entry = d.registry.by_name("b1")
        for _ in range(4):
            resp = await d.client.post("/api/chat", json=chat(), headers=auth(mallory))
            assert "error" in events(await resp.read(), "ollama")[-1]
        assert entry.failures == 0 and not entry.circuit_open
        resp = await d.client.post("/api/chat", json=chat(), headers=auth(bob))
        assert "error" in events(await resp.read(), "ollama")[-1]
        assert entry.failures == 5 and entry.circuit_open  # two people met it: the backend hangs for everyone


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_a_stream_told_to_wait_ends_in_its_dialect_when_its_backend_then_hangs(new_daemon, dialect):
    d = await new_daemon(backends={"poll_interval": 60, "first_byte_timeout": 0.4, "load_timeout": 30})
    async with FakeOllama(models=["llama3"], first_byte_delay=3600) as hung:
        await d.backend("b1", hung.url, "ollama", max_concurrent=1)
        await until(lambda: d.registry.healthy(d.registry.by_name("b1")))
        first = asyncio.create_task(d.client.post(PATHS[dialect], json=chat(), headers=auth(await d.user("a"))))
        await until(lambda: d.scheduler.running_count == 1)
        resp = await d.client.post(PATHS[dialect], json=chat(), headers=auth(await d.user("b")))
        raw = await asyncio.wait_for(resp.read(), 5)
        if dialect == "openai":  # queued: its headers went out at once, and the error ends the stream
            assert resp.status == 200
            assert "sent nothing for 0.4 s" in error_of(events(raw, dialect), dialect)
        else:  # an Ollama stream's headers wait for its slot: the hang is the answer's status
            assert resp.status == 503 and "sent nothing for 0.4 s" in json.loads(raw)["error"]
        assert (await first).status == 503
        await until(lambda: hung.in_flight == 0 and d.scheduler.running_count == 0)
        assert await usage_rows(d) == []
