"""Accounting through the daemon: usage reports, quotas (refusal, reset, restart), headers and /v1/me."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from mindrouter.daemon.edge.services import SERVICES
from mindrouter.localtime import next_day

from .harness import Daemon, until
from .inprocess import InProcess

pytestmark = pytest.mark.asyncio


def chat(max_tokens: int | None = 5, **extra) -> dict:
    body = {"model": "llama3", "messages": [{"role": "user", "content": "one two three"}], **extra}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


async def ask(daemon: Daemon, key: str, path: str = "/v1/chat/completions", **body):
    resp = await daemon.client.post(path, json=chat(**body), headers={"Authorization": f"Bearer {key}"})
    await resp.read()
    return resp


async def test_usage_report_by_user_and_model_with_gpu_seconds(daemon):
    fake = InProcess(models=("llama3", "qwen"), tokens_per_second=200, completion_tokens=8)
    await daemon.backend("b1", fake)
    alice = await daemon.user("alice", "staff")
    bob = await daemon.user("bob")
    for _ in range(2):
        assert (await ask(daemon, alice, max_tokens=5)).status == 200  # 3 prompt + 5 completion
    assert (await ask(daemon, bob, max_tokens=2, model="qwen")).status == 200
    report = await daemon.admin("GET", "/admin/usage?by=user,model")
    rows = {(r["user"], r["model"]): r for r in report["rows"]}
    assert {k: (r["requests"], r["prompt_tokens"], r["completion_tokens"]) for k, r in rows.items()} == {
        ("alice", "llama3"): (2, 6, 10),
        ("bob", "qwen"): (1, 3, 2),
    }
    assert [r["user"] for r in report["rows"]] == ["alice", "bob"]  # most tokens first
    assert rows["alice", "llama3"]["gpu_seconds"] >= 2 * 4 / 200  # 4 paced gaps of 5 ms per answer
    assert report["total"]["requests"] == 3 and report["total"]["completion_tokens"] == 12
    assert report["timezone"] and report["by"] == ["user", "model"]
    by_group = await daemon.admin("GET", "/admin/usage?by=group,backend&since=1h")
    assert {(r["group"], r["backend"]): r["requests"] for r in by_group["rows"]} == {
        ("staff", "b1"): 2,
        ("student", "b1"): 1,
    }
    bad = await daemon.admin("GET", "/admin/usage?by=color", status=400)
    assert "cannot group usage by 'color'" in bad["error"]["message"]
    bad = await daemon.admin("GET", "/admin/usage?since=yesterday", status=400)
    assert "give an age such as 7d" in bad["error"]["message"]


async def test_group_quota_refuses_in_each_dialect_until_the_day_turns(daemon):
    fake = InProcess(models=("llama3",), completion_tokens=8)
    await daemon.backend("b1", fake)
    alice = await daemon.user("alice")
    bob = await daemon.user("bob")
    answer = await daemon.admin("PUT", "/admin/groups/student/quota", {"tokens_per_day": 21})
    assert answer["tokens_per_day"] == 21 and answer["quotas"][0]["remaining"] == 21
    first = await ask(daemon, alice, max_tokens=5)
    assert first.status == 200
    assert first.headers["X-Quota-Remaining-Tokens"] == "21"  # before this request
    assert first.headers["X-Quota-Reset"].endswith(time.strftime("%z")[:3] + ":" + time.strftime("%z")[3:])
    assert (await ask(daemon, bob, max_tokens=5)).status == 200  # 16 of 21 used by the group
    third = await ask(daemon, alice, max_tokens=5)
    assert third.status == 200 and third.headers["X-Quota-Remaining-Tokens"] == "5"  # the last 5
    assert third.headers["X-Quota-Max-Tokens"] == "1"  # 5 less its prompt (4 estimated): capped, not above
    refused = await daemon.client.post("/v1/chat/completions", json=chat(), headers={"Authorization": f"Bearer {bob}"})
    error = (await refused.json())["error"]
    assert refused.status == 429 and error["type"] == "rate_limit_error" and error["code"] == "quota_exceeded"
    assert error["message"].startswith(
        "group 'student' has 1 of the 21 tokens a day its quota allows left, too few for this request's prompt"
    )
    assert error["message"].endswith("or ask an admin to raise it with `mr group set-quota student --tokens-per-day N`")
    wait = int(refused.headers["Retry-After"])
    assert 0 < wait <= 86400 + 3600 and abs(time.time() + wait - next_day(time.time())) < 5
    refused = await daemon.client.post("/api/chat", json=chat(), headers={"Authorization": f"Bearer {alice}"})
    assert refused.status == 429 and "tokens a day its quota allows" in (await refused.json())["error"]
    assert fake.requests == 3  # refused before they queued
    quotas = daemon.app[SERVICES].quotas
    quotas.wall = lambda: next_day(time.time()) + 1  # the day turns over
    again = await ask(daemon, bob, max_tokens=5)
    assert again.status == 200 and again.headers["X-Quota-Remaining-Tokens"] == "21"


async def test_quota_counts_requests_in_flight_and_never_cuts_them(daemon):
    fake = InProcess(models=("llama3",), completion_tokens=8, held=True)
    await daemon.backend("b1", fake)
    alice = await daemon.user("alice")
    await daemon.admin("PUT", "/admin/users/alice/quota", {"tokens_per_month": 300})
    # No max_tokens: each is estimated at 3 + 256 tokens while it runs.
    running = [asyncio.create_task(ask(daemon, alice, max_tokens=None)) for _ in range(2)]
    await until(lambda: fake.in_flight == 2, "both requests should run")
    refused = await ask(daemon, alice, max_tokens=1)
    assert refused.status == 429
    fake.open_gate()
    assert [(await t).status for t in running] == [200, 200]  # the running ones finished
    # Now only their real tokens count: 2 x (3 + 8) = 22 of 300.
    ok = await ask(daemon, alice, max_tokens=1)
    assert ok.status == 200 and ok.headers["X-Quota-Remaining-Tokens"] == str(300 - 22)


async def test_requests_per_minute(daemon):
    fake = InProcess(models=("llama3",), completion_tokens=8)
    await daemon.backend("b1", fake)
    alice = await daemon.user("alice")
    await daemon.admin("PUT", "/admin/users/alice/quota", {"requests_per_minute": 2})
    assert [(await ask(daemon, alice)).status for _ in range(3)] == [200, 200, 429]
    refused = await ask(daemon, alice)
    assert 0 < int(refused.headers["Retry-After"]) <= 60
    assert "X-Quota-Remaining-Tokens" not in (await ask(daemon, await daemon.user("bob"))).headers


async def test_quotas_survive_a_restart_and_travel_in_export(new_daemon, tmp_path):
    fake = InProcess(models=("llama3",), completion_tokens=8)
    d = await new_daemon()
    key = await d.user("alice", "staff")
    await d.backend("b1", fake)
    await d.admin("PUT", "/admin/users/alice/quota", {"tokens_per_day": 8, "requests_per_minute": 100})
    await d.admin("PUT", "/admin/groups/staff/quota", {"tokens_per_month": 50_000_000})
    assert (await ask(d, key, max_tokens=5)).status == 200
    exported = await d.admin("GET", "/admin/export")
    await d.client.close()
    d2 = await new_daemon(inprocess=[fake])  # on the same state
    refused = await ask(d2, key)
    assert (
        refused.status == 429
        and "has 1 of the 8 tokens a day its quota allows left" in (await refused.json())["error"]["message"]
    )
    staff = next(g for g in exported["groups"] if g["name"] == "staff")
    assert staff["tokens_per_month"] == 50_000_000 and "tokens_per_day" not in staff
    alice = exported["users"][0]
    assert (alice["tokens_per_day"], alice["requests_per_minute"]) == (8, 100)
    # Import into a fresh daemon: the same limits.
    d3 = await new_daemon(tmp_path=tmp_path / "other")
    await d3.admin("POST", "/admin/import", {k: v for k, v in exported.items() if k != "backends"})
    assert (await d3.admin("GET", "/admin/export"))["users"] == exported["users"]
    cleared = await d3.admin("PUT", "/admin/users/alice/quota", {"clear": True})
    assert (cleared["tokens_per_day"], cleared["requests_per_minute"], cleared["quotas"]) == (None, None, [])


async def test_set_quota_refusals(daemon):
    await daemon.user("alice")
    bad = await daemon.admin("PUT", "/admin/users/alice/quota", {"tokens_per_day": -1}, status=400)
    assert "tokens_per_day -1 of user 'alice' must be a whole number" in bad["error"]["message"]
    bad = await daemon.admin("PUT", "/admin/users/alice/quota", {"tokens_per_week": 5}, status=400)
    assert "'tokens_per_week' is not a quota" in bad["error"]["message"]
    await daemon.admin("PUT", "/admin/users/nobody/quota", {"tokens_per_day": 5}, status=404)
    await daemon.admin("PUT", "/admin/groups/nogroup/quota", {"tokens_per_day": 5}, status=404)
    await daemon.admin("PUT", "/admin/users/alice/quota", {}, status=400)


async def test_me_shows_only_the_callers_own_data(daemon):
    fake = InProcess(models=("llama3",), completion_tokens=8)
    await daemon.backend("b1", fake)
    alice = await daemon.user("alice", "staff")
    bob = await daemon.user("bob-secret", "student")
    await daemon.admin("PUT", "/admin/users/bob-secret/quota", {"tokens_per_day": 1000})
    await daemon.admin("PUT", "/admin/groups/staff/quota", {"tokens_per_month": 5000})
    assert (await ask(daemon, alice, max_tokens=5)).status == 200
    assert (await ask(daemon, bob, max_tokens=7)).status == 200
    resp = await daemon.client.get("/v1/me", headers={"Authorization": f"Bearer {alice}"})
    text = await resp.text()
    assert resp.status == 200 and "bob-secret" not in text and "student" not in text
    me = json.loads(text)
    assert (me["user"], me["group"]) == ("alice", "staff")
    assert (me["today"]["requests"], me["today"]["prompt_tokens"], me["today"]["completion_tokens"]) == (1, 3, 5)
    assert me["today"]["service_units"] == me["month"]["service_units"] == 3 + 2 * 5  # tokens and units apart
    assert me["month"]["requests"] == 1 and me["timezone"]
    assert [(q["subject"], q["name"], q["kind"], q["used"]) for q in me["quotas"]] == [
        ("group", "staff", "tokens_per_month", 8)
    ]
    share = me["fair_share"]
    assert share["weight"] == 2 and share["recent_tokens"] == 8 and share["position"] in (1, 2)
    assert share["recent_units"] == 3 + 2 * 5
    assert share["active_users"] == 2
    mine = await (await daemon.client.get("/v1/me", headers={"Authorization": f"Bearer {bob}"})).json()
    assert mine["today"]["completion_tokens"] == 7 and mine["quotas"][0]["name"] == "bob-secret"
    anonymous = await daemon.client.get("/v1/me")
    assert anonymous.status == 401 and (await anonymous.json())["error"]["code"] == "missing_api_key"


async def test_top_shows_todays_usage_quota_warnings_and_throughput(daemon):
    fake = InProcess(models=("llama3",), completion_tokens=8)
    await daemon.backend("b1", fake)
    alice = await daemon.user("alice")
    await daemon.user("bob")
    await daemon.admin("PUT", "/admin/users/alice/quota", {"tokens_per_day": 20})
    await daemon.admin("PUT", "/admin/users/bob/quota", {"tokens_per_day": 1000})
    for _ in range(2):
        assert (await ask(daemon, alice, max_tokens=5)).status == 200
    top = await daemon.admin("GET", "/admin/top")
    today = top["usage_today"]
    assert [(r["user"], r["requests"]) for r in today["users"]] == [("alice", 2)]
    assert [r["model"] for r in today["models"]] == ["llama3"] and today["total"]["completion_tokens"] == 10
    assert [(q["name"], q["used"], q["limit"]) for q in top["quota_warnings"]] == [("alice", 16, 20)]
    assert top["throughput"]["bucket_seconds"] == 10
    rates = top["throughput"]["backends"]["b1"]
    assert len(rates) == 30 and all(r == 0 for r in rates)  # the bucket still filling is left out
    stats = daemon.app[SERVICES].stats
    stats.clock = lambda: time.monotonic() + 10  # ten seconds on: that bucket is complete
    assert daemon.app[SERVICES].stats.throughput()[1][-1] == 10 / 10
