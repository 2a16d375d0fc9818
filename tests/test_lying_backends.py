"""Backends that lie (issue 19 item 7): bogus counts, endless lines, answers past max_tokens, escape codes.

Each test runs the real daemon against a fake that tells one lie, then checks
the targets: the pool keeps serving, no share moves, no usage row is lost, no
score leaves its cap, and the lie is logged once, not per request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from typing import Any

import pytest

from mindrouter.daemon.edge.services import SERVICES
from mindrouter.scheduler import TOKEN_LIMIT

from .conftest import Daemon
from .fakes import FakeOllama, FakeOpenAI, Raw
from .test_request_path import auth

CHAT = "/v1/chat/completions"


def strict(text: str) -> Any:
    """JSON as a strict parser reads it: a bare NaN or Infinity is an error."""

    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


async def make_daemon(new_daemon: Any, **backends: Any) -> Daemon:
    """A daemon that polls its backends only when told (so a lie is read by requests, not probes)."""
    return await new_daemon(backends={"poll_interval": 60, **backends})


def chat(stream: bool, max_tokens: int | None = 8, model: str = "llama3") -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hello"}], "stream": stream}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


async def usage_rows(d: Daemon) -> list[tuple[int, int]]:
    """(prompt, completion) of every usage row written, once the pending group commit is in."""
    d.app[SERVICES].usage.write()
    rows = (
        d.app[SERVICES].store._db.execute("SELECT prompt_tokens, completion_tokens FROM usage ORDER BY id").fetchall()
    )
    return [tuple(r) for r in rows]


async def assert_books_sane(d: Daemon) -> None:
    """The share and queue views are strict JSON with finite numbers; the backends' learned rates are sane."""
    for path in ("/admin/share", "/admin/queue", "/admin/backends"):
        resp = await d.client.get(path, headers=auth("test-admin-key"))
        assert resp.status == 200
        strict(await resp.text())
    for user in d.scheduler.share(time.monotonic()).users:
        assert math.isfinite(user.deficit) and math.isfinite(user.recent_tokens)
    for bid in d.registry.entries:
        load = d.scheduler.load(bid)
        tps = load.tokens_per_second
        assert tps is None or (math.isfinite(tps) and 0 <= tps < 1e7), tps


LIES = [
    ("eval_count", Raw("1e400")),
    ("eval_count", Raw("NaN")),
    ("eval_count", -1_000_000),
    ("eval_count", 10**29),
    ("eval_count", "12"),
    ("prompt_eval_count", Raw("-Infinity")),
    ("eval_count", 5_000_000),  # in range, but more tokens than the answer had bytes
]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize(("field", "value"), LIES, ids=[f"{f}={v!r}" for f, v in LIES])
async def test_an_ollama_count_that_is_not_believable_is_dropped(new_daemon, stream, field, value, caplog):
    d = await make_daemon(new_daemon)
    async with FakeOllama(models=["llama3"]) as liar:
        liar.usage_lies = {field: value}
        await d.backend("liar", liar.url, "ollama")
        alice, bob = await d.user("alice"), await d.user("bob")
        with caplog.at_level(logging.WARNING, logger="mindrouter.reported"):
            for path in ("/api/chat", CHAT, "/api/chat"):  # passthrough and translated; the same lie twice
                resp = await d.client.post(path, json=chat(stream), headers=auth(alice))
                assert resp.status == 200, await resp.text()
                text = await resp.text()
                assert "error" not in text and ("Infinity" not in text or path == "/api/chat")
        warned = [r for r in caplog.records if "not a believable value" in r.getMessage()]
        assert len(warned) == 1  # once per backend, not per request
        assert field in warned[0].getMessage() or "_tokens=5000000" in warned[0].getMessage()
        rows = await usage_rows(d)
        assert len(rows) == 3  # no usage row lost
        for prompt, completion in rows:
            assert 0 <= prompt < 100 and 0 <= completion <= 16, rows  # the daemon's estimate, not the lie
        await assert_books_sane(d)
        # The pool keeps serving another user at once.
        resp = await d.client.post("/api/chat", json=chat(False), headers=auth(bob))
        assert resp.status == 200
        me = await (await d.client.get("/v1/me", headers=auth(alice))).json()
        assert 0 <= me["today"]["completion_tokens"] <= 48


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("value", [-1_000_000, "12", Raw("1e400"), 10**29, True], ids=repr)
async def test_an_openai_count_that_is_not_believable_is_dropped(new_daemon, stream, value):
    d = await make_daemon(new_daemon)
    async with FakeOpenAI(flavor="vllm", models=["llama3"]) as liar:
        liar.usage_lies = {"completion_tokens": value}
        await d.backend("liar", liar.url, "vllm")
        key = await d.user("alice")
        for path in (CHAT, "/api/chat"):
            resp = await d.client.post(path, json=chat(stream), headers=auth(key))
            assert resp.status == 200, await resp.text()  # a string count is no 503
            assert "error" not in await resp.text()
        for prompt, completion in await usage_rows(d):
            assert 0 <= prompt < 100 and 0 <= completion <= 16
        await assert_books_sane(d)


