"""Numbers a client sends are bounded where the body is read (issue 19 item 1).

A ``max_tokens`` of a 1 followed by 400 zeros passed validation and raised
``OverflowError`` inside the dispatcher's pump: behind a busy slot another
user's finished answer came back as a 500, a slot leaked and every later
request timed out. Here every numeric field of every route is refused with a
400 naming the field, the core refuses such a job itself, and the pool keeps
serving.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindrouter.backends.call import Call
from mindrouter.errors import RequestError
from mindrouter.scheduler import TOKEN_LIMIT, Backend, Job, Scheduler

from .harness import until
from .inprocess import InProcess

HUGE = 10**400

# (path, body without the number, where the number goes, the field the error must name)
FIELDS: list[tuple[str, dict[str, Any], tuple[str, ...], str]] = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, ("max_tokens",), "max_tokens"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}]},
        ("max_completion_tokens",),
        "max_completion_tokens",
    ),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, ("temperature",), "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, ("top_p",), "top_p"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, ("n",), "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, ("seed",), "seed"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}]},
        ("presence_penalty",),
        "presence_penalty",
    ),
    ("/v1/completions", {"prompt": "hi"}, ("max_tokens",), "max_tokens"),
    ("/v1/responses", {"input": "hi"}, ("max_output_tokens",), "max_output_tokens"),
    ("/v1/embeddings", {"input": "hi"}, ("dimensions",), "dimensions"),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}, ("options", "num_predict"), "num_predict"),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}, ("options", "num_ctx"), "num_ctx"),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}, ("options", "temperature"), "temperature"),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}, ("options", "top_k"), "top_k"),
    ("/api/generate", {"prompt": "hi"}, ("options", "num_predict"), "num_predict"),
    ("/api/generate", {"prompt": "hi"}, ("options", "seed"), "seed"),
    ("/api/embed", {"input": "hi"}, ("options", "num_ctx"), "num_ctx"),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}, ("keep_alive",), "keep_alive"),
]


def with_number(base: dict[str, Any], where: tuple[str, ...], value: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "llama3", **json.loads(json.dumps(base))}
    target = body
    for key in where[:-1]:
        target = target.setdefault(key, {})
    target[where[-1]] = value
    return body


def raw(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()  # json writes 10**400 as its 401 digits, as a client would


@pytest.mark.parametrize(("path", "base", "where", "field"), FIELDS)
@pytest.mark.parametrize("value", [HUGE, -HUGE, 2**70, -1e300, 1e300])
def test_every_numeric_field_is_bounded_where_the_body_is_read(path, base, where, field, value):
    with pytest.raises(RequestError) as caught:
        Call.from_request(path, raw(with_number(base, where, value)))
    assert caught.value.status == 400
    assert f'"{field}"' in str(caught.value), str(caught.value)
    assert str(TOKEN_LIMIT) in str(caught.value) or field not in ("max_tokens", "num_ctx", "max_output_tokens")


@pytest.mark.parametrize(("path", "base", "where", "field"), FIELDS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_numbers_are_refused_as_not_json(path, base, where, field, value):
    with pytest.raises(RequestError) as caught:
        Call.from_request(path, raw(with_number(base, where, value)))  # json writes them Infinity, NaN
    assert caught.value.status == 400 and "finite" in str(caught.value)


def test_nan_and_infinity_are_not_json():
    for literal in (b"NaN", b"Infinity", b"-Infinity", b"1e999"):
        body = b'{"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "tools": [{"x": ' + literal
        with pytest.raises(RequestError) as caught:
            Call.from_request("/v1/chat/completions", body + b"}]}")
        assert caught.value.status == 400


def test_ordinary_numbers_pass():
    call = Call.from_request(
        "/v1/chat/completions",
        raw(
            with_number(
                {"messages": [{"role": "user", "content": "hi"}], "temperature": 0.7, "top_p": 1, "seed": -1},
                ("max_tokens",),
                TOKEN_LIMIT,
            )
        ),
    )
    assert call.max_tokens == TOKEN_LIMIT
    ollama = Call.from_request(
        "/api/chat",
        raw(
            with_number(
                {"messages": [], "options": {"temperature": 7, "num_ctx": 131072}}, ("options", "num_predict"), -2
            )
        ),
    )
    assert ollama.max_tokens is None and ollama.context_tokens == 131072


# -- the core refuses what the edge would have -------------------------------


def busy_core() -> Scheduler:
    s = Scheduler()
    s.set_backend(Backend(id=1, name="gpu", models=frozenset({"llama3"}), max_concurrent=1))
    s.set_user("alice", 1.0)
    s.set_user("bob", 1.0)
    assert s.submit(Job("bob-1", "bob", "llama3", 0.0, prompt_tokens=10, max_tokens=8), 0.0) is None
    assert [d.job.id for d in s.dispatch(0.0)] == ["bob-1"]
    return s


@pytest.mark.parametrize(
    "numbers",
    [
        {"max_tokens": HUGE},
        {"prompt_tokens": HUGE},
        {"context_tokens": HUGE},
        {"max_tokens": -5},
        {"prompt_tokens": -1},
        {"max_tokens": TOKEN_LIMIT + 1},
    ],
)
def test_the_core_refuses_a_job_with_numbers_out_of_range_and_keeps_serving(numbers):
    s = busy_core()
    rejection = s.submit(Job("alice-1", "alice", "llama3", 0.1, stream=False, **numbers), 0.1)
    assert rejection is not None and rejection.status == 400
    assert s.submit(Job("bob-2", "bob", "llama3", 0.2, prompt_tokens=10), 0.2) is None
    assert s.complete("bob-1", 1.0, prompt_tokens=10, completion_tokens=8)
    assert [d.job.id for d in s.dispatch(1.0)] == ["bob-2"]
    s.check()


@settings(max_examples=300, deadline=None)
@given(
    prompt=st.integers(-(10**30), 10**30) | st.just(HUGE),
    limit=st.none() | st.integers(-(10**30), 10**30) | st.just(HUGE),
    context=st.none() | st.integers(-(10**30), 10**30),
    stream=st.booleans(),
)
def test_property_no_job_numbers_break_the_core(prompt, limit, context, stream):
    s = busy_core()
    job = Job(
        "alice-1", "alice", "llama3", 0.1, prompt_tokens=prompt, max_tokens=limit, context_tokens=context, stream=stream
    )
    rejection = s.submit(job, 0.1)
    s.complete("bob-1", 1.0, prompt_tokens=10, completion_tokens=8)
    started = [d.job.id for d in s.dispatch(1.0)]
    assert started == ([] if rejection is not None else ["alice-1"])
    if rejection is None:
        s.complete("alice-1", 2.0, prompt_tokens=10, completion_tokens=3)
    s.check()
    view = s.share(2.0)
    assert all(math.isfinite(u.deficit) for u in view.users)


# -- through the daemon, behind a busy slot ----------------------------------


async def test_a_huge_number_behind_a_busy_slot_is_a_400_and_the_pool_keeps_serving(daemon):
    """The issue's run: bob's stream holds the only slot; alice's huge numbers must not touch it."""
    fake = InProcess(models=("llama3",), completion_tokens=20, held=True)
    await daemon.backend("b1", fake, max_concurrent=1)
    bob = {"Authorization": f"Bearer {await daemon.user('bob')}"}
    alice = {"Authorization": f"Bearer {await daemon.user('alice')}"}
    chat = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        running = asyncio.create_task(
            session.post(daemon.url + "/api/chat", json={**chat, "stream": False}, headers=bob)
        )
        await until(lambda: fake.in_flight == 1, "bob's request should hold the slot")
        answers = []
        for path, base, where, _field in FIELDS:
            async with session.post(daemon.url + path, data=raw(with_number(base, where, HUGE)), headers=alice) as resp:
                answers.append((path, resp.status, await resp.json()))
        assert [status for _, status, _ in answers] == [400] * len(FIELDS), answers
        assert all(
            isinstance(body.get("error"), str if path.startswith("/api/") else dict) for path, _, body in answers
        )
        fake.open_gate()
        resp = await running
        assert resp.status == 200
        assert (await resp.json())["eval_count"] == 20
        async with session.post(daemon.url + "/v1/chat/completions", json=chat, headers=alice) as resp:
            assert resp.status == 200, await resp.text()
    assert daemon.scheduler.running_count == 0 and daemon.scheduler.queued_count == 0
    daemon.scheduler.check()


