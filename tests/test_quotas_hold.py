"""Quotas that hold: 50 requests at once never take a quota past its limit by more than one answer.

Admission reserves what a request may use (its ``max_tokens``, or a typical answer), within
what is left of the quota, and settles at the end; a request that cannot fit is refused.
"""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from mindrouter.daemon.edge.services import SERVICES

from .harness import Daemon, until
from .inprocess import InProcess

pytestmark = pytest.mark.asyncio

PROMPT = [{"role": "user", "content": "one two three"}]  # 3 tokens as the backend counts them
LIMIT = 10_000


def client(daemon: Daemon, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{daemon.url}/v1", api_key=key, max_retries=0)


async def burst(daemon: Daemon, keys: list[str], n: int, **body) -> tuple[int, int, list[str]]:
    """Send ``n`` chat requests at once, spread over ``keys``; (answered, completion tokens, refusals)."""
    clients = [client(daemon, k) for k in keys]

    async def one(i: int) -> tuple[int, str | None]:
        try:
            answer = await clients[i % len(clients)].chat.completions.create(model="llama3", messages=PROMPT, **body)
        except openai.RateLimitError as exc:
            return 0, exc.body["message"] if isinstance(exc.body, dict) else str(exc)
        assert answer.usage is not None
        return answer.usage.completion_tokens, None

    results = await asyncio.gather(*(one(i) for i in range(n)))
    for c in clients:
        await c.close()
    return sum(1 for t, _ in results if t), sum(t for t, _ in results), [m for _, m in results if m]


def said_why(refusal: str) -> bool:
    """A refusal names what holds the quota: its reset, or the requests in flight that reserve the rest."""
    return any(why in refusal for why in ("try again after the reset", "running now", "your requests in flight"))


async def used_today(daemon: Daemon, subject: str, name: str) -> int:
    """What counts against the quota today: tokens used and those reserved by requests in flight."""
    limits = daemon.app[SERVICES].quotas.overview()
    return next(q.used + q.reserved for q in limits if q.subject == subject and q.name == name)


async def fifty_slots_and_a_quota(daemon: Daemon, backend: InProcess, subject: str) -> list[str]:
    """A backend with 50 slots, and the keys of one user with a LIMIT quota, or two sharing their group's."""
    await daemon.backend("b1", backend, max_concurrent=50)
    await daemon.admin("POST", "/admin/groups", {"name": "lab", "weight": 1})
    keys = [await daemon.user(f"u{i}", "lab") for i in range(1 if subject == "user" else 2)]
    path = "/admin/users/u0/quota" if subject == "user" else "/admin/groups/lab/quota"
    await daemon.admin("PUT", path, {"tokens_per_day": LIMIT})
    return keys


@pytest.mark.parametrize("subject", ["user", "group"])
@pytest.mark.parametrize("answer", [200, 2000])
async def test_fifty_at_once_overshoot_a_quota_by_at_most_one_answer(daemon, subject, answer):
    fake = InProcess(models=("llama3",), tokens_per_second=answer * 2, completion_tokens=answer)
    keys = await fifty_slots_and_a_quota(daemon, fake, subject)
    answered, completion, refusals = await burst(daemon, keys, 50, max_tokens=answer)
    total = answered * 3 + completion
    used = await used_today(daemon, subject, "u0" if subject == "user" else "lab")
    print(f"{subject} quota {LIMIT}, answers of {answer}: {answered} of 50 answered, {total} tokens")
    assert used == total
    assert total <= LIMIT + 3 + answer  # at most one request's answer beyond the limit
    assert answered >= LIMIT // (3 + answer)  # and the quota is used, not refused early
    assert all(said_why(m) for m in refusals), refusals


async def test_a_request_that_cannot_fit_is_refused_saying_so_and_settles_at_the_end(daemon):
    fake = InProcess(models=("llama3",), completion_tokens=100, held=True)
    await daemon.backend("b1", fake, max_concurrent=4)
    key = await daemon.user("ann")
    await daemon.admin("PUT", "/admin/users/ann/quota", {"tokens_per_day": 250})
    ann = client(daemon, key)
    running = asyncio.create_task(ann.chat.completions.create(model="llama3", messages=PROMPT, max_tokens=100))
    await until(lambda: fake.in_flight == 1, "the first request should run")
    # 104 reserved (the daemon estimates 4 prompt tokens); the next too: 42 left, too few for 60 words.
    second = asyncio.create_task(ann.chat.completions.create(model="llama3", messages=PROMPT, max_tokens=100))
    await until(lambda: fake.in_flight == 2, "the second request should run")
    long_prompt = [{"role": "user", "content": " ".join(["word"] * 60)}]
    with pytest.raises(openai.RateLimitError) as refused:
        await ann.chat.completions.create(model="llama3", messages=long_prompt, max_tokens=5)
    message = refused.value.body["message"]  # type: ignore[index]
    assert "user 'ann' has 42 of the 250 tokens a day its quota allows left" in message, message
    assert "wait for them to finish" in message and message.count(".") <= 1
    fake.open_gate()
    await asyncio.gather(running, second)
    # Settled: only the real tokens count now (2 x 103).
    assert await used_today(daemon, "user", "ann") == 206
    await ann.close()


async def test_requests_per_minute_survives_a_restart(new_daemon):
    fake = InProcess(models=("llama3",), completion_tokens=8)
    d = await new_daemon()
    key = await d.user("alice")
    await d.backend("b1", fake)
    await d.admin("PUT", "/admin/users/alice/quota", {"requests_per_minute": 5})
    answered, _, _ = await burst(d, [key], 3, max_tokens=2)
    assert answered == 3
    await d.client.close()
    began = time.monotonic()
    d2 = await new_daemon(inprocess=[fake])  # on the same state
    answered, _, refusals = await burst(d2, [key], 5, max_tokens=2)
    assert time.monotonic() - began < 30
    assert answered == 2 and len(refusals) == 3, refusals  # 3 before the restart + 2 after = 5
    assert "sent 5 requests in the last minute" in refusals[0]


async def test_a_stream_longer_than_its_reservation_grows_it_as_it_streams(daemon):
    """No ``max_tokens``: a typical answer (256) is reserved, and the answer counts as it streams past that."""
    fake = InProcess(models=("llama3",), completion_tokens=1200, tokens_allowed=100)
    await daemon.backend("b1", fake)
    key = await daemon.user("ann")
    await daemon.admin("PUT", "/admin/users/ann/quota", {"tokens_per_day": 100_000})
    ann = client(daemon, key)
    stream = await ann.chat.completions.create(model="llama3", messages=PROMPT, stream=True)
    seen, counted = 0, []
    steps = {100: 600, 600: 1100, 1100: None}  # the backend holds at each count until it is read
    async for _ in stream:
        seen += 1
        if seen in steps:
            counted.append(await used_today(daemon, "user", "ann"))
            fake.allow_tokens(steps[seen])
    assert counted[0] == 4 + 256  # the reservation
    assert 500 < counted[1] < counted[2] <= 4 + 1200  # then what has streamed (charged every 32 chunks)
    assert await used_today(daemon, "user", "ann") == 3 + 1200  # settled: the backend's counts
    await ann.close()


async def streams(daemon: Daemon, keys: list[str], n: int) -> tuple[int, list[str]]:
    """``n`` streams at once without ``max_tokens``; (chunks received in all, the errors they ended with)."""
    clients = [client(daemon, k) for k in keys]

    async def one(i: int) -> tuple[int, str | None]:
        got = 0
        try:
            stream = await clients[i % len(clients)].chat.completions.create(
                model="llama3", messages=PROMPT, stream=True
            )
            async for chunk in stream:
                got += bool(chunk.choices and chunk.choices[0].delta.content)
        except openai.RateLimitError:
            return 0, None  # refused before it began
        except openai.APIError as exc:  # the stream's error event
            return got, exc.message
        return got, None

    results = await asyncio.gather(*(one(i) for i in range(n)))
    for c in clients:
        await c.close()
    return sum(g for g, _ in results), [m for _, m in results if m]


@pytest.mark.parametrize("subject", ["user", "group"])
async def test_fifty_streams_without_max_tokens_stop_at_the_quota(daemon, subject):
    """No ``max_tokens`` (as Open WebUI sends): each reserves a typical answer (256 tokens), and one that
    grows past its reservation while the quota is spent is ended with the quota's reason."""
    fake = InProcess(models=("llama3",), tokens_per_second=4000, completion_tokens=2000)
    keys = await fifty_slots_and_a_quota(daemon, fake, subject)
    delivered, cut = await streams(daemon, keys, 50)
    used = await used_today(daemon, subject, "u0" if subject == "user" else "lab")
    print(f"{subject} quota {LIMIT}, 50 streams of 2000 without max_tokens: {delivered} delivered, {used} used")
    assert used <= LIMIT + 2000  # at most one answer beyond the limit
    assert cut and all("its quota allows" in m and "max_tokens" in m for m in cut), cut
    assert delivered <= used  # every token delivered is charged


async def test_the_ollama_client_sees_why_its_stream_stopped(daemon):
    """Ollama's dialect: the cut stream ends with an ``{"error": ...}`` line, which the ollama client raises."""
    import ollama

    fake = InProcess(models=("llama3",), tokens_per_second=2000, completion_tokens=2000)
    await daemon.backend("b1", fake)
    key = await daemon.user("ann")
    await daemon.admin("PUT", "/admin/users/ann/quota", {"tokens_per_day": 1000})
    client = ollama.AsyncClient(host=daemon.url, headers={"Authorization": f"Bearer {key}"})
    got = 0
    with pytest.raises(ollama.ResponseError) as cut:
        async for part in await client.chat(model="llama3", messages=PROMPT, stream=True):
            got += bool(part.message.content)
    assert "its quota allows" in cut.value.error and "max_tokens" in cut.value.error, cut.value.error
    used = await used_today(daemon, "user", "ann")
    assert got <= used - 3 and used <= 1000, (got, used)  # charged what it delivered, within the quota


@pytest.mark.parametrize("subject", ["user", "group"])
@pytest.mark.parametrize("answer", [200, 2000])
async def test_fifty_whole_answers_without_max_tokens_hold_the_quota(daemon, subject, answer):
    """Issue 19: non-streamed requests naming no ``max_tokens`` each reserved a typical answer (256) and, known
    only at their end, passed it together. Now each reserves a share of what is left and is capped there."""
    fake = InProcess(models=("llama3",), tokens_per_second=answer * 2, completion_tokens=answer)
    keys = await fifty_slots_and_a_quota(daemon, fake, subject)
    answered, completion, refusals = await burst(daemon, keys, 50)
    used = await used_today(daemon, subject, "u0" if subject == "user" else "lab")
    print(f"{subject} quota {LIMIT}, 50 whole answers of {answer}, no max_tokens: {answered} answered, {used} used")
    assert used == answered * 3 + completion
    assert used <= LIMIT + 3 + answer, used  # at most one request's answer beyond the limit
    caps = [r["max_tokens"] for r in fake.received]
    assert len(caps) == answered and sum(caps) + 3 * answered <= LIMIT, caps  # the caps share what was left
    assert answered >= 10 and all(said_why(m) for m in refusals), refusals


async def test_a_whole_answer_without_max_tokens_is_capped_where_its_quota_share_ends_in_both_dialects(daemon):
    fake = InProcess(models=("llama3",), completion_tokens=5000)
    await daemon.backend("b1", fake)
    key = await daemon.user("ann")
    await daemon.admin("PUT", "/admin/users/ann/quota", {"tokens_per_day": 8004})
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": "llama3", "messages": PROMPT, "stream": False}
    resp = await daemon.client.post("/api/chat", json=body, headers=headers)
    whole = await resp.json()
    assert resp.status == 200 and whole["eval_count"] == 1000 and whole["done_reason"] == "length"
    assert resp.headers["X-Quota-Max-Tokens"] == "1000"  # an eighth of the 8,000 left after the prompt (4)
    resp = await daemon.client.post("/v1/chat/completions", json=body, headers=headers)
    whole = await resp.json()
    assert whole["usage"]["completion_tokens"] == 1000 and whole["choices"][0]["finish_reason"] == "length"
    assert fake.received[-1]["max_tokens"] == 1000  # ann's usual answer now, over 7,001 / 8
    resp = await daemon.client.post("/v1/chat/completions", json={**body, "stream": True}, headers=headers)
    assert resp.status == 200 and "X-Quota-Max-Tokens" not in resp.headers  # a stream is cut as it goes
    await resp.read()
