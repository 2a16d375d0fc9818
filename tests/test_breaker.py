"""The circuit breaker counts only the backend's faults (issue 19 items 4 and 8).

First the breaker alone, with plain calls and explicit times; then the real
daemon against fakes: llama-server without ``--embeddings`` (501), a body the
backend fails on (a lone UTF-16 surrogate answered 500), and a backend that
comes back.
"""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from mindrouter.backends import Fault
from mindrouter.config import BackendSettings
from mindrouter.daemon.pollers.breaker import Breaker

from .conftest import until
from .fakes import FakeOllama, FakeOpenAI
from .test_request_path import auth

SETTINGS = BackendSettings(circuit_failures=3, circuit_window=60, circuit_cooldown=30, poll_interval=10)


# ---- the breaker alone ---------------------------------------------------------------------


def test_one_users_errors_never_open_the_circuit():
    b = Breaker(SETTINGS)
    for t in range(10):
        assert not b.record(Fault.ERROR, "alice", 100.0 + t)
    assert b.failures(110.0) == 0 and not b.open


def test_errors_count_once_a_second_user_meets_one():
    b = Breaker(SETTINGS)
    assert not b.record(Fault.ERROR, "alice", 100.0)
    assert not b.record(Fault.ERROR, "alice", 101.0)
    assert b.failures(101.0) == 0
    assert b.record(Fault.ERROR, "bob", 102.0)  # three errors, two people: the backend's fault
    assert b.open and b.open_until == 132.0


def test_a_failed_probe_makes_one_users_errors_count():
    b = Breaker(SETTINGS)
    b.record(Fault.ERROR, "alice", 100.0)
    b.record(Fault.ERROR, "alice", 101.0)
    assert b.probe_failed(102.0)  # the probe met it too


def test_not_supported_and_cut_answers_never_count():
    b = Breaker(SETTINGS)
    for t in range(10):
        b.record(Fault.UNSUPPORTED, f"u{t}", 100.0 + t)
        b.record(Fault.CUT, f"u{t}", 100.0 + t)
    assert b.failures(110.0) == 0 and not b.open


def test_unanswered_requests_always_count_and_age_out_of_the_window():
    b = Breaker(SETTINGS)
    b.record(Fault.DOWN, "alice", 100.0)
    b.record(Fault.DOWN, "alice", 101.0)
    assert b.failures(101.0) == 2
    assert b.failures(162.0) == 0  # older than circuit_window
    assert not b.record(Fault.DOWN, "alice", 162.0)


def test_a_probe_closes_the_circuit_only_after_the_cool_down():
    b = Breaker(SETTINGS)
    for t in range(3):
        b.record(Fault.DOWN, "alice", 100.0 + t)
    assert b.open
    assert not b.probe_passed(110.0) and b.open
    assert b.probe_passed(132.5) and not b.open and b.failures(132.5) == 0


def test_a_down_backend_is_probed_again_soon_but_not_before_its_cool_down():
    b = Breaker(SETTINGS)
    assert b.next_probe(100.0, 0.5) == 0.5
    assert b.next_probe(100.0, 40.0) == 10.0  # never later than poll_interval
    for _ in range(3):
        b.record(Fault.DOWN, "alice", 100.0)
    assert b.next_probe(100.0, 0.5) == 10.0  # its cool-down (30 s) is longer than a poll
    assert b.next_probe(129.0, 0.5) == 1.0


# ---- the daemon ----------------------------------------------------------------------------


async def test_llama_server_without_embeddings_never_opens_the_breaker(new_daemon):
    """The issue's case: one embeddings.create() with the SDK's two retries opened the breaker, every user's
    chat got an instant 503 for 35-39 s, and the call took 49 s to end in "try again shortly"."""
    d = await new_daemon(backends={"poll_interval": 60, "circuit_cooldown": 60})
    async with FakeOpenAI(flavor="llamacpp", models=["tiny"]) as llama:
        llama.embeddings_supported = False
        await d.backend("llama", llama.url, "llamacpp")
        alice, bob = await d.user("alice"), await d.user("bob")
        client = openai.AsyncOpenAI(base_url=d.url + "/v1", api_key=alice, max_retries=2)
        started = time.monotonic()
        with pytest.raises(openai.BadRequestError) as caught:  # a 400: the SDK does not retry it
            await client.embeddings.create(model="tiny", input="hello")
        assert time.monotonic() - started < 15  # not the 49 s of retries
        message = caught.value.body["message"]
        assert "embeddings" in message and "--embeddings" in message and "try again" not in message
        assert llama.requests == 1
        for _ in range(3):  # routing learnt it: the backend is not asked again, the answer names what it lacks
            with pytest.raises(openai.BadRequestError) as caught:
                await client.embeddings.create(model="tiny", input="hello")
            assert caught.value.body["message"] == message
        assert llama.requests == 1
        resp = await d.client.post(
            "/api/embed", json={"model": "tiny", "input": "hello"}, headers={"Authorization": f"Bearer {alice}"}
        )
        assert resp.status == 400 and (await resp.json()) == {"error": message}  # Ollama's dialect, same sentence
        assert "backend 'llama'" in message and resp.headers["X-Request-Id"].startswith("mr-")
        assert llama.requests == 1
        entry = d.registry.by_name("llama")
        assert entry.failures == 0 and d.registry.healthy(entry)
        chat = openai.AsyncOpenAI(base_url=d.url + "/v1", api_key=bob, max_retries=0)
        reply = await chat.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
        assert reply.choices[0].message.content.startswith("tok0")  # another user's chat is untouched


