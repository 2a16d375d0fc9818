"""Backend life in the daemon: circuit breaker, drain, embeddings in both dialects."""

from __future__ import annotations

import asyncio

import ollama
import openai

from .conftest import until
from .fakes import FakeOllama, FakeOpenAI


async def test_failures_open_the_circuit_and_a_probe_closes_it(daemon):
    async with (
        FakeOpenAI(flavor="vllm", models=["llama3"]) as flaky,
        FakeOpenAI(flavor="vllm", models=["llama3"]) as steady,
    ):
        row = await daemon.backend("flaky", flaky.url, "vllm", priority=100)
        await daemon.backend("steady", steady.url, "vllm")
        key = await daemon.user("c")
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
        others = [
            openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=await daemon.user(n), max_retries=0)
            for n in ("d", "e")
        ]
        # The breaker's clock stands still until the test lets the cool-down pass, however slow the machine.
        now = [daemon.registry.clock()]
        daemon.registry.clock = lambda: now[0]
        flaky.fail_next(3, 503)
        for who in (client, *others):  # each fails over to steady; three people meeting 503s open flaky's circuit
            reply = await who.chat.completions.create(
                model="llama3", messages=[{"role": "user", "content": "x"}], max_tokens=1
            )
            assert reply.choices[0].message.content == "tok0"
        entry = daemon.registry.entries[row["id"]]
        assert entry.circuit_open and not daemon.scheduler.backend(row["id"]).healthy
        listed = {b["name"]: b for b in await daemon.admin("GET", "/admin/backends")}
        assert listed["flaky"]["status"] == "unhealthy" and listed["flaky"]["error"]
        before = flaky.requests
        await client.chat.completions.create(model="llama3", messages=[{"role": "user", "content": "x"}], max_tokens=1)
        assert flaky.requests == before  # an open circuit takes no traffic
        # After the cool-down, the next successful probe closes it again.
        now[0] += 1.0  # past the 0.3 s cool-down
        await until(lambda: daemon.scheduler.backend(row["id"]).healthy)
        assert not entry.circuit_open
        await client.chat.completions.create(model="llama3", messages=[{"role": "user", "content": "x"}], max_tokens=1)
        assert flaky.requests == before + 1


async def test_a_drained_backend_takes_no_new_work_and_reads_drained_once_idle(daemon):
    async with (
        FakeOpenAI(flavor="vllm", models=["llama3"], tokens_per_second=40, completion_tokens=20) as a,
        FakeOpenAI(flavor="vllm", models=["llama3"]) as b,
    ):
        row = await daemon.backend("a", a.url, "vllm", priority=100)
        await daemon.backend("b", b.url, "vllm")
        key = await daemon.user("d")
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
        running = asyncio.create_task(
            client.chat.completions.create(model="llama3", messages=[{"role": "user", "content": "x"}], max_tokens=20)
        )
        await until(lambda: a.in_flight == 1)
        drained = await daemon.admin("POST", "/admin/backends/a/drain")
        assert drained["status"] == "draining"
        await client.chat.completions.create(model="llama3", messages=[{"role": "user", "content": "x"}], max_tokens=1)
        assert b.completed == 1 and a.requests == 1  # new work went elsewhere
        assert (await running).usage.completion_tokens == 20  # in-flight work finished
        await until(lambda: daemon.registry.entries[row["id"]].row.state == "disabled")
        # a drained backend reads "drained" everywhere people see it, not "disabled" (issue 21)
        listed = {b["name"]: b["status"] for b in await daemon.admin("GET", "/admin/backends")}
        assert listed == {"a": "drained", "b": "healthy"}
        top = await daemon.admin("GET", "/admin/top")
        assert {b["name"]: b["status"] for b in top["backends"]} == listed
        enabled = await daemon.admin("POST", "/admin/backends/a/enable")
        assert enabled["status"] == "healthy"


async def test_embeddings_in_both_dialects_on_both_engines(daemon):
    async with FakeOllama(models=["nomic"]) as oll, FakeOpenAI(flavor="vllm", models=["bge"]) as vllm:
        await daemon.backend("o", oll.url, "ollama")
        await daemon.backend("v", vllm.url, "vllm")
        key = await daemon.user("e")
        oa = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
        ol = ollama.AsyncClient(host=daemon.url, headers={"Authorization": f"Bearer {key}"})
        for model in ("nomic", "bge"):
            out = await oa.embeddings.create(model=model, input=["one two", "three"])
            assert len(out.data) == 2 and len(out.data[0].embedding) == 4
            assert out.usage.prompt_tokens == 3
            res = await ol.embed(model=model, input=["alpha beta gamma"])
            assert len(res.embeddings) == 1 and len(res.embeddings[0]) == 4
        state = next(u for u in daemon.scheduler.share(0).users if u.name == "e")
        assert state.served == 3 + 3 + 3 + 3
