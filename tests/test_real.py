"""The daemon in front of two real llama.cpp servers (issue 6, item 3).

Each test gets a fresh in-process daemon (tests/conftest.py) in front of two
llama-server instances on free loopback ports, started by
scripts/llama-server.sh with the tiny random-weight model and 2 slots each,
added as engine ``llamacpp`` with ``max_concurrent`` 2. The servers live for
the module (a killed one is replaced before the next test) and are stopped at
its end, failures included. The request fields
``grammar`` and ``ignore_eos`` (tests/real_server.py: ``EXACT``) make every
OpenAI-dialect completion exactly ``max_tokens`` tokens of ``[a-z ]``.

Ollama-dialect clients cannot send those fields: mindrouter's translation to
an OpenAI-family engine keeps only the shared options (temperature, top_p,
seed, penalties, num_predict, stop, format), so their tests check bounds.

Deselected by default (pyproject: ``-m 'not real'``); run with
``pytest -m real tests/test_real.py`` after ``scripts/llama-server.sh build``
and ``scripts/llama-server.sh model tiny``. Skipped when the binary is absent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import ollama
import openai
import pytest

from . import harness
from .harness import until
from .real_server import EXACT, LlamaServer, binary, free_port

BIN, WHY_NOT = binary()

pytestmark = [pytest.mark.real, pytest.mark.skipif(BIN is None, reason=WHY_NOT or "llama-server is not built")]

MODEL = "tiny"
NAMES = ("llama-a", "llama-b")
SLOTS = 2
LETTERS = re.compile(r"[a-z ]+")
MESSAGES = [{"role": "user", "content": "tell me about the lab cluster"}]


@dataclasses.dataclass
class Pool:
    daemon: Any
    servers: dict[str, LlamaServer]

    def key_headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}


class Servers(dict):
    """The servers now in use by backend name; ``started`` also keeps the ones a test killed."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[LlamaServer] = []


@pytest.fixture(scope="module")
def servers(request):
    """The module's llama-servers, started by ``pool`` as needed and all stopped at the end, failures included."""
    running = Servers()
    failed_before = request.session.testsfailed
    try:
        yield running
    finally:
        with ThreadPoolExecutor(len(NAMES)) as pool:  # each takes about 2 s to exit on SIGTERM
            list(pool.map(LlamaServer.stop, running.started))
        if request.session.testsfailed == failed_before:  # keep the servers' logs only when they may tell something
            for server in running.started:
                server.log.unlink(missing_ok=True)


@pytest.fixture
async def daemon(tmp_path, nvml):
    """As conftest's, with fair share counting tokens (1:1): what the core charged reads as the servers' counts."""
    async with harness.daemon(
        tmp_path, nvml=nvml, scheduler={"prompt_token_cost": 1.0, "completion_token_cost": 1.0}
    ) as d:
        yield d


@pytest.fixture
async def pool(daemon, servers):
    """A fresh daemon with the two servers (replaced if a test killed one) as idle llamacpp backends."""
    for name in NAMES:
        server = servers.get(name)
        if server is None or not server.alive():
            if server is not None:
                await asyncio.to_thread(server.stop)
            ports = {s.port for s in servers.started}
            port = free_port()
            while port in ports:
                port = free_port()
            server = servers[name] = LlamaServer(BIN, port, parallel=SLOTS)
            servers.started.append(server)
            await asyncio.to_thread(server.start)
    # A test that failed may have left generations running; start from idle servers.
    await until(lambda: _all_idle(list(servers.values())), "idle servers before the test", timeout=15)
    for name in NAMES:
        row = await daemon.backend(name, servers[name].url, "llamacpp", max_concurrent=SLOTS)
        assert row["healthy"] and row["models"] == [MODEL], row
    yield Pool(daemon, dict(servers))


def oai(daemon: Any, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0, timeout=60)


def served_cost(daemon: Any, name: str) -> float:
    """What the core charged ``name`` in all, settled against the backend's counts."""
    return next(u for u in daemon.scheduler.share(0).users if u.name == name).served


