"""No slot leaks, failover, broken streams, timeouts, restarts."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import openai

from .conftest import SEED_RECORD_KEYS
from .fakes import FakeOllama, FakeOpenAI
from .harness import Daemon, until
from .inprocess import InProcess

CHAT = "/v1/chat/completions"


def body(model: str = "llama3", stream: bool = False, max_tokens: int = 8, **kw) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hello world"}],
        "stream": stream,
        "max_tokens": max_tokens,
        **kw,
    }


async def test_50_streaming_clients_that_leave_after_the_first_chunk_leak_nothing(daemon):
    fake = InProcess(models=("llama3",), tokens_per_second=50, completion_tokens=200)
    await daemon.backend("b1", fake, max_concurrent=8)
    key = await daemon.user("leaver")
    headers = {"Authorization": f"Bearer {key}"}

    async def leave_after_first_chunk(session: aiohttp.ClientSession) -> None:
        async with session.post(daemon.url + CHAT, json=body(stream=True, max_tokens=200), headers=headers) as resp:
            assert resp.status == 200
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    break  # leaving the block closes the connection

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(leave_after_first_chunk(session) for _ in range(50)))
    await until(
        lambda: daemon.scheduler.running_count == 0 and daemon.scheduler.queued_count == 0 and fake.in_flight == 0
    )
    assert fake.cancelled >= 40  # upstream connections were closed, not left generating
    assert daemon.scheduler.load(1).in_flight == 0
    # The queue keeps flowing: a normal request still gets its answer.
    fake.tokens_per_second = None
    client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
    reply = await client.chat.completions.create(**body(max_tokens=3))
    assert reply.usage.completion_tokens == 3
    daemon.scheduler.check()


async def slot_taken(d: Daemon, user: str) -> tuple[InProcess, dict[str, str], asyncio.Task[Any]]:
    """A one-slot backend that holds its answers, ``user``'s headers, and their first request, running."""
    fake = InProcess(models=("llama3",), completion_tokens=30, held=True)
    await d.backend("b1", fake, max_concurrent=1)
    headers = {"Authorization": f"Bearer {await d.user(user)}"}
    running = asyncio.create_task(d.client.post(CHAT, json=body(max_tokens=30), headers=headers))
    await until(lambda: d.scheduler.running_count == 1, "the first request should run")
    return fake, headers, running


async def test_queued_client_that_leaves_leaves_the_queue(daemon):
    fake, headers, running = await slot_taken(daemon, "q")
    waiting = asyncio.create_task(daemon.client.post(CHAT, json=body(max_tokens=5), headers=headers))
    await until(lambda: daemon.scheduler.queued_count == 1)
    waiting.cancel()
    await until(lambda: daemon.scheduler.queued_count == 0)
    running.cancel()
    await until(lambda: daemon.scheduler.running_count == 0 and fake.in_flight == 0)
    daemon.scheduler.check()


async def test_a_backend_failing_with_500_is_failed_over(daemon):
    bad, good = InProcess(models=("llama3",)), InProcess(models=("llama3",))
    await daemon.backend("bad", bad, priority=100)  # preferred until it fails
    await daemon.backend("good", good)
    key = await daemon.user("f")
    bad.fail_next(1)
    client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
    reply = await client.chat.completions.create(**body(max_tokens=2))
    assert reply.choices[0].message.content == "tok0 tok1"
    assert bad.failed == 1 and good.completed == 1
    records = await daemon.admin("GET", "/admin/decisions?limit=5")
    assert [r["selected_backend"] for r in records] == ["bad", "good"]
    assert records[-1]["attempt"] == 2


async def test_a_backend_killed_mid_stream_ends_the_stream_cleanly(daemon):
    async with FakeOllama(models=["llama3"], completion_tokens=20) as fake:
        await daemon.backend("b1", fake.url, "ollama")
        key = await daemon.user("k")
        fake.drop_next(after_chunks=3)
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                daemon.url + CHAT, json=body(stream=True, max_tokens=20), headers={"Authorization": f"Bearer {key}"}
            ) as resp,
        ):
            assert resp.status == 200
            raw = await resp.read()
        events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert "error" in json.loads(events[-2])
        assert daemon.scheduler.running_count == 0
        # The daemon is still up and serving.
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
        assert (await client.chat.completions.create(**body(max_tokens=1))).choices[0].message.content == "tok0"


async def test_user_queue_full_is_429_and_waiting_too_long_is_504(new_daemon):
    d = await new_daemon(scheduler={"max_queued_per_user": 1, "queue_timeout": 0.5})
    _, headers, first = await slot_taken(d, "full")
    second = asyncio.create_task(d.client.post(CHAT, json=body(), headers=headers))
    await until(lambda: d.scheduler.queued_count == 1)
    third = await d.client.post(CHAT, json=body(), headers=headers)
    assert third.status == 429 and (await third.json())["error"]["type"] == "rate_limit_error"
    assert int(third.headers["Retry-After"]) >= 1  # when to come back, as for a quota
    resp = await second
    assert resp.status == 504 and (await resp.json())["error"]["code"] == "queue_timeout"
    first.cancel()


