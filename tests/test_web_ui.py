"""The web UI (/ui/): logging in, sessions and CSRF, a person's own page, and each admin action.

Driven through the daemon's TCP port as a browser would (cookies, forms,
redirects); the admin API checks that each form changed what ``mr`` reads.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from mindrouter.daemon.edge.services import SERVICES
from mindrouter.daemon.ui.sessions import COOKIE, Sessions
from mindrouter.names import hash_key
from mindrouter.store import Store

from .harness import ADMIN_KEY, Daemon, until
from .inprocess import InProcess


@pytest.fixture
def box() -> InProcess:
    """The one backend the pages show: an in-process server of llama3.2 and an embedding model."""
    return InProcess(models=("llama3.2", "nomic-embed-text"))


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:500]
    return found.group(1)


async def login(daemon: Daemon, key: str, client: Any = None) -> str:
    """Log in with ``key``; the landing page's HTML."""
    client = client or daemon.client
    form = await (await client.get("/ui/login")).text()
    resp = await client.post("/ui/login", data={"key": key, "csrf": csrf_of(form)})
    assert resp.status == 200, await resp.text()
    return await resp.text()


async def student_weight(daemon: Daemon) -> float:
    """The student group's weight as the admin API (`mr group list`) reads it."""
    groups = {g["name"]: g["scheduler_weight"] for g in await daemon.admin("GET", "/admin/groups")}
    return float(groups["student"])


async def post(daemon: Daemon, page: str, action: str, data: dict[str, str] | None = None) -> str:
    """Submit a form of ``page`` to ``action`` with that page's CSRF token; the page shown after."""
    token = csrf_of(await (await daemon.client.get(page)).text())
    resp = await daemon.client.post(action, data={"csrf": token, **(data or {})})
    assert resp.status == 200, await resp.text()
    return await resp.text()


async def test_login_with_a_key_opens_a_strict_httponly_session(daemon: Daemon) -> None:
    key = await daemon.user("ana")
    form = await (await daemon.client.get("/ui/login")).text()
    resp = await daemon.client.post("/ui/login", data={"key": key, "csrf": csrf_of(form)}, allow_redirects=False)
    assert resp.status == 303 and resp.headers["Location"] == "/ui/me"
    cookie = next(c for c in resp.headers.getall("Set-Cookie") if c.startswith("mr_session="))
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui/" in cookie
    page = await (await daemon.client.get("/ui/me")).text()
    assert "ana" in page and "group student" in page


async def test_a_bad_key_or_no_session_gets_the_login_page(daemon: Daemon) -> None:
    resp = await daemon.client.get("/ui/me", allow_redirects=False)
    assert resp.status == 303 and resp.headers["Location"] == "/ui/login"
    form = await (await daemon.client.get("/ui/login")).text()
    resp = await daemon.client.post("/ui/login", data={"key": "sk-not-a-key", "csrf": csrf_of(form)})
    assert resp.status == 401
    assert "That key is not valid" in await resp.text()
    assert (await daemon.client.get("/ui/admin/groups", allow_redirects=False)).status == 303


async def test_login_without_its_csrf_token_is_refused(daemon: Daemon) -> None:
    key = await daemon.user("ana")
    await daemon.client.get("/ui/login")
    resp = await daemon.client.post("/ui/login", data={"key": key, "csrf": "forged"})
    assert resp.status == 403
    assert (await daemon.client.get("/ui/me", allow_redirects=False)).status == 303


async def test_a_form_without_the_session_csrf_token_changes_nothing(daemon: Daemon) -> None:
    await login(daemon, ADMIN_KEY)
    resp = await daemon.client.post("/ui/admin/groups/student/weight", data={"weight": "7"})
    assert resp.status == 403
    resp = await daemon.client.post("/ui/admin/groups/student/weight", data={"weight": "7", "csrf": "forged"})
    assert resp.status == 403
    assert (await student_weight(daemon)) == 1


async def test_a_person_gets_no_admin_page_or_action(daemon: Daemon) -> None:
    key = await daemon.user("ana")
    await login(daemon, key)
    resp = await daemon.client.get("/ui/admin/groups")
    assert resp.status == 403
    token = csrf_of(await (await daemon.client.get("/ui/me")).text())
    resp = await daemon.client.post("/ui/admin/groups/student/weight", data={"weight": "7", "csrf": token})
    assert resp.status == 403
    assert (await student_weight(daemon)) == 1