async def test_openai_client_stream_and_not_charged_by_the_servers_own_counts(pool):
    d = pool.daemon
    key = await d.user("alice", "faculty")
    client = oai(d, key)

    reply = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, extra_body=EXACT)
    assert reply.choices[0].finish_reason == "length"
    assert LETTERS.fullmatch(reply.choices[0].message.content), reply.choices[0].message.content
    assert reply.usage.completion_tokens == 12 and reply.usage.prompt_tokens > 0
    charged = reply.usage.prompt_tokens + reply.usage.completion_tokens

    stream = await client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=EXACT,
    )
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert LETTERS.fullmatch(text), text
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 9
    assert usage.prompt_tokens == reply.usage.prompt_tokens  # same messages, same template
    charged += usage.prompt_tokens + usage.completion_tokens
    assert served_cost(d, "alice") == charged

    # A stream whose client did not ask for usage: mindrouter asks for it, charges it, hides it.
    stream = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=7, stream=True, extra_body=EXACT
    )
    chunks = [c async for c in stream]
    assert all(c.usage is None for c in chunks)
    assert LETTERS.fullmatch("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
    charged += reply.usage.prompt_tokens + 7
    assert served_cost(d, "alice") == charged
    assert (await d.admin("GET", "/admin/share"))["global_recent_tokens"] == charged
    await client.close()
    d.scheduler.check()


async def test_ollama_client_stream_and_not_charged_by_the_servers_own_counts(pool):
    d = pool.daemon
    key = await d.user("bob", "student")
    client = ollama.AsyncClient(host=d.url, headers=pool.key_headers(key))
    assert [m.model for m in (await client.list()).models] == [MODEL + ":latest"]  # Ollama lists name:tag

    reply = await client.chat(model=MODEL, messages=MESSAGES, options={"num_predict": 8})
    assert reply.done and reply.message.role == "assistant"
    assert reply.prompt_eval_count > 0 and 0 < reply.eval_count <= 8
    charged = reply.prompt_eval_count + reply.eval_count

    parts = [
        p
        async for p in await client.generate(
            model=MODEL, prompt="once upon a time", stream=True, options={"num_predict": 6}
        )
    ]
    last = parts[-1]
    assert last.done and all(not p.done for p in parts[:-1])
    assert last.prompt_eval_count > 0 and 0 < last.eval_count <= 6
    charged += last.prompt_eval_count + last.eval_count

    parts = [
        p async for p in await client.chat(model=MODEL, messages=MESSAGES, stream=True, options={"num_predict": 5})
    ]
    last = parts[-1]
    assert last.done and last.prompt_eval_count == reply.prompt_eval_count and 0 < last.eval_count <= 5
    charged += last.prompt_eval_count + last.eval_count
    assert served_cost(d, "bob") == charged
    d.scheduler.check()


async def test_queue_and_decisions_reflect_concurrent_traffic_on_both_servers(pool):
    d = pool.daemon
    key = await d.user("carol", "staff")
    client = oai(d, key)
    n, tokens = 8, 600
    tasks = [
        asyncio.create_task(
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=tokens, extra_body=EXACT)
        )
        for _ in range(n)
    ]

    # 4 slots in all: 4 run, 4 wait in mindrouter's queue (not in the servers').
    queue = None

    async def saturated() -> bool:
        nonlocal queue
        queue = await d.admin("GET", "/admin/queue")
        return queue["queue"]["running"] == 2 * SLOTS and queue["queue"]["total"] == n - 2 * SLOTS

    await until(saturated, "4 running and 4 queued", timeout=10)
    assert queue["queue"]["by_user_name"] == {"carol": n - 2 * SLOTS}
    assert queue["queue"]["by_model"] == {MODEL: n - 2 * SLOTS}
    # Both servers are generating at once, each on both of its slots (their own /slots says so).
    servers = list(pool.servers.values())
    await until(lambda: _all_busy(servers), "both servers busy on all slots", timeout=10)
    rows = {r["name"]: r for r in await d.admin("GET", "/admin/backends")}
    assert {name: rows[name]["in_flight"] for name in NAMES} == {name: SLOTS for name in NAMES}

    replies = await asyncio.gather(*tasks)
    assert all(r.usage.completion_tokens == tokens for r in replies)
    charged = sum(r.usage.prompt_tokens + r.usage.completion_tokens for r in replies)
    assert served_cost(d, "carol") == charged

    queue = await d.admin("GET", "/admin/queue")
    assert queue["queue"]["total"] == 0 and queue["queue"]["running"] == 0
    stats = {u["name"]: u for u in queue["fair_share"]["user_stats"]}
    assert stats["carol"]["recent_tokens"] == charged  # (deficits are shown relative to the pool's reference)

    records = await d.admin("GET", "/admin/decisions?user=carol&limit=50")
    assert len(records) == n
    used = Counter(r["selected_backend"] for r in records)
    assert set(used) == set(NAMES), used
    assert all(r["model"] == MODEL and r["user_group"] == "staff" and r["attempt"] == 1 for r in records)
    assert sum(r["queue_wait"] > 0 for r in records) >= n - 2 * SLOTS
    assert {rid for r in records for rid in r["candidate_backends"]} == {rows[name]["id"] for name in NAMES}

    rows = {r["name"]: r for r in await d.admin("GET", "/admin/backends")}
    for name in NAMES:
        assert rows[name]["engine"] == "llamacpp" and rows[name]["status"] == "healthy"
        assert rows[name]["completed"] == used[name] and rows[name]["in_flight"] == 0
        probe = d.registry.by_name(name).probe  # the llamacpp adapter read the server's /slots and /metrics
        assert probe.slots_total == SLOTS and probe.completion_tokens_total is not None
    await client.close()
    d.scheduler.check()


