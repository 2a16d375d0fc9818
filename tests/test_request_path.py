"""The request path end to end: every request gets an end, failures are charged to whoever caused them.

Real daemon, real fake servers on 127.0.0.1. Each test names the defect it
guards against (issues 10 and 12) and measures it with numbers.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import ollama
import pytest

from mindrouter.daemon.edge.services import SERVICES

from .fakes import FakeOllama, FakeOpenAI
from .harness import until

CHAT = "/v1/chat/completions"


def body(model: str = "llama3", stream: bool = False, max_tokens: int = 8, **kw: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
        "max_tokens": max_tokens,
        **kw,
    }


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# ---- every stream whose headers went out gets an end ------------------------------------------


async def one_slot_taken(new_daemon, url: str):
    """A daemon with a queue timeout of 0.5 s whose one-slot backend a 3 s answer holds."""
    d = await new_daemon(scheduler={"queue_timeout": 0.5})
    await d.backend("b1", url, "ollama", max_concurrent=1)
    key = await d.user("q")
    busy = asyncio.create_task(d.client.post(CHAT, json=body(max_tokens=30), headers=auth(key)))
    await until(lambda: d.scheduler.running_count == 1)
    return d, key, busy


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_a_queued_stream_that_times_out_gets_the_dialects_error_tail_and_a_close(new_daemon, dialect):
    async with FakeOllama(models=["llama3"], tokens_per_second=10, completion_tokens=30) as fake:
        d, key, busy = await one_slot_taken(new_daemon, fake.url)
        path = CHAT if dialect == "openai" else "/api/chat"
        resp = await d.client.post(path, json=body(stream=True), headers=auth(key))
        assert resp.headers["X-Request-Id"].startswith("mr-")
        raw = await asyncio.wait_for(resp.read(), 5)  # ends: the daemon closed the stream
        if dialect == "openai":
            assert resp.status == 200
            lines = [line for line in raw.decode().splitlines() if line and not line.startswith(":")]
            assert lines[-1] == "data: [DONE]"
            error = json.loads(lines[-2][6:])["error"]
            assert "waited" in error["message"]
        else:  # Ollama's clients show an error only as the HTTP status: no headers went out while it waited
            assert resp.status == 504 and "waited" in json.loads(raw)["error"]
        busy.cancel()


async def test_the_ollama_client_sees_a_queue_timeout_as_an_error(new_daemon):
    """Open WebUI's Ollama connection dropped an error line sent after a 200; a 504 it shows."""
    async with FakeOllama(models=["llama3"], tokens_per_second=10, completion_tokens=30) as fake:
        d, key, busy = await one_slot_taken(new_daemon, fake.url)
        client = ollama.AsyncClient(host=str(d.client.make_url("/")).rstrip("/"), headers=auth(key))
        with pytest.raises(ollama.ResponseError) as raised:
            async for _ in await client.chat(model="llama3", messages=[{"role": "user", "content": "hi"}], stream=True):
                pass
        assert raised.value.status_code == 504 and "waited" in raised.value.error
        busy.cancel()


async def test_a_queued_stream_whose_only_backend_fails_gets_an_error_tail(new_daemon):
    d = await new_daemon()
    async with FakeOpenAI(flavor="vllm", models=["llama3"], tokens_per_second=20, completion_tokens=10) as fake:
        await d.backend("b1", fake.url, "vllm", max_concurrent=1)
        key = await d.user("q")
        busy = asyncio.create_task(d.client.post(CHAT, json=body(max_tokens=10), headers=auth(key)))
        await until(lambda: d.scheduler.running_count == 1)
        fake.fail_next(1, 500)
        resp = await d.client.post(CHAT, json=body(stream=True), headers=auth(key))
        raw = (await asyncio.wait_for(resp.read(), 5)).decode()
        assert raw.rstrip().endswith("data: [DONE]") and '"backend_failed"' not in raw
        assert "no other backend could take the request" in raw
        await busy


# ---- a hung or failing backend is timed out per phase and never retried on itself ---------


async def test_a_hung_backend_is_timed_out_once_and_never_retried_on_itself(new_daemon):
    d = await new_daemon(backends={"first_byte_timeout": 0.5})
    async with FakeOpenAI(flavor="vllm", models=["llama3"], first_byte_delay=30) as hung:
        await d.backend("b1", hung.url, "vllm")
        key = await d.user("h")
        started = time.monotonic()
        resp = await d.client.post(CHAT, json=body(stream=True), headers=auth(key))
        took = time.monotonic() - started
        assert resp.status == 503 and (await resp.json())["error"]["code"] == "backend_failed"
        assert resp.headers["X-Request-Id"].startswith("mr-")
        assert hung.requests == 1 and 0.5 <= took < 15  # one first-byte timeout, not the 30 s hang
        await until(lambda: hung.in_flight == 0)  # the hung generation was abandoned
        assert d.scheduler.running_count == 0