async def test_a_waiting_stream_is_told_its_queue_position(daemon):
    fake = InProcess(models=("llama3",), completion_tokens=20, held=True)
    await daemon.backend("b1", fake, max_concurrent=1)
    key = await daemon.user("p")
    headers = {"Authorization": f"Bearer {key}"}
    busy = asyncio.create_task(daemon.client.post(CHAT, json=body(max_tokens=20), headers=headers))
    await until(lambda: daemon.scheduler.running_count == 1)
    resp = await daemon.client.post(CHAT, json=body(stream=True, max_tokens=2), headers=headers)
    assert resp.headers["X-Queue-Position"] == "1"
    fake.open_gate()
    text = (await resp.read()).decode()
    assert text.startswith(": queued position=1")
    assert "tok1" in text and text.rstrip().endswith("data: [DONE]")
    await busy


async def test_restart_keeps_groups_users_keys_backends_and_usage(new_daemon):
    fake = InProcess(models=("llama3",), completion_tokens=8)
    d = await new_daemon()
    await d.admin("POST", "/admin/groups", {"name": "phd", "weight": 2.5})
    key = await d.user("rita", "phd")
    await d.backend("b1", fake)
    client = openai.AsyncOpenAI(base_url=d.url + "/v1", api_key=key, max_retries=0)
    await client.chat.completions.create(**body(max_tokens=4))
    await d.client.close()
    # A second daemon on the same state.
    d2 = await new_daemon(inprocess=[fake])  # on the same state
    groups = {g["name"]: g["scheduler_weight"] for g in await d2.admin("GET", "/admin/groups")}
    assert groups["phd"] == 2.5
    assert [u["name"] for u in await d2.admin("GET", "/admin/users")] == ["rita"]
    assert [b["name"] for b in await d2.admin("GET", "/admin/backends")] == ["b1"]
    share = await d2.admin("GET", "/admin/share")
    assert share["global_recent_tokens"] == 2 + 4  # usage survived: fairness continues
    client2 = openai.AsyncOpenAI(base_url=d2.url + "/v1", api_key=key, max_retries=0)
    assert (await client2.chat.completions.create(**body(max_tokens=1))).usage.completion_tokens == 1


async def test_decisions_are_recorded_and_followed_live(daemon):
    fake = InProcess(models=("llama3",), completion_tokens=8)
    await daemon.backend("b1", fake)
    key = await daemon.user("w", "faculty")
    async with aiohttp.ClientSession() as session:
        follow = await session.get(
            daemon.url + "/admin/decisions/stream", headers={"Authorization": "Bearer test-admin-key"}
        )
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
        reply = await client.chat.completions.create(**body(max_tokens=2))
        line = await asyncio.wait_for(follow.content.readline(), 5)
        live = json.loads(line)
        follow.close()
    assert live["user"] == "w" and live["user_group"] == "faculty" and live["selected_backend"] == "b1"
    rid = live["request_id"]
    stored = await daemon.admin("GET", f"/admin/decisions/{rid}")
    for key_ in SEED_RECORD_KEYS:
        assert key_ in stored
    assert stored["user_weight"] == 3
    assert reply.id  # the answer itself is the backend's
    queue = await daemon.admin("GET", "/admin/queue")
    assert queue["queue"]["total"] == 0 and queue["fair_share"]["user_stats"][0]["recent_tokens"] == 2 + 2


async def test_metrics_need_no_key_and_carry_counts_only(daemon):
    fake = InProcess(models=("llama3",), completion_tokens=8)
    await daemon.backend("b1", fake)
    key = await daemon.user("m")
    client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
    await client.chat.completions.create(
        **body(max_tokens=3, messages=[{"role": "user", "content": "secret prompt words"}])
    )
    text = await (await daemon.client.get("/metrics")).text()
    assert "mindrouter_requests_total 1.0" in text
    assert 'mindrouter_tokens_total{kind="completion"} 3.0' in text
    assert 'mindrouter_backend_healthy{backend="b1"} 1.0' in text
    assert "secret" not in text and key not in text


async def test_a_retry_waits_for_the_healthy_backend_instead_of_the_dead_one(daemon):
    """The only free slot is on a backend that just died: the retry waits for the live one."""
    async with (
        FakeOpenAI(flavor="llamacpp", models=["m"], tokens_per_second=20, completion_tokens=10) as good,
        FakeOpenAI(flavor="llamacpp", models=["m"]) as dead,
    ):
        await daemon.backend("good", good.url, "llamacpp", max_concurrent=1, priority=10)
        await daemon.backend("dead", dead.url, "llamacpp", max_concurrent=1)
        key = await daemon.user("u")
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
        busy = asyncio.create_task(
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=10)
        )
        await until(lambda: good.in_flight == 1)
        await dead.go_down()  # refused from now on; its next probe is up to poll_interval away
        reply = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "y"}], max_tokens=2
        )
        assert reply.usage.completion_tokens == 2 and good.completed >= 1
        assert (await busy).usage.completion_tokens == 10