async def _all_busy(servers: list[LlamaServer]) -> bool:
    counts = await asyncio.gather(*(s.busy_slots() for s in servers))
    return all(c == SLOTS for c in counts)


async def test_a_client_leaving_mid_stream_frees_the_servers_slot(pool):
    d = pool.daemon
    key = await d.user("dora")
    servers = list(pool.servers.values())
    tokens = 1900  # about a second of generation; a slot's context is 2048
    before = sum([await s.metric("llamacpp:tokens_predicted_total") for s in servers])
    body = {"model": MODEL, "messages": MESSAGES, "stream": True, "max_tokens": tokens, **EXACT}
    async with (
        aiohttp.ClientSession() as session,
        session.post(d.url + "/v1/chat/completions", json=body, headers=pool.key_headers(key)) as resp,
    ):
        assert resp.status == 200
        seen = 0
        async for line in resp.content:
            if line.startswith(b"data: {"):
                seen += 1
                if seen == 20:
                    break
        assert sum([await s.busy_slots() for s in servers]) == 1  # still generating for us
    # leaving the block closes the connection mid-stream
    took = await until(lambda: _all_idle(servers), "no slot is_processing", timeout=5)
    predicted = sum([await s.metric("llamacpp:tokens_predicted_total") for s in servers]) - before
    print(f"slot freed {took:.3f} s after the client left; the server generated {predicted:.0f} of {tokens} tokens")
    assert predicted < tokens / 2, "the server kept generating after the client left"
    await until(lambda: d.scheduler.running_count == 0, "the daemon to free its slot", timeout=5)
    d.scheduler.check()
    # The pool still serves.
    client = oai(d, key)
    reply = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, extra_body=EXACT)
    assert reply.usage.completion_tokens == 5
    await client.close()


async def _all_idle(servers: list[LlamaServer]) -> bool:
    counts = await asyncio.gather(*(s.busy_slots() for s in servers))
    return sum(counts) == 0


