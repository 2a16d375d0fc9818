"""No member locks the others out of a shared token quota (issue 28, item 1).

A request waiting in the queue reserves only against its own sender; once it runs, what it
reserves against the group is bounded to a fair part of what is left. So one member's request
with ``max_tokens: 16777216`` cannot make another member's request fail while no tokens are used.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from .conftest import Daemon, until
from .fakes import FakeOllama

pytestmark = pytest.mark.asyncio

PROMPT = [{"role": "user", "content": "one two three"}]
LIMIT = 100_000
HUGE = 16_777_216


def client(daemon: Daemon, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{daemon.url}/v1", api_key=key, max_retries=0, timeout=30)


@contextlib.asynccontextmanager
async def lab_with_a_busy_slot(daemon: Daemon) -> AsyncIterator[dict[str, Any]]:
    """Backend ``b1`` serves "busy" with one slot, held by ``hog``'s endless stream; ``b2`` serves "idle".

    ``mallory`` and ``vic`` are members of group ``lab``, whose quota is LIMIT tokens a day.
    """
    async with (
        FakeOllama(models=["busy"], tokens_per_second=20, completion_tokens=100_000) as slow,
        FakeOllama(models=["idle"], completion_tokens=5) as fast,
    ):
        await daemon.backend("b1", slow.url, "ollama", max_concurrent=1)
        await daemon.backend("b2", fast.url, "ollama", max_concurrent=4)
        await daemon.admin("POST", "/admin/groups", {"name": "lab", "weight": 1})
        keys = {"hog": await daemon.user("hog"), "mallory": await daemon.user("mallory", "lab")}
        keys["vic"] = await daemon.user("vic", "lab")
        await daemon.admin("PUT", "/admin/groups/lab/quota", {"tokens_per_day": LIMIT})
        clients = {name: client(daemon, key) for name, key in keys.items()}
        hog = asyncio.create_task(
            clients["hog"].chat.completions.create(model="busy", messages=PROMPT, stream=False)  # type: ignore[call-overload]
        )
        await until(lambda: slow.in_flight == 1, "hog's request never reached the slow backend")
        try:
            yield {"clients": clients, "slow": slow, "fast": fast}
        finally:
            hog.cancel()
            for c in clients.values():
                await c.close()
            with contextlib.suppress(BaseException):
                await hog


@pytest.mark.parametrize("stream", [False, True])
async def test_a_huge_max_tokens_waiting_in_the_queue_locks_out_no_other_member(daemon, stream):
    async with lab_with_a_busy_slot(daemon) as lab:
        mallory, vic = lab["clients"]["mallory"], lab["clients"]["vic"]
        waiting = asyncio.create_task(
            mallory.chat.completions.create(model="busy", messages=PROMPT, max_tokens=HUGE, stream=stream)
        )
        await until(lambda: daemon.scheduler.queued_count == 1, "mallory's request never queued")
        # Another member, an idle model on an idle backend: answered, though the queued request asked for it all.
        answer = await vic.chat.completions.create(model="idle", messages=PROMPT)
        assert answer.choices[0].message.content
        assert answer.usage is not None and answer.usage.completion_tokens == 5
        waiting.cancel()
        with contextlib.suppress(BaseException):
            await waiting


async def test_a_huge_whole_answer_running_reserves_only_a_fair_part_of_what_is_left(daemon):
    async with lab_with_a_busy_slot(daemon) as lab:
        mallory, vic, fast = lab["clients"]["mallory"], lab["clients"]["vic"], lab["fast"]
        fast.tokens_per_second = 2  # mallory's answer runs on b2 a while
        running = asyncio.create_task(mallory.chat.completions.create(model="idle", messages=PROMPT, max_tokens=HUGE))
        await until(lambda: fast.in_flight == 1, "mallory's request never ran")
        groups = await daemon.admin("GET", "/admin/groups")
        lab_limit = next(g for g in groups if g["name"] == "lab")["quotas"][0]
        assert lab_limit["used"] == 0
        assert 0 < lab_limit["reserved"] <= LIMIT // 2, lab_limit  # a fair part, not all of it
        fast.tokens_per_second = None
        answer = await vic.chat.completions.create(model="idle", messages=PROMPT, max_tokens=1000)
        assert answer.usage is not None and answer.usage.completion_tokens == 5
        running.cancel()
        with contextlib.suppress(BaseException):
            await running


async def test_a_members_own_requests_in_flight_refuse_only_that_member_and_say_so(daemon):
    async with lab_with_a_busy_slot(daemon) as lab:
        mallory, vic = lab["clients"]["mallory"], lab["clients"]["vic"]
        long_prompt = [{"role": "user", "content": " ".join(["word"] * 60_000)}]
        waiting = asyncio.create_task(mallory.chat.completions.create(model="busy", messages=long_prompt))
        await until(lambda: daemon.scheduler.queued_count == 1, "mallory's request never queued")
        with pytest.raises(openai.RateLimitError) as refused:
            await mallory.chat.completions.create(model="busy", messages=long_prompt)
        message = refused.value.body["message"]  # type: ignore[index]
        assert "reserved by your requests in flight" in message, message
        retry_after = int(refused.value.response.headers["Retry-After"])
        assert 1 <= retry_after <= 600, retry_after  # no later than the reserving request's queue timeout
        answer = await vic.chat.completions.create(model="idle", messages=long_prompt)  # vic is not refused
        assert answer.usage is not None and answer.usage.completion_tokens == 5
        waiting.cancel()
        with contextlib.suppress(BaseException):
            await waiting


async def test_one_person_behind_a_proxy_locks_out_none_of_the_proxys_other_people(daemon):
    """SECURITY.md gives a front end a people group with a quota: one Open WebUI user cannot spend it for all."""
    async with lab_with_a_busy_slot(daemon) as lab:
        await daemon.admin("POST", "/admin/groups", {"name": "people", "weight": 1})
        await daemon.admin("PUT", "/admin/groups/people/quota", {"tokens_per_day": LIMIT})
        await daemon.admin("POST", "/admin/users", {"name": "webui", "group": "student", "proxy": True})
        await daemon.admin("PUT", "/admin/users/webui", {"proxy_group": "people"})
        key = (await daemon.admin("POST", "/admin/users/webui/keys"))["key"]

        def person(email: str) -> openai.AsyncOpenAI:
            return openai.AsyncOpenAI(
                base_url=f"{daemon.url}/v1",
                api_key=key,
                max_retries=0,
                default_headers={"X-OpenWebUI-User-Email": email},
            )

        eve, bob = person("eve@lab.edu"), person("bob@lab.edu")
        waiting = asyncio.create_task(eve.chat.completions.create(model="busy", messages=PROMPT, max_tokens=HUGE))
        await until(lambda: daemon.scheduler.queued_count == 1, "eve's request never queued")
        answer = await bob.chat.completions.create(model="idle", messages=PROMPT)
        assert answer.usage is not None and answer.usage.completion_tokens == 5
        assert lab["slow"].in_flight == 1
        waiting.cancel()
        for c in (eve, bob):
            await c.close()
        with contextlib.suppress(BaseException):
            await waiting


async def test_a_proxy_that_fills_its_queue_cap_touches_only_its_own_people(tmp_path, aiohttp_client, nvml):
    """SECURITY.md: a lying proxy touches only its own people. Its people's queued requests count together
    against ``max_queued_per_proxy``; a regular user, and a model whose backend is idle, are still served."""
    from mindrouter.daemon.process.app import create_app

    from .conftest import ServeServer, daemon_config

    config = daemon_config(tmp_path, max_queued=6, max_queued_per_proxy=3)
    app = await create_app(config, nvml=nvml)
    d = Daemon(await aiohttp_client(ServeServer(app, config)), app, config)
    async with lab_with_a_busy_slot(d) as lab:
        await d.admin("POST", "/admin/groups", {"name": "people", "weight": 1})
        await d.admin("POST", "/admin/users", {"name": "webui", "group": "student", "proxy_group": "people"})
        key = (await d.admin("POST", "/admin/users/webui/keys"))["key"]
        people = [
            openai.AsyncOpenAI(
                base_url=f"{d.url}/v1",
                api_key=key,
                max_retries=0,
                timeout=10,
                default_headers={"X-Forwarded-User": f"p{i}"},
            )
            for i in range(4)
        ]
        waiting = [
            asyncio.create_task(people[i].chat.completions.create(model="busy", messages=PROMPT)) for i in range(3)
        ]
        await until(lambda: d.scheduler.queued_count == 3, "three people's requests never queued")
        with pytest.raises(openai.RateLimitError) as refused:  # a fourth person: the front end's cap
            await people[3].chat.completions.create(model="busy", messages=PROMPT)
        assert "front end you use already has 3 requests queued" in refused.value.body["message"]  # type: ignore[index]
        vic = lab["clients"]["vic"]  # not one of the proxy's people: queues, then the idle model answers
        queued_too = asyncio.create_task(vic.chat.completions.create(model="busy", messages=PROMPT))
        await until(lambda: d.scheduler.queued_count == 4, "vic's request never queued")
        answer = await people[3].chat.completions.create(model="idle", messages=PROMPT)
        assert answer.usage is not None and answer.usage.completion_tokens == 5
        for task in [*waiting, queued_too]:
            task.cancel()
        for c in people:
            await c.close()
        await asyncio.gather(*waiting, queued_too, return_exceptions=True)