def test_a_job_whose_start_raises_fails_alone_in_the_core():
    """Whatever makes one job's start raise (a bug, a value no check caught), the others go on."""
    s = busy_core()
    real = s.turns.fair.provisional_answer

    def broken(user, pool, job):
        if job.id == "alice-1":
            raise OverflowError("int too large to convert to float")
        return real(user, pool, job)

    s.turns.fair.provisional_answer = broken  # type: ignore[method-assign]
    assert s.submit(Job("alice-1", "alice", "llama3", 0.1, prompt_tokens=10), 0.1) is None
    assert s.submit(Job("bob-2", "bob", "llama3", 0.2, prompt_tokens=10), 0.2) is None
    assert s.complete("bob-1", 1.0, prompt_tokens=10, completion_tokens=8)
    assert [d.job.id for d in s.dispatch(1.0)] == ["bob-2"]
    assert [(job.id, type(exc)) for job, exc in s.take_unstartable()] == [("alice-1", OverflowError)]
    assert s.take_unstartable() == []
    assert s.queued_count == 0 and s.running_count == 1
    s.check()


async def test_a_job_whose_start_raises_is_a_500_for_its_sender_alone(daemon):
    """Issue 19: behind a busy slot, another user's answer came back a 500 and the slot leaked."""
    fake = InProcess(models=("llama3",), completion_tokens=20, held=True)
    await daemon.backend("b1", fake, max_concurrent=1)
    bob = {"Authorization": f"Bearer {await daemon.user('bob')}"}
    alice = {"Authorization": f"Bearer {await daemon.user('alice')}"}
    fair = daemon.scheduler.turns.fair
    real = fair.provisional_answer

    def broken(user, pool, job):
        if user.name == "alice":
            raise OverflowError("int too large to convert to float")
        return real(user, pool, job)

    fair.provisional_answer = broken
    chat = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    async with aiohttp.ClientSession() as session:
        running = asyncio.create_task(session.post(daemon.url + "/api/chat", json=chat, headers=bob))
        await until(lambda: fake.in_flight == 1, "bob's request should hold the slot")
        queued = asyncio.create_task(session.post(daemon.url + "/v1/chat/completions", json=chat, headers=alice))
        await until(lambda: daemon.scheduler.queued_count == 1, "alice's request should wait")
        fake.open_gate()
        resp = await running
        assert resp.status == 200 and (await resp.json())["eval_count"] == 20
        resp = await queued
        assert resp.status == 500 and (await resp.json())["error"]["type"] == "internal_error"
        fair.provisional_answer = real
        async with session.post(daemon.url + "/api/chat", json=chat, headers=bob) as resp:
            assert resp.status == 200
    assert daemon.scheduler.running_count == 0 and daemon.scheduler.queued_count == 0
    daemon.scheduler.check()