async def test_a_person_sees_only_their_own_data(daemon: Daemon, box: InProcess) -> None:
    await daemon.backend("box", box)
    ana = await daemon.user("ana-student")
    bo = await daemon.user("bo-faculty", group="faculty")
    await daemon.admin("PUT", "/admin/users/bo-faculty/quota", {"tokens_per_day": 777_000})
    for key in (ana, bo):
        resp = await daemon.client.post(
            "/v1/chat/completions",
            json={"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert resp.status == 200, await resp.text()
    await daemon.admin("PUT", "/admin/users/ana-student/quota", {"tokens_per_day": 123_456})
    page = await login(daemon, ana)
    assert "ana-student" in page and "123456" in page
    assert "bo-faculty" not in page and "faculty" not in page and "777000" not in page
    assert "1 of 2 active people" in page or "2 of 2 active people" in page


async def test_revoking_the_key_ends_its_session(daemon: Daemon) -> None:
    key = await daemon.user("ana")
    await login(daemon, key)
    keys = await daemon.admin("GET", "/admin/users/ana/keys")
    await daemon.admin("DELETE", f"/admin/users/ana/keys/{keys[0]['id']}")
    assert (await daemon.client.get("/ui/me", allow_redirects=False)).status == 303


async def test_a_member_of_the_admin_group_gets_the_admin_pages(daemon: Daemon) -> None:
    key = await daemon.user("root", group="admin")
    await login(daemon, key)
    assert (await daemon.client.get("/ui/admin/groups")).status == 200
    await daemon.admin("PUT", "/admin/users/root", {"group": "staff"})
    assert (await daemon.client.get("/ui/admin/groups")).status == 403


async def test_setting_a_group_weight_is_what_the_admin_api_reads(daemon: Daemon) -> None:
    await login(daemon, ADMIN_KEY)
    page = await post(daemon, "/ui/admin/groups", "/ui/admin/groups/student/weight", {"weight": "2.5"})
    assert "group student now weighs 2.5" in page
    assert (await student_weight(daemon)) == 2.5


async def test_a_bad_weight_shows_the_cli_sentence_and_changes_nothing(daemon: Daemon) -> None:
    await login(daemon, ADMIN_KEY)
    page = await post(daemon, "/ui/admin/groups", "/ui/admin/groups/student/weight", {"weight": "-1"})
    assert "weight &#39;-1&#39; must be a finite number greater than 0, such as 1 or 2.5" in page
    assert (await student_weight(daemon)) == 1


async def test_a_users_group_weight_and_quotas_are_set_from_their_page(daemon: Daemon) -> None:
    await daemon.user("ana")
    await login(daemon, ADMIN_KEY)
    users = await (await daemon.client.get("/ui/admin/users")).text()
    assert 'href="/ui/admin/users/ana"' in users
    page = await post(daemon, "/ui/admin/users/ana", "/ui/admin/users/ana", {"group": "staff", "weight_override": "4"})
    assert "user ana is in group staff with weight 4" in page
    page = await post(
        daemon,
        "/ui/admin/users/ana",
        "/ui/admin/users/ana/quota",
        {"tokens_per_day": "5000", "tokens_per_month": "", "requests_per_minute": "30"},
    )
    assert "quotas of ana saved" in page
    row = next(u for u in await daemon.admin("GET", "/admin/users") if u["name"] == "ana")
    assert (row["group"], row["weight_override"]) == ("staff", 4)
    assert {q["kind"]: q["limit"] for q in row["quotas"] if q["subject"] == "user"} == {
        "tokens_per_day": 5000,
        "requests_per_minute": 30,
    }
    page = await post(daemon, "/ui/admin/users/ana", "/ui/admin/users/ana", {"group": "staff", "weight_override": ""})
    row = next(u for u in await daemon.admin("GET", "/admin/users") if u["name"] == "ana")
    assert row["weight_override"] is None and row["weight"] == 2


async def test_a_key_is_shown_once_and_revoked_one_at_a_time(daemon: Daemon) -> None:
    await daemon.user("ana")
    await login(daemon, ADMIN_KEY)
    page = await post(daemon, "/ui/admin/users/ana", "/ui/admin/users/ana/keys")
    key = re.search(r'<pre id="new-key">([^<]+)</pre>', page)
    assert key
    resp = await daemon.client.get("/v1/me", headers={"Authorization": f"Bearer {key.group(1)}"})
    assert resp.status == 200
    again = await (await daemon.client.get("/ui/admin/users/ana")).text()
    assert key.group(1) not in again and "new-key" not in again
    keys = await daemon.admin("GET", "/admin/users/ana/keys")
    assert len(keys) == 2
    page = await post(daemon, "/ui/admin/users/ana", f"/ui/admin/users/ana/keys/{keys[1]['id']}/revoke")
    assert f"key {keys[1]['id']} of ana revoked" in page
    assert [k["id"] for k in await daemon.admin("GET", "/admin/users/ana/keys")] == [keys[0]["id"]]


async def test_drain_and_enable_a_backend(daemon: Daemon, box: InProcess) -> None:
    await daemon.backend("box", box)
    await login(daemon, ADMIN_KEY)
    page = await (await daemon.client.get("/ui/admin/backends")).text()
    assert "llama3.2" in page and "healthy" in page
    page = await post(daemon, "/ui/admin/backends", "/ui/admin/backends/box/drain")
    # the only backend of its models: a confirmation naming them, and nothing drained yet
    assert "Draining box leaves llama3.2, nomic-embed-text without a backend" in page
    assert (await daemon.admin("GET", "/admin/backends"))[0]["status"] == "healthy"
    page = await post(daemon, "/ui/admin/backends", "/ui/admin/backends/box/drain", {"force": "yes"})
    assert "backend box is draining" in page or "backend box is drained" in page
    status = (await daemon.admin("GET", "/admin/backends"))[0]["status"]
    assert status in ("draining", "drained")
    assert "/ui/admin/backends/box/enable" in page  # a drained backend is offered Enable, not Drain again
    page = await post(daemon, "/ui/admin/backends", "/ui/admin/backends/box/enable")
    assert "backend box is healthy" in page
    page = await post(daemon, "/ui/admin/backends", "/ui/admin/backends/nobox/drain")
    # the sentence as `mr` prints it, its command as code rather than Markdown backticks (issue 32)
    assert "backend &#39;nobox&#39; does not exist; see the configured ones with <code>mr backend list</code>" in page


async def test_live_page_and_why_explain_a_request(daemon: Daemon, box: InProcess) -> None:
    await daemon.backend("box", box)
    key = await daemon.user("ana")
    resp = await daemon.client.post(
        "/v1/chat/completions",
        json={"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {key}"},
    )
    rid = resp.headers["X-Request-Id"]
    await login(daemon, ADMIN_KEY)
    top = await (await daemon.client.get("/ui/admin/top")).text()
    assert "ana" in top and rid in top and '<svg class="share"' in top
    listing = await (await daemon.client.get("/ui/admin/decisions?user=ana")).text()
    assert rid in listing
    why = await (await daemon.client.get(f"/ui/admin/decisions/{rid}")).text()
    assert "Priority terms" in why and "went to <b>box</b>" in why and "it was answered in full" in why
    assert (await daemon.client.get("/ui/admin/decisions/nope")).status == 404


async def test_pages_carry_a_strict_content_security_policy_and_the_stylesheet_is_served(daemon: Daemon) -> None:
    resp = await daemon.client.get("/ui/login")
    assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
    assert resp.headers["Cache-Control"] == "no-store"
    css = await daemon.client.get("/ui/static/ui.css")
    assert css.status == 200 and "max-width: 600px" in await css.text()


async def test_logout_ends_the_session(daemon: Daemon) -> None:
    key = await daemon.user("ana")
    await login(daemon, key)
    page = await (await daemon.client.get("/ui/me")).text()
    resp = await daemon.client.post("/ui/logout", data={"csrf": csrf_of(page)}, allow_redirects=False)
    assert resp.status == 303
    assert (await daemon.client.get("/ui/me", allow_redirects=False)).status == 303


async def test_a_person_sees_their_own_requests_running_and_queued_with_their_place(
    daemon: Daemon, box: InProcess
) -> None:
    await daemon.backend("box", box, max_concurrent=1)
    ana = await daemon.user("ana")
    bo = await daemon.user("bo")
    box.hold()  # the first request holds the one slot until the gate opens

    async def chat(key: str) -> int:
        resp = await daemon.client.post(
            "/v1/chat/completions",
            json={"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {key}"},
        )
        await resp.read()
        return resp.status

    tasks = [asyncio.create_task(chat(ana))]
    await until(lambda: daemon.scheduler.running_count == 1, "ana's first should run")
    tasks += [asyncio.create_task(chat(k)) for k in (ana, ana, bo)]
    await until(lambda: daemon.scheduler.queued_count == 3, "three should wait")
    page = await login(daemon, ana)
    assert page.count("running on box") == 1
    assert page.count("of yours next, 3 waiting in all") == 2
    assert "1 of yours next" in page and "2 of yours next" in page
    bo_ids = [j.id for j in daemon.scheduler.queued_jobs() if j.user_id == _user_id(daemon, "bo")]
    assert len(bo_ids) == 1 and bo_ids[0] not in page
    box.open_gate()
    assert await asyncio.gather(*tasks) == [200, 200, 200, 200]


def _user_id(daemon: Daemon, name: str) -> int:
    return int(daemon.app[SERVICES].store.get_user(name).id)


def test_a_session_ends_when_it_expires_and_the_oldest_goes_when_the_table_is_full(tmp_path: Path) -> None:
    now = [1000.0]
    sessions = Sessions(Store(tmp_path / "state.db"), ttl=60.0, limit=2, clock=lambda: now[0])

    def opened() -> str:
        response = web.Response()
        sessions.open(response, make_mocked_request("POST", "/ui/login"), "ana", False, "hash")
        return response.cookies[COOKIE].value

    def found(token: str) -> bool:
        return sessions.get(make_mocked_request("GET", "/ui/me", headers={"Cookie": f"{COOKIE}={token}"})) is not None

    first, second = opened(), opened()
    assert found(first) and found(second)
    third = opened()
    assert not found(first) and found(second) and found(third)
    now[0] += 61
    assert not found(second) and not found(third)


async def test_a_session_survives_a_restart_and_its_key_revoked_ends_it(new_daemon: Any) -> None:
    """Sessions live in the store (its token's hash only): the next daemon on the same state knows them."""
    first = await new_daemon()
    key = await first.user("ana")
    await login(first, key)
    token = next(c.value for c in first.client.session.cookie_jar if c.key == COOKIE)
    await first.client.close()
    second = await new_daemon()
    resp = await second.client.get("/ui/me", cookies={COOKIE: token}, allow_redirects=False)
    assert resp.status == 200 and "ana" in await resp.text()
    db = sqlite3.connect(second.app[SERVICES].store.path)
    assert db.execute("SELECT count(*) FROM ui_sessions WHERE hash = ?", (hash_key(token),)).fetchone() == (1,)
    assert token not in str(db.execute("SELECT * FROM ui_sessions").fetchall())
    ids = [k["id"] for k in await second.admin("GET", "/admin/users/ana/keys")]
    await second.admin("DELETE", f"/admin/users/ana/keys/{ids[0]}")
    resp = await second.client.get("/ui/me", cookies={COOKIE: token}, allow_redirects=False)
    assert (resp.status, resp.headers["Location"]) == (303, "/ui/login")


async def test_an_unknown_user_page_says_so_in_the_stores_words(daemon: Daemon) -> None:
    await login(daemon, ADMIN_KEY)
    resp = await daemon.client.get("/ui/admin/users/nobody")
    assert resp.status == 404
    assert "user &#39;nobody&#39; does not exist" in await resp.text()


async def test_a_quota_that_is_not_a_whole_number_is_refused_in_the_stores_words(daemon: Daemon) -> None:
    await daemon.user("ana")
    await login(daemon, ADMIN_KEY)
    fields = {"tokens_per_day": "lots", "tokens_per_month": "", "requests_per_minute": ""}
    page = await post(daemon, "/ui/admin/users/ana", "/ui/admin/users/ana/quota", fields)
    assert 'class="flash error"' in page and "tokens_per_day" in page
    row = next(u for u in await daemon.admin("GET", "/admin/users") if u["name"] == "ana")
    assert [q for q in row["quotas"] if q["subject"] == "user"] == []
