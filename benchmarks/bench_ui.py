"""How long each web UI page takes to render with 1,000 users and 50 backends in the pool (target: <= 100 ms).

    python benchmarks/bench_ui.py               # 1,000 users, 50 backends, 30 days, 30 loads a page
    python benchmarks/bench_ui.py --users 5000 --backends 100 --days 90 --loads 50

An in-process daemon on 127.0.0.1 over a minimal fake Ollama (one server
answering for all 50 backends); every user has a key, a quota and recent usage
in the fairness window, three requests a day over the last ``--days`` days in
the usage table (90,000 rows by default), and 300 requests went through, so the
live page, the usage page, the decisions and every user's row have something to show. Each page is
fetched over HTTP with an admin session (``/ui/me`` with a person's); the
figure is the time to the whole answer, client and server on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from mindrouter.config import BackendSettings, Config, ServerSettings
from mindrouter.daemon.edge.services import SERVICES
from mindrouter.daemon.process.app import create_app

ADMIN_KEY = "bench-admin-key"
MODELS = ["llama3.2", "qwen2.5:7b", "mistral"]


async def _fake_ollama(ports: int) -> tuple[web.AppRunner, list[int]]:
    """One fake Ollama answering on ``ports`` ports (the pool refuses two backends at one address)."""

    async def tags(_r: web.Request) -> web.Response:
        return web.json_response({"models": [{"name": m, "model": m, "size": 4_000_000_000} for m in MODELS]})

    async def ps(_r: web.Request) -> web.Response:
        return web.json_response({"models": [{"name": MODELS[0], "model": MODELS[0], "size_vram": 4_000_000_000}]})

    async def chat(r: web.Request) -> web.Response:
        body = await r.json()
        return web.json_response(
            {
                "model": body["model"],
                "created_at": "2026-12-04T00:00:00Z",
                "message": {"role": "assistant", "content": "ok ok"},
                "done": True,
                "done_reason": "stop",
                "prompt_eval_count": 12,
                "eval_count": 2,
            }
        )

    app = web.Application()
    app.router.add_get("/api/tags", tags)
    app.router.add_get("/api/ps", ps)
    app.router.add_get("/api/version", lambda _r: web.json_response({"version": "0.12.0"}))
    app.router.add_post("/api/show", lambda _r: web.json_response({"capabilities": ["completion"]}))
    app.router.add_post("/api/chat", chat)
    app.router.add_get("/", lambda _r: web.Response(text="Ollama is running"))
    runner = web.AppRunner(app)
    await runner.setup()
    for _ in range(ports):
        await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, [address[1] for address in runner.addresses]


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:300]
    return found.group(1)


async def _login(base: str, key: str) -> aiohttp.ClientSession:
    session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    form = await (await session.get(f"{base}/ui/login")).text()
    async with session.post(f"{base}/ui/login", data={"key": key, "csrf": _csrf(form)}) as resp:
        assert resp.status == 200, await resp.text()
    return session


def _history(store: object, users: int, backends: int, days: int, rng: random.Random) -> int:
    """Three requests a day per user over the last ``days`` days, on random models and backends; the rows made."""
    now = time.time()
    rows = []
    for user in store.list_users():  # type: ignore[attr-defined]
        for day in range(days):
            for _ in range(3):
                at = now - day * 86400 - rng.uniform(0, 86400)
                rows.append(
                    (
                        user.id,
                        f"h{len(rows)}",
                        rng.choice(MODELS),
                        rng.randint(1, backends),
                        rng.randint(10, 900),
                        rng.randint(10, 2000),
                        at,
                        rng.uniform(0.1, 20.0),
                        user.group,
                    )
                )
    for i in range(0, len(rows), 10_000):
        store.record_usages(rows[i : i + 10_000])  # type: ignore[attr-defined]
    return len(rows)


async def main(users: int, backends: int, days: int, loads: int) -> None:
    fake, ports = await _fake_ollama(backends)
    with tempfile.TemporaryDirectory() as tmp:
        config = Config(
            server=ServerSettings(
                state_dir=str(Path(tmp) / "state"),
                socket=str(Path(tmp) / "mr.sock"),
                admin_key=ADMIN_KEY,
                discover=False,
            ),
            backends=BackendSettings(poll_interval=5.0),
        )
        app = await create_app(config)
        store = app[SERVICES].store
        for i in range(backends):
            store.add_backend(f"ws{i:02d}", f"http://127.0.0.1:{ports[i]}", "ollama", max_concurrent=4)
        groups = ["student", "staff", "faculty"]
        keys = []
        for i in range(users):
            store.add_user(f"user{i:04d}", groups[i % 3])
            keys.append(store.create_key(f"user{i:04d}"))
            store.set_user_quota(f"user{i:04d}", {"tokens_per_day": 100_000})
        made = _history(store, users, backends, days, random.Random(7))
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        base = str(server.make_url("")).rstrip("/")
        try:
            rng = random.Random(21)
            async with aiohttp.ClientSession() as client:
                for _ in range(300):
                    key = rng.choice(keys)
                    async with client.post(
                        f"{base}/v1/chat/completions",
                        json={"model": rng.choice(MODELS), "messages": [{"role": "user", "content": "hi there"}]},
                        headers={"Authorization": f"Bearer {key}"},
                    ) as resp:
                        assert resp.status == 200, await resp.text()
            now = time.monotonic()
            for user in store.list_users():  # everyone active in the fairness window
                app[SERVICES].scheduler.add_usage(
                    user.id, 0, rng.randint(100, 5000), now - rng.uniform(0, 200), MODELS[0]
                )
            admin = await _login(base, ADMIN_KEY)
            person = await _login(base, keys[0])
            listing = await (await admin.get(f"{base}/ui/admin/decisions")).text()
            rid = re.search(r'href="/ui/admin/decisions/([^"]+)"', listing).group(1)  # type: ignore[union-attr]
            pages: list[tuple[str, aiohttp.ClientSession, str]] = [
                (path, admin, path)
                for path in (
                    "/ui/admin/top",
                    "/ui/admin/groups",
                    "/ui/admin/users",
                    "/ui/admin/users/user0001",
                    "/ui/admin/backends",
                    "/ui/admin/backends/ws01",
                    "/ui/admin/groups/student",
                    "/ui/admin/usage?by=user",
                    "/ui/admin/usage?by=group",
                    "/ui/admin/usage?by=model&metric=gpu_seconds",
                    "/ui/admin/usage?by=backend&days=90",
                    "/ui/admin/decisions",
                    "/ui/admin/decisions?outcome=ok&model=mistral",
                    f"/ui/admin/decisions/{rid}",
                )
            ] + [("/ui/me", person, "/ui/me")]
            print(f"{users} users, {backends} backends, {made:,} usage rows over {days} days, {loads} loads a page")
            print(f"{'page (ms to the whole answer)':46} {'median':>8} {'p95':>8} {'max':>8} {'KB':>6}")
            for label, session, path in pages:
                times = []
                size = 0
                for _ in range(loads):
                    start = time.perf_counter()
                    async with session.get(f"{base}{path}") as resp:
                        body = await resp.read()
                        assert resp.status == 200, (path, resp.status)
                    times.append((time.perf_counter() - start) * 1000)
                    size = len(body)
                times.sort()
                p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
                shown = "/ui/admin/decisions/{id}" if rid in label else label
                print(f"{shown:46} {statistics.median(times):8.1f} {p95:8.1f} {times[-1]:8.1f} {size / 1024:6.0f}")
            await admin.close()
            await person.close()
        finally:
            await server.close()
            await fake.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--backends", type=int, default=50)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--loads", type=int, default=30)
    args = parser.parse_args()
    asyncio.run(main(args.users, args.backends, args.days, args.loads))