async def test_a_hung_backend_fails_over_to_another_after_one_timeout(new_daemon):
    d = await new_daemon(backends={"request_timeout": 0.5})  # a whole answer's phase
    async with (
        FakeOpenAI(flavor="vllm", models=["llama3"], first_byte_delay=30) as hung,
        FakeOpenAI(flavor="vllm", models=["llama3"]) as good,
    ):
        await d.backend("hung", hung.url, "vllm", priority=100)
        await d.backend("good", good.url, "vllm")
        key = await d.user("h")
        resp = await d.client.post(CHAT, json=body(max_tokens=2), headers=auth(key))
        assert resp.status == 200 and good.completed == 1 and hung.requests == 1


async def test_a_stream_that_goes_silent_is_ended_after_the_chunk_timeout(new_daemon):
    d = await new_daemon(backends={"chunk_timeout": 0.3})
    async with FakeOllama(models=["llama3"], tokens_per_second=1, completion_tokens=30) as slow:
        await d.backend("b1", slow.url, "ollama")
        key = await d.user("s")
        started = time.monotonic()
        resp = await d.client.post("/api/chat", json=body(stream=True, max_tokens=30), headers=auth(key))
        lines = (await asyncio.wait_for(resp.read(), 15)).decode().splitlines()
        assert time.monotonic() - started < 15  # 0.3 s of silence, not 30 s of trickle
        assert "error" in json.loads(lines[-1]) and len(lines) == 2  # one token, then the error line
        await until(lambda: slow.in_flight == 0 and d.scheduler.running_count == 0)


# ---- health: one failed probe is not enough, a flapping backend is held out --------------


async def test_one_failed_probe_does_not_take_a_backend_out_but_repeated_ones_do(new_daemon):
    d = await new_daemon(backends={"poll_interval": 60, "probe_failures": 2})
    async with FakeOpenAI(flavor="vllm", models=["llama3"]) as fake:
        await d.backend("b1", fake.url, "vllm")
        entry = d.registry.by_name("b1")
        await until(lambda: d.registry.healthy(entry))
        fake.health_status = 503
        await d.registry.probe(entry)
        assert d.registry.healthy(entry) and d.scheduler.backend(entry.row.id).healthy
        key = await d.user("p")
        assert (await d.client.post(CHAT, json=body(max_tokens=1), headers=auth(key))).status == 200
        await d.registry.probe(entry)
        assert not d.registry.healthy(entry)
        fake.health_status = 200
        await d.registry.probe(entry)
        assert d.registry.healthy(entry)


async def test_a_flapping_backend_is_held_out_by_the_breaker_and_readmitted_by_a_probe(new_daemon):
    d = await new_daemon(
        backends={"poll_interval": 60, "circuit_failures": 3, "circuit_cooldown": 0.3, "probe_failures": 2}
    )
    async with FakeOpenAI(flavor="vllm", models=["llama3"]) as fake:
        await d.backend("b1", fake.url, "vllm")
        entry = d.registry.by_name("b1")
        await until(lambda: d.registry.healthy(entry))
        for _ in range(3):  # down, up, down, up...: never two failures in a row
            fake.health_status = 503
            await d.registry.probe(entry)
            fake.health_status = 200
            await d.registry.probe(entry)
        assert entry.circuit_open and not d.registry.healthy(entry)
        await d.registry.probe(entry)  # still cooling down: a good probe does not readmit it yet
        assert not d.registry.healthy(entry)

        async def readmitted() -> bool:
            await d.registry.probe(entry)
            return d.registry.healthy(entry)

        await until(readmitted, "a good probe after the cooldown readmits it")


# ---- client errors are the client's, backend errors the backend's -------------------------