async def test_embeddings_skip_a_backend_without_them_while_another_has_the_model(new_daemon):
    d = await new_daemon(backends={"poll_interval": 60})
    async with (
        FakeOpenAI(flavor="llamacpp", models=["tiny"]) as bare,
        FakeOpenAI(flavor="llamacpp", models=["tiny"]) as full,
    ):
        bare.embeddings_supported = False
        await d.backend("bare", bare.url, "llamacpp", priority=50)  # preferred, so it is asked first
        await d.backend("full", full.url, "llamacpp")
        client = openai.AsyncOpenAI(base_url=d.url + "/v1", api_key=await d.user("alice"), max_retries=0)
        for _ in range(5):
            answer = await client.embeddings.create(model="tiny", input="hello")  # the first fails over at once
            assert len(answer.data[0].embedding) == 4
        assert bare.requests == 1 and full.requests == 5
        reply = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
        assert reply.choices[0].message.content.startswith("tok0")
        assert bare.requests == 2  # chat still goes to the preferred backend


async def test_a_body_the_backend_fails_on_is_that_clients_error(new_daemon):
    """A lone UTF-16 surrogate on /api/embed, answered 500: three of them took the only backend out for 39.9 s."""
    d = await new_daemon(backends={"poll_interval": 60, "circuit_cooldown": 60})
    async with FakeOllama(models=["nomic-embed-text:latest", "llama3:latest"]) as ollama:
        await d.backend("b1", ollama.url, "ollama")
        mallory, bob = await d.user("mallory"), await d.user("bob")
        raw = b'{"model": "nomic-embed-text:latest", "input": "bad \\ud800 text"}'
        for _ in range(5):
            resp = await d.client.post("/api/embed", data=raw, headers=auth(mallory))
            assert resp.status >= 500 and "error" in await resp.json()
        assert ollama.failed == 0 and ollama.requests == 5  # the backend answered 500 each time
        entry = d.registry.by_name("b1")
        assert entry.failures == 0 and not entry.circuit_open and d.registry.healthy(entry)
        resp = await d.client.post(
            "/api/chat",
            json={"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": False},
            headers=auth(bob),
        )
        assert resp.status == 200  # nobody else's service was reduced


async def test_a_backend_that_recovers_is_back_within_about_a_second(new_daemon):
    """Item 8: a one-backend pool answered 97 x 503 over 10 s after its backend recovered (a whole poll)."""
    d = await new_daemon(backends={"poll_interval": 10, "probe_failures": 1, "circuit_cooldown": 0.1})
    async with FakeOllama(models=["llama3"]) as ollama:
        await d.backend("b1", ollama.url, "ollama")
        entry = d.registry.by_name("b1")
        await until(lambda: d.registry.healthy(entry))
        await ollama.go_down()
        key = await d.user("alice")
        body = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": False}
        assert (await d.client.post("/api/chat", json=body, headers=auth(key))).status == 503
        await until(lambda: not d.registry.healthy(entry), timeout=8)  # the failed request woke a probe (poll: 10 s)
        await asyncio.sleep(2.0)  # down a while: the re-probes back off (0.5, 1, 2 s...)
        await ollama.come_up()
        started = time.monotonic()
        await until(lambda: d.registry.healthy(entry), timeout=8)
        back = time.monotonic() - started
        assert back < 8, back  # not the 10 s poll_interval


async def test_one_clients_timeouts_never_open_the_breaker(new_daemon):
    """A prompt that makes the backend slow for its sender alone (here every answer starts late) is that
    client's problem until a second user meets it too."""
    d = await new_daemon(backends={"poll_interval": 60, "first_byte_timeout": 0.3})
    async with FakeOllama(models=["llama3"], first_byte_delay=1.0) as slow:
        await d.backend("b1", slow.url, "ollama")
        mallory, bob = await d.user("mallory"), await d.user("bob")
        body = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        for _ in range(4):
            assert (await d.client.post("/api/chat", json=body, headers=auth(mallory))).status == 503
        entry = d.registry.by_name("b1")
        assert entry.failures == 0 and not entry.circuit_open
        assert (await d.client.post("/api/chat", json=body, headers=auth(bob))).status == 503
        assert entry.failures == 5 and entry.circuit_open  # two people met it: the backend is slow for everyone