async def test_one_server_killed_and_traffic_continues_on_the_other(pool):
    d = pool.daemon
    key = await d.user("erin")
    client = oai(d, key)
    victim, survivor = pool.servers[NAMES[0]], pool.servers[NAMES[1]]
    tokens, before_kill, after_kill = 200, 12, 40
    replies: list[Any] = []
    errors: list[BaseException] = []
    killed_at: list[float] = []

    async def worker() -> None:
        while len(replies) + len(errors) < before_kill + after_kill:
            try:
                replies.append(
                    await client.chat.completions.create(
                        model=MODEL, messages=MESSAGES, max_tokens=tokens, extra_body=EXACT
                    )
                )
            except Exception as exc:
                errors.append(exc)
            if len(replies) >= before_kill and not killed_at:
                killed_at.append(time.time())
                victim.kill()  # SIGKILL while the other workers have requests in flight

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(2 * SLOTS))), 60)
    assert killed_at and not victim.alive()
    assert not errors, errors
    assert all(r.usage.completion_tokens == tokens for r in replies)

    await until(lambda: _status(d, NAMES[0], "unhealthy"), f"{NAMES[0]} to be unhealthy", timeout=5)
    rows = {r["name"]: r for r in await d.admin("GET", "/admin/backends")}
    assert rows[NAMES[0]]["healthy"] is False and rows[NAMES[0]]["error"]
    assert rows[NAMES[1]]["status"] == "healthy"

    records = await d.admin("GET", "/admin/decisions?user=erin&limit=500")
    late = [r for r in records if r["wall_time"] > killed_at[0] + 1.0]  # once the probes have noticed
    retried = [r for r in records if r["attempt"] > 1]
    print(
        f"{len(replies)} replies; retries after the kill went to", dict(Counter(r["selected_backend"] for r in retried))
    )
    assert len(late) >= 3, len(late)  # how many fall after the first second depends on the machine's speed
    assert {r["selected_backend"] for r in late} == {NAMES[1]}
    # And still: one more, after the dust settled.
    reply = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, extra_body=EXACT)
    assert reply.usage.completion_tokens == 3
    await until(lambda: _idle(survivor), f"{NAMES[1]}'s slots to be free", timeout=30)
    await client.close()
    d.scheduler.check()


async def test_requests_in_flight_on_a_killed_server_are_retried_on_the_other(pool):
    """Non-streaming answers have sent no byte when a server dies under them: the daemon retries them."""
    d = pool.daemon
    key = await d.user("fred")
    client = oai(d, key)
    victim = pool.servers[NAMES[0]]
    tokens = 1500  # about a second at 4 streams on this machine
    tasks = [
        asyncio.create_task(
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=tokens, extra_body=EXACT)
        )
        for _ in range(2 * SLOTS)
    ]
    await until(lambda: _all_busy(list(pool.servers.values())), "both servers busy on all slots", timeout=10)
    victim.kill()  # two of the four die with it; the survivor stays full for about a second
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    errors = [r for r in results if isinstance(r, BaseException)]
    records = await d.admin("GET", "/admin/decisions?user=fred&limit=50")
    attempts = [
        (r["request_id"], r["attempt"], r["selected_backend"]) for r in sorted(records, key=lambda r: r["time"])
    ]
    assert not errors, (errors, attempts)
    assert all(r.usage.completion_tokens == tokens for r in results)
    last = {rid: backend for rid, _, backend in attempts}  # each request's final attempt
    retried = {rid for rid, attempt, _ in attempts if attempt > 1}
    assert len(retried) == SLOTS and {last[rid] for rid in retried} == {NAMES[1]}, attempts
    await client.close()
    d.scheduler.check()


async def _idle(server: Any) -> bool:
    """No slot busy; a /slots answer slower than its timeout (llama-server queues it) counts as not yet."""
    try:
        return await server.busy_slots() == 0
    except (TimeoutError, aiohttp.ClientError):
        return False


async def _status(d: Any, name: str, status: str) -> bool:
    rows = {r["name"]: r for r in await d.admin("GET", "/admin/backends")}
    return rows[name]["status"] == status


SHARE_SECONDS = 30.0
SHARE_WARMUP = 3.0