async def test_a_negative_count_credits_nobody_and_takes_no_other_backends_traffic(new_daemon):
    """The issue's case: a negative eval_count moved its user's deficit up by a million and made the liar's
    throughput term 596.7 (capped at 20), so it took another model's requests from the good backend."""
    d = await make_daemon(new_daemon)
    async with FakeOllama(models=["llama3", "mistral"]) as liar, FakeOllama(models=["mistral"]) as good:
        liar.usage_lies = {"eval_count": -1_000_000}
        await d.backend("liar", liar.url, "ollama")
        await d.backend("good", good.url, "ollama", priority=100)  # more than honest terms can make up
        alice, bob = await d.user("alice"), await d.user("bob")
        for _ in range(5):
            assert (await d.client.post("/api/chat", json=chat(False), headers=auth(alice))).status == 200
        deficits = {u.name: u.deficit for u in d.scheduler.share(time.monotonic()).users}
        assert abs(deficits["alice"]) < 1000, deficits  # was +1,000,227: credited a million tokens
        for _ in range(10):
            body = chat(False, model="mistral")
            assert (await d.client.post("/api/chat", json=body, headers=auth(bob))).status == 200
        assert good.requests == 10 and liar.requests == 5  # the liar's lie won it none of bob's requests
        assert d.scheduler.load(d.registry.by_name("liar").row.id).tokens_per_second is None


async def test_one_unbelievable_row_never_takes_its_batch_with_it(tmp_path):
    from mindrouter.store import Store

    with Store(tmp_path / "s.db") as store:
        group = store.list_groups()[0].name if store.list_groups() else store.add_group("g", 1).name
        user = store.add_user("alice", group)
        good = (user.id, "r1", "m", None, 5, 7, time.time(), 0.1, group)
        rows = [
            good,
            (user.id, "r2", "m", None, 5, 10**29, time.time(), 0.1, group),  # past SQLite's 64-bit integers
            (user.id, "r3", "m", None, 5, 7, time.time(), math.nan, group),
            (user.id, "r4", "m", None, "12", 7, time.time(), 0.1, group),
            (user.id, "r5", "m", None, 1, 2, time.time(), 0.2, group),
        ]
        store.record_usages(rows)
        kept = store._db.execute(
            "SELECT request_id, prompt_tokens, completion_tokens, gpu_seconds FROM usage"
        ).fetchall()
        by_id = {r[0]: r[1:] for r in kept}
        assert by_id["r1"] == (5, 7, 0.1) and by_id["r5"] == (1, 2, 0.2)
        assert all(0 <= p <= TOKEN_LIMIT and 0 <= c <= TOKEN_LIMIT and math.isfinite(g) for p, c, g in by_id.values())


