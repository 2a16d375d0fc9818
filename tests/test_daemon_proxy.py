"""Fair share per person behind a front end (a proxy user), and CORS for browser-side clients."""

from __future__ import annotations

import asyncio
from typing import Any

import openai

from mindrouter.daemon.edge.services import SERVICES

from .harness import until
from .inprocess import InProcess

USER = [{"role": "user", "content": "hello there"}]


async def proxy_user(daemon: Any, name: str = "webui", **fields: Any) -> str:
    await daemon.admin("POST", "/admin/users", {"name": name, "group": "student", "proxy": True, **fields})
    return (await daemon.admin("POST", f"/admin/users/{name}/keys"))["key"]


def as_person(daemon: Any, key: str, **headers: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0, default_headers=headers)


async def test_a_proxys_request_is_queued_charged_and_recorded_as_the_person_it_names(daemon):
    fake = InProcess(models=("m",), completion_tokens=8)
    await daemon.backend("b", fake)
    await daemon.admin("POST", "/admin/groups", {"name": "people", "weight": 1})
    key = await proxy_user(daemon, proxy_group="people")
    alice = as_person(daemon, key, **{"X-OpenWebUI-User-Email": "alice@lab.edu", "X-OpenWebUI-User-Name": "A"})
    reply = await alice.chat.completions.with_raw_response.create(model="m", messages=USER, max_tokens=2)
    rid = reply.headers["X-Request-Id"]
    await as_person(daemon, key, **{"X-OpenWebUI-User-Id": "3f1c-77"}).chat.completions.create(
        model="m", messages=USER, max_tokens=3
    )
    await as_person(daemon, key, **{"X-Forwarded-User": "carol"}).chat.completions.create(
        model="m", messages=USER, max_tokens=4
    )
    # the body's "user" names nobody unless the proxy is set to take it (`--person-from user-field`)
    await as_person(daemon, key).chat.completions.create(model="m", messages=USER, max_tokens=5, user="dan smith")
    await as_person(daemon, key).chat.completions.create(model="m", messages=USER, max_tokens=6)  # the proxy's own
    users = {u["name"]: u for u in await daemon.admin("GET", "/admin/users")}
    assert {n: users[n]["group"] for n in ("alice@lab.edu", "3f1c-77", "carol")} == dict.fromkeys(
        ("alice@lab.edu", "3f1c-77", "carol"), "people"
    )
    assert users["webui"]["proxy_for"] == "people" and "proxy_for" not in users["carol"]
    ids = {u.id: u.name for u in daemon.app[SERVICES].store.list_users()}
    charged: dict[str, int] = {}
    for row in daemon.app[SERVICES].store.recent_usage(0):
        charged[ids[row.user_id]] = charged.get(ids[row.user_id], 0) + row.tokens
    assert charged == {  # 2 prompt words and the completion, each charged to the person named
        "alice@lab.edu": 4,
        "3f1c-77": 5,
        "carol": 6,
        "webui": 7 + 8,
    }
    record = await daemon.admin("GET", f"/admin/decisions/{rid}")
    assert record["user"] == "alice@lab.edu"


async def test_only_a_proxys_key_may_name_a_person(daemon):
    fake = InProcess(models=("m",), completion_tokens=8)
    await daemon.backend("b", fake)
    key = await daemon.user("erin")
    await as_person(daemon, key, **{"X-OpenWebUI-User-Email": "mallory@lab.edu"}).chat.completions.create(
        model="m", messages=USER, max_tokens=1, user="mallory"
    )
    names = {u["name"] for u in await daemon.admin("GET", "/admin/users")}
    assert names == {"erin"}
    await daemon.admin("PUT", "/admin/users/erin", {"proxy": True})
    await as_person(daemon, key, **{"X-OpenWebUI-User-Email": "mallory@lab.edu"}).chat.completions.create(
        model="m", messages=USER, max_tokens=1
    )
    users = {u["name"]: u for u in await daemon.admin("GET", "/admin/users")}
    assert users["mallory@lab.edu"]["group"] == "student"  # the proxy's own group by default
    await daemon.admin("PUT", "/admin/users/erin", {"proxy": False})
    await as_person(daemon, key, **{"X-Forwarded-User": "trent"}).chat.completions.create(
        model="m", messages=USER, max_tokens=1
    )
    assert "trent" not in {u["name"] for u in await daemon.admin("GET", "/admin/users")}


async def test_two_people_behind_one_front_end_get_their_own_fair_shares(daemon):
    # The backend holds Alice's first answer until the other three are queued.
    fake = InProcess(models=("m",), completion_tokens=50, held=True)
    await daemon.backend("b", fake, max_concurrent=1)
    key = await proxy_user(daemon)
    alice = as_person(daemon, key, **{"X-OpenWebUI-User-Email": "alice@lab.edu"})
    bob = as_person(daemon, key, **{"X-OpenWebUI-User-Email": "bob@lab.edu"})

    async def ask(client: openai.AsyncOpenAI, text: str, tokens: int | None = 1) -> None:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}], max_tokens=tokens)

    async def ask_streaming(client: openai.AsyncOpenAI, text: str) -> None:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": text}], stream=True
        )
        async for _ in stream:
            pass

    first = asyncio.create_task(ask_streaming(alice, "alice 0"))  # holds the one slot
    await until(lambda: fake.in_flight == 1, "alice's first should run")
    later = [asyncio.create_task(ask(alice, f"alice {i}")) for i in (1, 2)]
    await until(lambda: daemon.scheduler.queued_count == 2, "alice's next two should wait")
    later.append(asyncio.create_task(ask(bob, "bob 0")))
    await until(lambda: daemon.scheduler.queued_count == 3, "bob's should wait")
    assert fake.in_flight == 1, "all three wait while alice's first holds the slot"
    fake.open_gate()
    await asyncio.gather(first, *later)
    order = [r["messages"][0]["content"] for r in fake.received]
    assert order == ["alice 0", "bob 0", "alice 1", "alice 2"], "bob's first request goes before alice's second"


async def test_cors_preflight_and_answers_for_allowed_origins_only(new_daemon):
    client = (await new_daemon(server={"cors_origins": "http://ui.lab:3000"})).client
    ask = {"Origin": "http://ui.lab:3000", "Access-Control-Request-Method": "GET"}
    pre = await client.options("/v1/models", headers={**ask, "Access-Control-Request-Headers": "authorization"})
    assert pre.status == 204
    assert pre.headers["Access-Control-Allow-Origin"] == "http://ui.lab:3000"
    assert pre.headers["Access-Control-Allow-Headers"] == "authorization"
    listed = await client.get("/v1/models", headers={"Origin": "http://ui.lab:3000"})
    assert listed.status == 401 and listed.headers["Access-Control-Allow-Origin"] == "http://ui.lab:3000"
    other = await client.get("/v1/models", headers={"Origin": "http://evil.example"})
    assert "Access-Control-Allow-Origin" not in other.headers
    admin = await client.options("/admin/status", headers=ask)
    assert "Access-Control-Allow-Origin" not in admin.headers