async def test_a_body_that_cannot_be_translated_is_a_400_and_never_touches_the_breaker(new_daemon):
    d = await new_daemon(backends={"poll_interval": 60})
    async with FakeOllama(models=["llama3"]) as fake:
        await d.backend("b1", fake.url, "ollama")
        key = await d.user("c")
        bad = body(messages=[{"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]}])
        for _ in range(5):
            resp = await d.client.post(CHAT, json=bad, headers=auth(key))
            assert resp.status == 400 and (await resp.json())["error"]["type"] == "invalid_request_error"
        entry = d.registry.by_name("b1")
        assert entry.failures == 0 and d.registry.healthy(entry)
        assert (await d.client.post(CHAT, json=body(max_tokens=1), headers=auth(key))).status == 200


async def test_a_500_counts_toward_the_breaker_once_a_second_user_meets_one(new_daemon):
    d = await new_daemon(backends={"poll_interval": 60, "circuit_failures": 3, "circuit_cooldown": 60})
    async with FakeOllama(models=["llama3"]) as fake:
        await d.backend("b1", fake.url, "ollama")
        key, other = await d.user("c"), await d.user("d")
        entry = d.registry.by_name("b1")
        fake.fail_next(2, 500)  # Ollama's answer to a per-request problem
        for _ in range(2):  # one client alone: its body may be what fails, so nothing counts yet
            resp = await d.client.post(CHAT, json=body(), headers=auth(key))
            assert resp.status == 503
        assert fake.failed == 2 and entry.failures == 0 and not entry.circuit_open
        fake.fail_next(1, 500)
        assert (await d.client.post(CHAT, json=body(), headers=auth(other))).status == 503
        assert entry.failures == 3 and entry.circuit_open  # two people met it: the backend's fault, each counted once


async def test_a_backends_4xx_goes_to_the_client_in_its_dialect(new_daemon):
    d = await new_daemon(backends={"poll_interval": 60})
    async with FakeOllama(models=["llama3"]) as fake:
        await d.backend("b1", fake.url, "ollama")
        key = await d.user("c")
        fake.fail_next(1, 400)
        resp = await d.client.post("/api/chat", json=body(), headers=auth(key))
        assert resp.status == 400 and (await resp.json()) == {"error": "injected failure"}
        assert resp.headers["X-Request-Id"].startswith("mr-")
        assert d.registry.by_name("b1").failures == 0


# ---- request ids and decision outcomes ----------------------------------------------------


async def test_every_answer_has_a_request_id_and_every_request_a_decision_with_its_outcome(daemon):
    async with FakeOllama(models=["llama3"], tokens_per_second=50, completion_tokens=50) as fake:
        await daemon.backend("b1", fake.url, "ollama")
        key = await daemon.user("o")
        ids: dict[str, str] = {}
        ok = await daemon.client.post(CHAT, json=body(max_tokens=2), headers=auth(key))
        ids["ok"] = ok.headers["X-Request-Id"]
        unknown = await daemon.client.post(CHAT, json=body(model="nope"), headers=auth(key))
        assert unknown.status == 404
        ids["rejected"] = unknown.headers["X-Request-Id"]
        fake.fail_next(1, 500)
        failed = await daemon.client.post(CHAT, json=body(), headers=auth(key))
        assert failed.status == 503
        ids["backend_failed"] = failed.headers["X-Request-Id"]
        async with aiohttp.ClientSession() as session:
            resp = await session.post(daemon.url + CHAT, json=body(stream=True, max_tokens=50), headers=auth(key))
            ids["client_gone"] = resp.headers["X-Request-Id"]
            await resp.content.readline()
            resp.close()
        await until(lambda: daemon.scheduler.running_count == 0)
        await daemon.admin("POST", "/admin/backends/b1/drain", {"force": True})
        await until(lambda: daemon.registry.by_name("b1").row.state == "disabled")
        off = await daemon.client.post(CHAT, json=body(), headers=auth(key))
        assert off.status == 503 and off.headers["X-Request-Id"]
        for outcome, rid in ids.items():
            record = await daemon.admin("GET", f"/admin/decisions/{rid}")
            assert record["outcome"] == outcome, (outcome, record)
        assert (await daemon.admin("GET", f"/admin/decisions/{ids['rejected']}"))["status"] == 404
        unauthorized = await daemon.client.post(CHAT, json=body(), headers=auth("wrong"))
        assert unauthorized.status == 401 and unauthorized.headers["X-Request-Id"]


# ---- counting: every disconnect is counted, every stream leaves a usage row ----------------


async def test_every_disconnect_is_counted_once(daemon):
    async with FakeOpenAI(flavor="vllm", models=["llama3"], tokens_per_second=10, completion_tokens=100) as fake:
        await daemon.backend("b1", fake.url, "vllm", max_concurrent=5)
        key = await daemon.user("leaver")

        async def leave(session: aiohttp.ClientSession, after_lines: int) -> None:
            async with session.post(daemon.url + CHAT, json=body(stream=True, max_tokens=100), headers=auth(key)) as r:
                for _ in range(after_lines):
                    await r.content.readline()

        async with aiohttp.ClientSession() as session:
            streaming = [asyncio.create_task(leave(session, 6)) for _ in range(5)]  # leave mid-stream
            await until(lambda: daemon.scheduler.running_count == 5)
            queued = [asyncio.create_task(leave(session, 1)) for _ in range(15)]  # leave at ": queued position"
            await asyncio.gather(*streaming, *queued)
        await until(lambda: daemon.scheduler.running_count == daemon.scheduler.queued_count == fake.in_flight == 0)
        text = await (await daemon.client.get("/metrics")).text()
        assert "mindrouter_cancelled_total 20.0" in text


async def test_a_client_that_closes_just_before_the_end_still_leaves_a_usage_row(daemon):
    async with FakeOllama(models=["llama3"], completion_tokens=5, tokens_per_second=40) as fake:
        await daemon.backend("b1", fake.url, "ollama")
        key = await daemon.user("u")
        async with aiohttp.ClientSession() as session:
            for _ in range(20):
                async with session.post(
                    daemon.url + "/api/chat", json=body(stream=True, max_tokens=5), headers=auth(key)
                ) as resp:
                    for _ in range(5):  # every token, then leave before the final line
                        await resp.content.readline()
        await until(lambda: daemon.scheduler.running_count == 0)
        rows = daemon.app[SERVICES].store.recent_usage(0)
        assert len(rows) == 20 and all(row.tokens >= 5 for row in rows)