@pytest.mark.parametrize("after", [0, 3], ids=["before-the-first-byte", "mid-stream"])
async def test_a_line_that_never_ends_is_cut_and_its_memory_stays_bounded(new_daemon, after):
    d = await make_daemon(new_daemon, max_line_bytes=1 << 20)
    async with FakeOllama(models=["llama3"]) as liar:
        liar.endless_line = after
        await d.backend("liar", liar.url, "ollama")
        key = await d.user("alice")
        started = time.monotonic()
        resp = await asyncio.wait_for(d.client.post("/api/chat", json=chat(True), headers=auth(key)), 10)
        text = await asyncio.wait_for(resp.text(), 10)
        assert "a line longer than 1048576 bytes" in text.splitlines()[-1]
        assert time.monotonic() - started < 10
        if after:  # what came before reached the client, and is charged
            assert resp.status == 200 and text.count('"done":false') == after
            [(_, completion)] = await usage_rows(d)
            assert completion == after
        else:  # nothing reached the client: nothing to charge, and nobody's answer to end
            assert resp.status == 503
        entry = d.registry.by_name("liar")
        assert entry.failures == 0 and d.registry.healthy(entry)  # cut by the daemon: not a breaker count
        assert d.scheduler.running_count == 0
        liar.endless_line = None
        assert (await d.client.post("/api/chat", json=chat(False), headers=auth(key))).status == 200


@pytest.mark.parametrize("path", ["/api/chat", CHAT])
async def test_an_answer_past_max_tokens_is_cut_and_charged_for_what_was_delivered(new_daemon, path):
    d = await make_daemon(new_daemon)
    async with FakeOllama(models=["llama3"], completion_tokens=5000) as liar:
        liar.ignore_limits = True
        await d.backend("liar", liar.url, "ollama")
        key = await d.user("alice")
        body = chat(True, max_tokens=8) if path == CHAT else dict(chat(True, None), options={"num_predict": 8})
        resp = await d.client.post(path, json=body, headers=auth(key))
        text = await resp.text()
        assert resp.status == 200 and "max_tokens allows" in text
        assert text.count("tok") < 60  # 8 asked, 8 + 2 + 32 allowed
        [(_, completion)] = await usage_rows(d)
        assert 8 <= completion <= 42  # what was delivered
        assert d.scheduler.running_count == 0


async def test_a_stream_that_never_falls_silent_is_cut_at_the_total_limit(new_daemon):
    d = await make_daemon(new_daemon, stream_timeout=0.5)
    async with FakeOllama(models=["llama3"], completion_tokens=100_000, tokens_per_second=100) as slow:
        await d.backend("slow", slow.url, "ollama")
        key = await d.user("alice")
        started = time.monotonic()
        resp = await d.client.post("/api/chat", json=chat(True, max_tokens=None), headers=auth(key))
        text = await resp.text()
        assert "0.5 s a stream may take" in text.splitlines()[-1]
        assert time.monotonic() - started < 15  # not the 1,000 s the stream would run
        [(_, completion)] = await usage_rows(d)
        assert 10 <= completion <= 200  # charged for what was delivered


def test_an_agents_readings_out_of_range_read_as_unknown(caplog):
    from mindrouter.gpu.probe import readings_from_json

    lies = {"index": 0, "memory_free": -5, "memory_total": 10**30, "power_w": math.nan, "utilization_gpu": 250}
    with caplog.at_level(logging.WARNING, logger="mindrouter.reported"):
        readings = readings_from_json([dict(lies, temperature_c=55)] * 2, "http://ws9:9100")
    for reading in readings:
        assert (reading.memory_free, reading.memory_total, reading.power_w, reading.utilization_gpu) == (None,) * 4
        assert reading.temperature_c == 55
    warned = [r.getMessage() for r in caplog.records if "ws9" in r.getMessage()]
    assert len(warned) == 4  # one per field, not one per reading


def test_metrics_that_are_not_believable_read_as_unknown():
    """``int(+Inf)`` raised OverflowError in a vLLM poll, so a lying /metrics crashed the probe."""
    from mindrouter.backends._prometheus import Samples
    from mindrouter.backends.probe import Reply

    text = (
        b"vllm:num_requests_running +Inf\nvllm:num_requests_waiting -3\n"
        b"vllm:kv_cache_usage_perc NaN\nvllm:prompt_tokens_total 12\n"
    )
    m = Samples(Reply(200, text), ("vllm:",), "http://liar:8000")
    assert m.count("vllm:num_requests_running") is None and m.count("vllm:num_requests_waiting") is None
    assert m.highest("vllm:kv_cache_usage_perc") is None and m.count("vllm:prompt_tokens_total") == 12
