"""Who a proxy's request is for (issue 19 items 2 and 3): only people of its own, each identity one person.

A proxy's key (``mr user set-proxy``) names the person behind a front end. It may reach only the people
created through it; a regular user, an admin, another proxy or another proxy's people are never charged
for its requests. Two forwarded identities are never one person, and the body's ``user`` field names
nobody unless the proxy is set to take it. New people per proxy per hour are capped.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import openai
import pytest

from mindrouter.daemon.edge.services import SERVICES
from mindrouter.names import hash_key, person_name
from mindrouter.store import Store
from mindrouter.store.schema import _MIGRATIONS

from .harness import daemon_config
from .inprocess import InProcess
from .test_daemon_proxy import USER, as_person, proxy_user


async def ask(daemon: Any, key: str, user: str | None = None, **headers: str) -> str:
    """One chat through the openai client; returns the request id."""
    extra = {} if user is None else {"user": user}
    reply = await as_person(daemon, key, **headers).chat.completions.with_raw_response.create(
        model="m", messages=USER, max_tokens=1, **extra
    )
    return str(reply.headers["X-Request-Id"])


def charged(daemon: Any) -> dict[str, int]:
    """Requests charged per user name, from the usage rows."""
    ids = {u.id: u.name for u in daemon.app[SERVICES].store.list_users()}
    out: dict[str, int] = {}
    for row in daemon.app[SERVICES].store.recent_usage(0):
        out[ids[row.user_id]] = out.get(ids[row.user_id], 0) + 1
    return out


async def test_a_proxy_cannot_act_as_a_regular_user_an_admin_or_another_proxys_person(daemon, caplog):
    fake = InProcess(models=("m",), completion_tokens=8)
    await daemon.backend("b", fake)
    prof = await daemon.user("prof", group="admin")
    await ask(daemon, prof)
    webui = await proxy_user(daemon)
    gate = await proxy_user(daemon, "gate")
    await ask(daemon, gate, **{"X-OpenWebUI-User-Email": "alice@lab.edu"})  # gate's own person
    caplog.set_level(logging.WARNING, logger="mindrouter.daemon")
    rids = []
    for name in ("prof", "PROF", "prof", "gate", "alice@lab.edu", "ALICE@lab.edu"):
        rids.append(await ask(daemon, webui, **{"X-Forwarded-User": name}))
    await ask(daemon, webui, **{"X-Forwarded-User": "..prof"})
    users = {u["name"]: u for u in await daemon.admin("GET", "/admin/users")}
    counts = charged(daemon)
    assert counts["prof"] == 1, "prof is charged for its own request only"
    assert "gate" not in counts
    assert counts["alice@lab.edu"] == 1, "gate's alice is charged for gate's request only"
    assert counts["webui"] == 6, "every name that is not webui's own person is charged to webui"
    for rid in rids:
        record = await daemon.admin("GET", f"/admin/decisions/{rid}")
        assert record["user"] == "webui" and record["user_weight"] == 1  # the student proxy's weight, not 10
    dotted = [u for u in users.values() if u.get("identity") == "..prof"]
    assert len(dotted) == 1 and dotted[0]["name"] != "prof" and dotted[0]["person_of"] == "webui"
    assert users["alice@lab.edu"]["person_of"] == "gate"
    warned = [r.getMessage() for r in caplog.records if "not its own" in r.getMessage()]
    assert len(warned) == 4, warned  # once per name (prof, PROF, gate, alice@lab.edu), not per request


async def test_two_identities_are_never_one_person(daemon):
    fake = InProcess(models=("m",), completion_tokens=8)
    await daemon.backend("b", fake)
    key = await proxy_user(daemon)
    for email in ("_prof@lab.edu", "-prof@lab.edu", "prof@lab.edu", "Prof@Lab.EDU"):
        await ask(daemon, key, **{"X-OpenWebUI-User-Email": email})
    await ask(daemon, key, **{"X-OpenWebUI-User-Id": "Dan Smith"})
    await ask(daemon, key, **{"X-OpenWebUI-User-Id": "dan-smith"})
    await ask(daemon, key, **{"X-Forwarded-User": "Carol"})
    await ask(daemon, key, **{"X-Forwarded-User": "carol"})
    shown = person_name("Dan Smith")  # the name shown for "Dan Smith", sent as an identity of its own
    await ask(daemon, key, **{"X-Forwarded-User": shown})
    people = {u["identity"]: u for u in await daemon.admin("GET", "/admin/users") if u.get("identity")}
    assert set(people) == {
        *("_prof@lab.edu", "-prof@lab.edu", "prof@lab.edu", "Dan Smith", "dan-smith", "Carol", "carol", shown)
    }
    assert people["prof@lab.edu"]["name"] == "prof@lab.edu"  # an address is case-folded, nothing else
    assert len({p["name"].lower() for p in people.values()}) == 8
    assert people[shown]["name"] == f"{shown}-2" and people["carol"]["name"] == "carol-2"
    counts = charged(daemon)
    assert counts[people["prof@lab.edu"]["name"]] == 2
    assert counts[people["_prof@lab.edu"]["name"]] == counts[people["-prof@lab.edu"]["name"]] == 1


async def test_the_user_field_names_nobody_unless_the_proxy_takes_it(daemon):
    fake = InProcess(models=("m",), completion_tokens=8)
    await daemon.backend("b", fake)
    key = await proxy_user(daemon)
    await ask(daemon, key, user="eve@lab.edu")
    assert "eve@lab.edu" not in charged(daemon) and charged(daemon)["webui"] == 1
    row = await daemon.admin("PUT", "/admin/users/webui", {"person_from": "user-field"})
    assert row["person_from"] == "user-field" and row["proxy_for"] == "student"
    await ask(daemon, key, user="eve@lab.edu", **{"X-Forwarded-User": "mallory"})
    counts = charged(daemon)
    assert counts["eve@lab.edu"] == 1 and "mallory" not in counts, "user-field: the headers name nobody"
    refused = await daemon.admin("PUT", "/admin/users/webui", {"person_from": "cookie"}, status=400)
    assert "header or user-field" in refused["error"]["message"]
    listed = {u["name"]: u for u in await daemon.admin("GET", "/admin/users")}
    assert listed["webui"]["person_from"] == "user-field"
    assert daemon.app[SERVICES].store.get_user("webui").person_from == "user-field"


async def test_new_people_per_proxy_per_hour_are_capped(new_daemon):
    daemon = await new_daemon(server={"new_people_per_hour": 2})
    fake = InProcess(models=("m",), completion_tokens=8)
    await daemon.backend("b", fake)
    key = await proxy_user(daemon)
    other = await proxy_user(daemon, "gate")
    await ask(daemon, key, **{"X-Forwarded-User": "p1"})
    await ask(daemon, key, **{"X-Forwarded-User": "p2"})
    with pytest.raises(openai.RateLimitError) as refused:
        await ask(daemon, key, **{"X-Forwarded-User": "p3"})
    answer = refused.value.response
    assert answer.status_code == 429 and 3000 < int(answer.headers["Retry-After"]) <= 3600
    message = refused.value.body["message"]  # type: ignore[index]
    assert "new_people_per_hour" in message and message.count(". ") == 0
    await ask(daemon, key, **{"X-Forwarded-User": "p1"})  # known people still pass
    await ask(daemon, key)  # and the proxy itself
    await ask(daemon, other, **{"X-Forwarded-User": "p3"})  # the cap is per proxy
    assert charged(daemon) == {"p1": 2, "p2": 1, "webui": 1, "p3": 1}


def _old_state(path: Path) -> None:
    """A state database as the last release left it (schema 5): people keyed by their cleaned name."""
    db = sqlite3.connect(path, isolation_level=None)
    for step in _MIGRATIONS[:5]:
        for statement in step:  # type: ignore[union-attr]
            db.execute(statement)
    db.execute("PRAGMA user_version = 5")
    db.execute("INSERT INTO meta VALUES ('default_groups', '1')")
    for name, weight in (("student", 1), ("staff", 2), ("faculty", 3), ("admin", 10)):
        db.execute("INSERT INTO groups (name, scheduler_weight) VALUES (?, ?)", (name, weight))
    rows = [  # name, group id, created, proxy, proxy group id
        ("keyless", 1, 10.0, 0, None),  # a regular user made before the proxy, never given a key yet
        ("webui", 2, 20.0, 1, 1),
        ("Alice@Lab.edu", 1, 30.0, 0, None),
        ("dan-smith", 1, 40.0, 0, None),
        ("prof", 4, 50.0, 0, None),
    ]
    db.executemany(
        "INSERT INTO users (name, group_id, created, proxy, proxy_group_id) VALUES (?, ?, ?, ?, ?)",
        rows,
    )
    for user_id, key in ((2, "mr-webui-key"), (5, "mr-prof-key")):
        db.execute(
            "INSERT INTO api_keys (user_id, hash, prefix, created) VALUES (?, ?, ?, 0)", (user_id, hash_key(key), key)
        )
    db.close()


async def test_people_stored_before_the_upgrade_stay_their_proxys(tmp_path: Path, new_daemon):
    config = daemon_config(tmp_path)
    config.server.state_path.mkdir(parents=True)
    _old_state(config.server.state_path / "mindrouter.db")
    with Store(config.server.state_path / "mindrouter.db") as st:
        people = {u.name: u for u in st.list_users()}
    assert (people["Alice@Lab.edu"].person_of, people["Alice@Lab.edu"].identity) == ("webui", "alice@lab.edu")
    assert (people["dan-smith"].person_of, people["dan-smith"].identity) == ("webui", "dan-smith")
    assert people["keyless"].person_of is None and people["prof"].person_of is None
    daemon = await new_daemon()
    fake = InProcess(models=("m",), completion_tokens=8)
    await daemon.backend("b", fake)
    await ask(daemon, "mr-webui-key", **{"X-OpenWebUI-User-Email": "alice@lab.edu"})
    await ask(daemon, "mr-webui-key", **{"X-Forwarded-User": "keyless"})
    await ask(daemon, "mr-webui-key", **{"X-Forwarded-User": "prof"})
    assert charged(daemon) == {"Alice@Lab.edu": 1, "webui": 2}


def test_proxy_settings_and_people_survive_export_and_import(tmp_path: Path) -> None:
    with Store(tmp_path / "a.db") as st:
        st.ensure_default_groups()
        st.add_user("webui", "staff", proxy=True, proxy_group="student", person_from="user-field")
        proxy = st.get_user("webui")
        alice = st.add_person(proxy.id, "student", "_alice@lab.edu")
        doc = st.export()
    rows = {u["name"]: u for u in doc["users"]}
    assert rows["webui"]["person_from"] == "user-field"
    assert (rows[alice.name]["person_of"], rows[alice.name]["identity"]) == ("webui", "_alice@lab.edu")
    with Store(tmp_path / "b.db") as other:
        other.ensure_default_groups()
        other.import_(doc)
        proxy = other.get_user("webui")
        assert proxy.person_from == "user-field"
        found = other.person_of(proxy.id, "_alice@lab.edu")
        assert found is not None and found.name == alice.name


async def test_an_admin_makes_a_proxys_person_before_their_first_chat(daemon):
    """`mr user add IDENTITY --person-of webui --group faculty` (issue 21): their first chat is faculty's."""
    fake = InProcess(models=("m",), completion_tokens=8)
    await daemon.backend("b", fake)
    webui = await proxy_user(daemon)
    made = await daemon.admin(
        "POST", "/admin/users", {"name": "Prof@Lab.edu", "group": "faculty", "person_of": "webui"}, status=201
    )
    assert (made["name"], made["group"], made["person_of"], made["identity"]) == (
        "prof@lab.edu",
        "faculty",
        "webui",
        "prof@lab.edu",
    )
    rid = await ask(daemon, webui, **{"X-OpenWebUI-User-Email": "prof@lab.edu"})
    record = await daemon.admin("GET", f"/admin/decisions/{rid}")
    assert (record["user"], record["user_group"]) == ("prof@lab.edu", "faculty")
    again = await daemon.admin(
        "POST", "/admin/users", {"name": "prof@lab.edu", "group": "staff", "person_of": "webui"}, status=409
    )
    assert "already" in again["error"]["message"]
    await daemon.user("plain", "student")
    refused = await daemon.admin(
        "POST", "/admin/users", {"name": "x@lab.edu", "group": "staff", "person_of": "plain"}, status=400
    )
    assert "not a proxy" in refused["error"]["message"]
