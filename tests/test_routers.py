"""Two `mr serve` on one PostgreSQL store in front of a fake backend: one leads, the other takes over.

Marked ``postgres``: tests/pg.py starts a throwaway Debian PostgreSQL (skipped without one).
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psycopg
import pytest

from mindrouter.daemon.ui.sessions import COOKIE, LOGIN_COOKIE

from .fakes import FakeOllama, FakeOpenAI
from .harness import until
from .test_serve import amr, free_port, mr, start_serve

pytestmark = pytest.mark.postgres


@dataclass
class Router:
    proc: subprocess.Popen[bytes]
    config: Path
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)


def start_router(tmp: Path, name: str, store_url: str, backends: str = "") -> Router:
    """``backends``: more ``[backends]`` settings, one per line."""
    folder = tmp / name
    folder.mkdir()
    port = free_port()
    config = folder / "config.toml"
    config.write_text(
        f'[server]\nport = {port}\nsocket = "{folder / "mr.sock"}"\nstate_dir = "{folder / "state"}"\n'
        f'shutdown_grace_seconds = 2\n[backends]\npoll_interval = 0.5\n{backends}[store]\nurl = "{store_url}"\n'
    )
    proc, _ = start_serve(config, folder / "serve.log", folder / "mr.sock")
    return Router(proc, config, port, folder / "serve.log")


@pytest.fixture
def routers(tmp_path: Path, pg_url: str) -> Iterator[list[Router]]:
    """Start routers with ``routers.append(start_router(...))``; all are killed at the end."""
    started: list[Router] = []
    yield started
    for router in started:
        router.stop()


async def health(session: aiohttp.ClientSession, router: Router) -> tuple[int, str]:
    try:
        async with session.get(f"{router.url}/health") as r:
            return r.status, await r.text()
    except aiohttp.ClientError:
        return 0, ""


async def leads(session: aiohttp.ClientSession, router: Router) -> bool:
    return (await health(session, router))[0] == 200


async def serves(session: aiohttp.ClientSession, router: Router, key: str) -> bool:
    return (await chat(session, router, key))[0] == 200


async def chat(
    session: aiohttp.ClientSession, router: Router, key: str, path: str = "/v1/chat/completions", model: str = "llama3"
):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "stream": False}
    async with session.post(f"{router.url}{path}", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        return r.status, r.headers.get("Retry-After"), await r.json(content_type=None)


def recent_tokens(router: Router) -> dict[str, float]:
    """Each user's tokens in the fairness window, as the router's fair share counts them."""
    return {u["name"]: u["recent_tokens"] for u in json.loads(mr(router.config, "share", "--json").stdout)["users"]}


def usage_rows(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM usage").fetchone()[0]


async def test_one_leads_the_standby_refuses_and_takes_over_after_a_sigkill(tmp_path, pg_url, routers):
    async with (
        FakeOpenAI(flavor="vllm", models=["llama3"], completion_tokens=10) as fake,
        aiohttp.ClientSession() as session,
    ):
        first = start_router(tmp_path, "a", pg_url)
        routers.append(first)
        await until(lambda: leads(session, first), "the first router leads")
        second = start_router(tmp_path, "b", pg_url)
        routers.append(second)
        assert await health(session, first) == (200, "ok\n")
        status, text = await health(session, second)
        assert status == 503 and text.startswith("standby")
        roles = [json.loads(mr(r.config, "status", "--json").stdout)["role"] for r in (first, second)]
        assert roles == ["leader", "standby"]

        # Admin writes through the standby reach the leader.
        assert (await amr(second.config, "backend", "add", "gpu1", fake.url, "--engine", "vllm")).returncode == 0
        assert (await amr(second.config, "user", "add", "ann", "--group", "staff")).returncode == 0
        key = json.loads((await amr(second.config, "user", "key", "ann", "--json")).stdout)["key"]
        began = time.monotonic()
        await until(lambda: serves(session, first, key), "the leader serves ann on gpu1")
        print(f"an admin write through the standby served by the leader after {time.monotonic() - began:.2f} s")
        listed = json.loads((await amr(second.config, "backend", "list", "--json")).stdout)
        assert [b["name"] for b in listed] == ["gpu1"]  # the standby knows it, and does not probe it

        # The standby answers inference with 503 and Retry-After, in each dialect.
        status, retry, body = await chat(session, second, key)
        assert (status, retry) == (503, "2") and body["error"]["code"] == "standby"
        status, retry, body = await chat(session, second, key, "/api/chat")
        assert (status, retry) == (503, "2") and "standby" in body["error"]

        answered = 1  # the one `until` saw served
        for _ in range(20):
            assert (await chat(session, first, key))[0] == 200
            answered += 1
        await until(lambda: usage_rows(pg_url) >= answered, "the answered requests' rows")
        await asyncio.sleep(0.2)
        used = recent_tokens(first)
        assert used["ann"] > 0
        killed = time.monotonic()
        first.proc.kill()
        await until(lambda: leads(session, second), "the standby leads", timeout=15)
        took = time.monotonic() - killed
        replayed = recent_tokens(second)  # fair share rebuilt from the usage rows, before it serves anything
        assert replayed["ann"] == pytest.approx(used["ann"], rel=0.05)
        await until(lambda: serves(session, second, key), "the new leader serves")
        served = time.monotonic() - killed
        print(f"SIGKILL of the leader: the standby led after {took:.2f} s and served after {served:.2f} s")
        assert served < 10
        assert json.loads(mr(second.config, "status", "--json").stdout)["role"] == "leader"
        assert usage_rows(pg_url) == answered + 1  # the new leader's one: none lost, none twice


async def test_a_frozen_leader_is_replaced_and_never_answers_200_again(tmp_path, pg_url, routers):
    async with aiohttp.ClientSession() as session:
        first = start_router(tmp_path, "a", pg_url)
        routers.append(first)
        await until(lambda: leads(session, first), "the first router leads")
        second = start_router(tmp_path, "b", pg_url)
        routers.append(second)
        stopped = time.monotonic()
        first.proc.send_signal(signal.SIGSTOP)
        await until(lambda: leads(session, second), "the standby leads", timeout=20)
        took = time.monotonic() - stopped
        print(f"SIGSTOP of the leader: the standby led after {took:.2f} s")
        assert took < 15
        first.proc.send_signal(signal.SIGCONT)
        seen: list[int] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and first.proc.poll() is None:
            seen.append((await health(session, first))[0])
            await asyncio.sleep(0.02)
        assert 200 not in seen, seen
        await until(lambda: first.proc.poll() is not None, "the old leader stands down (exits)", timeout=15)
        assert first.proc.returncode == 1  # a failure: systemd's Restart=on-failure starts it again
        assert "lost the leadership" in first.log.read_text()
        assert (await health(session, second))[0] == 200


async def test_changes_through_the_standby_reach_the_leader_and_a_revoked_key_is_refused_at_once(
    tmp_path, pg_url, routers
):
    async with (
        FakeOpenAI(flavor="vllm", models=["llama3"], completion_tokens=10) as fake,
        aiohttp.ClientSession() as session,
    ):
        first = start_router(tmp_path, "a", pg_url)
        routers.append(first)
        await until(lambda: leads(session, first), "the first router leads")
        second = start_router(tmp_path, "b", pg_url)
        routers.append(second)
        assert (await amr(first.config, "backend", "add", "gpu1", fake.url, "--engine", "vllm")).returncode == 0
        assert (await amr(first.config, "user", "add", "ann", "--group", "staff")).returncode == 0
        key = json.loads((await amr(first.config, "user", "key", "ann", "--json")).stdout)["key"]
        await until(lambda: serves(session, first, key), "the leader serves ann")
        # A model alias set through the standby: the leader serves the new name at once.
        assert (await amr(second.config, "model", "alias", "fast", "llama3")).returncode == 0
        status, _, answer = await chat(session, first, key, model="fast")
        assert status == 200, answer

        # A backend moved to another server through the standby: the leader talks to the new one.
        async with FakeOpenAI(flavor="vllm", models=["llama3"], completion_tokens=10) as moved:
            lab = tmp_path / "lab.toml"
            assert (await amr(second.config, "export", "-o", str(lab))).returncode == 0
            lab.write_text(lab.read_text().replace(fake.url, moved.url))
            assert (await amr(second.config, "import", str(lab))).returncode == 0
            await until(lambda: serves(session, first, key), "the leader serves ann")
            assert len(moved.received) == 1 and (await chat(session, first, key))[0] == 200
            assert len(moved.received) == 2

        keys = json.loads((await amr(second.config, "user", "keys", "ann", "--json")).stdout)
        assert (await amr(second.config, "user", "key", "ann", "--revoke", str(keys[0]["id"]))).returncode == 0
        assert (await chat(session, first, key))[0] == 401


async def test_a_new_leader_holds_the_slots_a_frozen_leaders_generations_still_use(tmp_path, pg_url, routers):
    """Until the engine's gauges say the old leader's generations ended, the new leader sends nothing there."""
    async with (
        FakeOpenAI(flavor="vllm", models=["llama3"], completion_tokens=80, tokens_per_second=10) as fake,
        aiohttp.ClientSession() as session,
    ):
        first = start_router(tmp_path, "a", pg_url)
        routers.append(first)
        await until(lambda: leads(session, first), "the first router leads")
        second = start_router(tmp_path, "b", pg_url)
        routers.append(second)
        add = ("backend", "add", "gpu1", fake.url, "--engine", "vllm", "--max-concurrent", "1")
        assert (await amr(first.config, *add)).returncode == 0
        assert (await amr(first.config, "user", "add", "ann", "--group", "staff")).returncode == 0
        key = json.loads((await amr(first.config, "user", "key", "ann", "--json")).stdout)["key"]
        body = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        headers = {"Authorization": f"Bearer {key}"}

        async def long_stream() -> None:
            async with session.post(f"{first.url}/v1/chat/completions", json=body, headers=headers) as r:
                await r.read()

        streaming = asyncio.create_task(long_stream())
        await until(lambda: fake.running == 1, "the leader's 8 s generation runs")
        first.proc.send_signal(signal.SIGSTOP)
        await until(lambda: leads(session, second), "the standby leads", timeout=20)
        assert fake.running == 1  # the frozen leader's generation still runs at the engine
        status, _, answer = await chat(session, second, key)
        assert status == 200 and answer["usage"]["completion_tokens"] == 10
        assert fake.max_seen_in_flight == 1  # it waited for the gauge to say the slot was free
        streaming.cancel()


async def test_a_new_leader_holds_an_ollama_slot_the_old_leaders_stream_had_for_one_generation_time(
    tmp_path, pg_url, routers
):
    """Ollama has no load gauge: the old leader's open stream (its usage_open row) keeps its slot busy
    for takeover_hold_seconds, so the new leader does not run a second generation beside it."""
    hold = "takeover_hold_seconds = 12\n"
    async with (
        FakeOllama(models=["llama3"], completion_tokens=100, tokens_per_second=10) as fake,
        aiohttp.ClientSession() as session,
    ):
        first = start_router(tmp_path, "a", pg_url, hold)
        routers.append(first)
        await until(lambda: leads(session, first), "the first router leads")
        second = start_router(tmp_path, "b", pg_url, hold)
        routers.append(second)
        add = ("backend", "add", "gpu1", fake.url, "--engine", "ollama", "--max-concurrent", "1")
        assert (await amr(first.config, *add)).returncode == 0
        assert (await amr(first.config, "user", "add", "ann", "--group", "staff")).returncode == 0
        key = json.loads((await amr(first.config, "user", "key", "ann", "--json")).stdout)["key"]
        body = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        headers = {"Authorization": f"Bearer {key}"}

        async def long_stream() -> None:
            async with session.post(f"{first.url}/v1/chat/completions", json=body, headers=headers) as r:
                await r.read()

        streaming = asyncio.create_task(long_stream())
        await until(lambda: open_streams(pg_url) == 1, "the leader's 10 s generation is recorded as it streams")
        first.proc.send_signal(signal.SIGSTOP)
        await until(lambda: leads(session, second), "the standby leads", timeout=20)
        assert fake.running == 1  # the frozen leader's generation still runs at the engine
        status, _, answer = await chat(session, second, key)
        assert status == 200 and answer["usage"]["completion_tokens"] == 10
        assert fake.max_seen_in_flight == 1  # it waited for the held slot, never two at once
        streaming.cancel()


def open_streams(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM usage_open").fetchone()[0]


@pytest.mark.shares
async def test_fair_shares_1_to_3_hold_across_a_takeover(tmp_path, pg_url, routers):
    """Weights 1 and 3 on one busy slot: 25% and 75% of the tokens before a SIGKILL of the leader and after."""
    async with (
        FakeOpenAI(flavor="vllm", models=["llama3"], tokens_per_second=200, completion_tokens=20) as fake,
        aiohttp.ClientSession() as session,
    ):
        first = start_router(tmp_path, "a", pg_url)
        routers.append(first)
        await until(lambda: leads(session, first), "the first router leads")
        second = start_router(tmp_path, "b", pg_url)
        routers.append(second)
        add = ("backend", "add", "gpu1", fake.url, "--engine", "vllm", "--max-concurrent", "1")
        assert (await amr(first.config, *add)).returncode == 0
        keys = {}
        for name, weight in (("ann", "1"), ("bob", "3")):
            assert (
                await amr(first.config, "user", "add", name, "--group", "staff", "--weight", weight)
            ).returncode == 0
            keys[name] = json.loads((await amr(first.config, "user", "key", name, "--json")).stdout)["key"]
        tokens = {phase: {"ann": 0, "bob": 0} for phase in ("before", "after")}
        phase = {"now": "warmup", "leader": first}

        async def worker(name: str) -> None:
            while phase["now"] != "done":
                router = phase["leader"]
                try:
                    status, _, answer = await chat(session, router, keys[name])
                except aiohttp.ClientError:
                    status = 0
                if status == 200 and phase["now"] in tokens:
                    tokens[phase["now"]][name] += answer["usage"]["total_tokens"]
                elif status != 200:
                    await asyncio.sleep(0.05)

        workers = [asyncio.create_task(worker(name)) for name in ("ann", "bob") for _ in range(3)]
        await asyncio.sleep(2)
        phase["now"] = "before"
        await asyncio.sleep(6)
        phase["now"] = "takeover"
        first.proc.kill()
        phase["leader"] = second
        await until(lambda: leads(session, second), "the standby leads", timeout=15)
        phase["now"] = "after"
        await asyncio.sleep(6)
        phase["now"] = "done"
        await asyncio.gather(*workers)
        for when, used in tokens.items():
            share = used["bob"] / (used["ann"] + used["bob"])
            print(f"{when} the takeover: bob (weight 3) had {share:.0%} of {used['ann'] + used['bob']} tokens")
            assert 0.68 <= share <= 0.82, (when, used)


async def test_a_web_ui_session_holds_on_the_other_router_and_after_a_takeover(tmp_path, pg_url, routers):
    """Sessions live in the shared store: one login serves both routers, survives the leader's SIGKILL,
    and a logout on one router ends it on the other."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
        first = start_router(tmp_path, "a", pg_url)
        routers.append(first)
        await until(lambda: leads(session, first), "the first router leads")
        second = start_router(tmp_path, "b", pg_url)
        routers.append(second)
        assert (await amr(first.config, "user", "add", "ann", "--group", "staff")).returncode == 0
        key = json.loads((await amr(first.config, "user", "key", "ann", "--json")).stdout)["key"]
        async with session.post(
            f"{first.url}/ui/login", data={"key": key, "csrf": "t"}, cookies={LOGIN_COOKIE: "t"}, allow_redirects=False
        ) as r:
            assert r.status == 303, await r.text()
            token = r.cookies[COOKIE].value

        async def me(router: Router) -> int:
            async with session.get(f"{router.url}/ui/me", cookies={COOKIE: token}, allow_redirects=False) as r:
                return r.status

        assert await me(second) == 200
        first.proc.kill()
        await until(lambda: leads(session, second), "the standby leads", timeout=15)
        assert await me(second) == 200
        third = start_router(tmp_path, "c", pg_url)
        routers.append(third)
        await until(lambda: me(third), "the third router answers")
        assert await me(third) == 200
        async with session.get(f"{third.url}/ui/me", cookies={COOKIE: token}) as r:
            csrf = re.search(r'name="csrf" value="([^"]+)"', await r.text())
        assert csrf is not None
        async with session.post(
            f"{third.url}/ui/logout", data={"csrf": csrf[1]}, cookies={COOKIE: token}, allow_redirects=False
        ) as r:
            assert r.status == 303
        assert await me(second) == 303