async def test_weights_3_2_1_saturating_two_servers_get_50_33_17(pool):
    d = pool.daemon
    users = {"fac": ("faculty", 3), "stf": ("staff", 2), "stu": ("student", 1)}
    keys = {name: await d.user(name, group) for name, (group, _) in users.items()}
    tokens = {name: 0 for name in users}
    requests = {name: 0 for name in users}
    start = time.monotonic()
    stop = start + SHARE_SECONDS

    async def worker(name: str) -> None:
        client = oai(d, keys[name])
        while time.monotonic() < stop:
            reply = await client.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=150, extra_body=EXACT
            )
            assert reply.usage.completion_tokens == 150
            if time.monotonic() - start > SHARE_WARMUP:
                tokens[name] += reply.usage.prompt_tokens + reply.usage.completion_tokens
                requests[name] += 1
        await client.close()

    await asyncio.wait_for(asyncio.gather(*(worker(name) for name in users for _ in range(6))), SHARE_SECONDS + 30)
    total = sum(tokens.values())
    shares = {name: tokens[name] / total for name in users}
    elapsed = time.monotonic() - start - SHARE_WARMUP
    print(
        "shares",
        {k: round(v * 100, 1) for k, v in shares.items()},
        "tokens",
        total,
        "requests",
        requests,
        f"{total / elapsed:.0f} tokens/s",
    )
    rows = {r["name"]: r for r in await d.admin("GET", "/admin/backends")}
    assert all(rows[name]["completed"] > 0 and rows[name]["status"] == "healthy" for name in NAMES), rows
    for name, (_, weight) in users.items():
        assert abs(shares[name] - weight / 6) < 0.05, shares
    d.scheduler.check()


SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


async def test_structured_output_and_tools_reach_the_server_in_both_dialects(pool):
    """A JSON schema is enforced by the server's grammar whichever dialect asks; tools are accepted and routed.

    The random-weight model never chooses to call a tool, so for tools this checks the request shape gets
    through to a real server and is answered and charged, not a tool call.
    """
    d = pool.daemon
    key = await d.user("erin", "student")
    client = oai(d, key)
    reply = await client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=80,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}},
    )
    assert json.loads(reply.choices[0].message.content)["answer"] in ("yes", "no")
    charged = reply.usage.prompt_tokens + reply.usage.completion_tokens

    olla = ollama.AsyncClient(host=d.url, headers=pool.key_headers(key))
    answer = await olla.chat(model=MODEL, messages=MESSAGES, format=SCHEMA, options={"num_predict": 80})
    assert json.loads(answer.message.content)["answer"] in ("yes", "no")
    charged += answer.prompt_eval_count + answer.eval_count

    reply = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, tools=TOOLS)
    assert reply.choices[0].finish_reason in ("length", "stop", "tool_calls") and reply.usage.completion_tokens <= 5
    charged += reply.usage.prompt_tokens + reply.usage.completion_tokens
    answer = await olla.chat(model=MODEL, messages=MESSAGES, tools=TOOLS, options={"num_predict": 5})
    assert answer.done and answer.eval_count <= 5
    charged += answer.prompt_eval_count + answer.eval_count

    assert served_cost(d, "erin") == charged
    records = await d.admin("GET", "/admin/decisions?user=erin&limit=10")
    assert [r["outcome"] for r in records] == ["ok"] * 4
    await client.close()
    d.scheduler.check()


async def test_embeddings_answer_in_both_dialects(pool):
    """scripts/llama-server.sh starts the server with ``--embeddings --pooling mean`` (issue 21), so a RAG
    client's first call, an embedding, is answered through mindrouter in both dialects, and chat still is."""
    d = pool.daemon
    key = await d.user("faye", "student")
    out = await oai(d, key).embeddings.create(model=MODEL, input=["the lab cluster", "a second text"])
    sizes = {len(item.embedding) for item in out.data}
    assert len(out.data) == 2 and len(sizes) == 1 and sizes.pop() > 0, out
    assert out.usage.prompt_tokens > 0
    client = ollama.AsyncClient(host=d.url, headers=pool.key_headers(key))
    res = await client.embed(model=MODEL, input="the lab cluster")
    assert len(res.embeddings) == 1 and len(res.embeddings[0]) == len(out.data[0].embedding)
    reply = await oai(d, key).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, extra_body=EXACT)
    assert reply.usage.completion_tokens == 8
