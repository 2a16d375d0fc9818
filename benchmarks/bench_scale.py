"""One `mr serve` at a campus's size, side by side with an earlier commit (issue 33, "one machine first").

Measures, in one run, for this tree and for ``--against`` (default: the last commit before this work):

- the event loop's time per ``GET /v1/me``, ``/metrics`` (with per-user series), ``/admin/share``
  (`mr share`) and ``/ui/me`` with ``--users`` registered users of whom ``--active`` are active in
  the fairness window (target: <= 5 ms each). Loop time is the CPU time of the loop's thread per
  request, less that of a ``GET /health`` (the client shares the loop), so work a handler hands
  to another thread does not count, and the loop is free meanwhile;
- the longest the loop stalls while `mr usage` reports run over ``--rows`` usage rows, and while
  retention deletes the half of them that a shorter ``usage_retention_days`` leaves behind as
  ``--rate`` requests/s go on for ``--seconds`` (target: no request waits more than 20 ms). A task
  that wakes every millisecond measures it: the longest gap between its wake-ups less the
  millisecond, and how many gaps passed 20 ms, shown next to the same with nothing else to do (the
  machine's own noise). The loop time of `mr share` includes the bench client's read of its answer
  (2.7 MB at 10,000 users) on the same loop. Next to each, the longest garbage collection meanwhile
  (it holds the GIL, on whichever thread it runs, and the loop waits). The same requests are also sent
  with nothing to delete, so what retention adds can be told from the requests' own cost (the client,
  the daemon and the fake backend share the loop). Each stall over 15 ms is printed with the loop
  thread's CPU time in it and the process's: a loop that stood still while the process ran waited for
  the GIL (another thread held it); one whose own CPU fills the stall was busy with its own work.

The daemon's heap is settled as `mr serve` settles it once it listens (``settle_process``: start-up's
objects frozen, young collections every 7,000 allocations, the GIL handed over after 1 ms); ``--unfrozen``
leaves it as built, as this bench did before (its full collections walked every user's start-up objects:
40-170 ms).

Usage rows are written straight into the store's table, sorted by time, with ``executemany`` in
one transaction (about 200,000 rows/s), over the ``--days`` before the fairness window.

    python benchmarks/bench_scale.py                          # 10,000 users, 1 M rows
    python benchmarks/bench_scale.py --rows 10000000          # the issue's 10 M rows (minutes to fill)
    python benchmarks/bench_scale.py --against main --only    # --only: this tree alone
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BEFORE = "ed43228"
"""main just before issue 33's one-machine work."""
ADMIN_KEY = "bench-admin-key"
DAY = 86_400.0
MODELS = ["llama3.2", "qwen2.5:7b", "mistral"]


def _fill(store: Any, users: list[tuple[int, str]], backend: int, rows: int, days: float, now: float) -> float:
    """``rows`` usage rows over ``days`` ending 10 minutes ago, oldest first; returns rows per second."""
    rng = random.Random(7)
    sql = (
        "INSERT INTO usage (at, user_id, request_id, model, backend_id, prompt_tokens, completion_tokens,"
        " gpu_seconds, group_name) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    start, span = now - 600 - days * DAY, days * DAY
    began = time.perf_counter()
    db = store._db
    db.execute("BEGIN")
    batch = 200_000
    for first in range(0, rows, batch):
        params = []
        for n in range(first, min(rows, first + batch)):
            uid, group = users[int(rng.paretovariate(1.1)) % len(users)]
            at = start + span * n / rows
            params.append((at, uid, f"r{n}", MODELS[n % 3], backend, 200 + n % 900, 1 + n % 400, 0.5, group))
        db.executemany(sql, params)
    db.execute("COMMIT")
    store.roll_usage()
    return rows / (time.perf_counter() - began)


class _Stalls:
    """Wakes every millisecond and keeps the longest gap past it: how long the loop was busy elsewhere;
    and the longest garbage collection meanwhile, on any thread."""

    def __init__(self) -> None:
        self.gaps: list[float] = []
        self.long: list[tuple[float, float, float]] = []
        """Gaps over 15 ms: (gap, the loop thread's CPU time in it, the process's)."""
        self.longest_gc = 0.0
        self._task: asyncio.Task[None] | None = None
        self._gc_began = 0.0

    def _collecting(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_began = time.perf_counter()
        else:
            self.longest_gc = max(self.longest_gc, time.perf_counter() - self._gc_began)

    @property
    def worst(self) -> float:
        return max(self.gaps, default=0.0)

    @property
    def over_20ms(self) -> int:
        """Stalls over 20 ms: on a shared machine the longest one may be another process's."""
        return sum(1 for gap in self.gaps if gap > 0.020)

    async def _run(self) -> None:
        last, loop_cpu, cpu = time.perf_counter(), time.thread_time(), time.process_time()
        while True:
            await asyncio.sleep(0.001)
            now, loop_now, cpu_now = time.perf_counter(), time.thread_time(), time.process_time()
            gap = now - last - 0.001
            self.gaps.append(gap)
            if gap > 0.015:
                self.long.append((gap, loop_now - loop_cpu, cpu_now - cpu))
            last, loop_cpu, cpu = now, loop_now, cpu_now

    def __enter__(self) -> _Stalls:
        self._task = asyncio.get_running_loop().create_task(self._run())
        gc.callbacks.append(self._collecting)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        gc.callbacks.remove(self._collecting)


def _settle() -> None:
    """What `mr serve` does once it listens (each tree's own code)."""
    try:
        from mindrouter.daemon.process.serve import settle_process
    except ImportError:
        _settle_heap_before()
    else:
        settle_process()


def _settle_heap_before() -> None:
    """Before `mr serve` set the GIL's switch interval."""
    try:
        from mindrouter.daemon.process.serve import settle_heap
    except ImportError:  # before this work: the same three steps inline in serve
        try:
            from mindrouter.daemon.process.serve import YOUNG_COLLECTION_EVERY as young
        except ImportError:  # before issue 29's layers
            from mindrouter.daemon.edge.app import YOUNG_COLLECTION_EVERY as young
        gc.collect()
        gc.freeze()
        gc.set_threshold(young)
    else:
        settle_heap()


async def _daemon(tmp: Path, retention_days: float, frozen: bool) -> tuple[Any, str]:
    from aiohttp.test_utils import TestServer

    from mindrouter.config import BackendSettings, Config, ServerSettings

    try:
        from mindrouter.daemon.process.app import create_app
    except ImportError:  # before issue 29's layers
        from mindrouter.daemon.edge.app import create_app  # type: ignore[no-redef]

    config = Config(
        server=ServerSettings(
            state_dir=str(tmp / "state"),
            socket=str(tmp / "mr.sock"),
            admin_key=ADMIN_KEY,
            discover=False,
            usage_retention_days=retention_days,
        ),
        backends=BackendSettings(poll_interval=5.0),
    )
    app = await create_app(config)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    if frozen:
        _settle()
    return server, str(server.make_url("")).rstrip("/")


async def _loop_ms(client: Any, url: str, headers: dict[str, str], loads: int) -> float:
    """CPU time of this thread per GET of ``url``, in ms."""
    start = time.thread_time()
    for _ in range(loads):
        async with client.get(url, headers=headers) as resp:
            await resp.read()
            assert resp.status == 200, (url, resp.status)
    return (time.thread_time() - start) * 1000 / loads


def _record(out: dict[str, Any], key: str, stalls: _Stalls) -> None:
    out[f"{key}_stall_ms"] = stalls.worst * 1000
    out[f"{key}_gc_ms"] = stalls.longest_gc * 1000
    out[f"{key}_over_20ms"] = stalls.over_20ms
    out[f"{key}_long"] = stalls.long


async def _paced(send: Callable[[int], Awaitable[None]], rate: float, seconds: float) -> float:
    """``rate`` requests a second for ``seconds`` (a campus's peak, paced: the loop is not saturated); sent/s."""
    began = time.perf_counter()
    sent = []
    for n in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, began + n / rate - time.perf_counter()))
        sent.append(asyncio.ensure_future(send(n)))
    await asyncio.gather(*sent)
    return len(sent) / (time.perf_counter() - began)


async def measure(
    users: int,
    active: int,
    rows: int,
    days: float,
    loads: int,
    rate: float,
    seconds: float,
    frozen: bool,
    reports: int = 4,
) -> dict[str, Any]:
    import aiohttp
    from bench_ui import _fake_ollama, _login

    from mindrouter.store import Store

    out: dict[str, Any] = {}
    fake, ports = await _fake_ollama(1)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        store = Store(tmp / "state" / "mindrouter.db")
        store.ensure_default_groups({"student": 1.0, "staff": 2.0, "faculty": 3.0})
        groups = ["student", "staff", "faculty"]
        started = time.perf_counter()
        people = [(store.add_user(f"user{i:05d}", groups[i % 3]).id, groups[i % 3]) for i in range(users)]
        keys = [store.create_key(f"user{i:05d}") for i in range(active)]
        backend = store.add_backend("ws0", f"http://127.0.0.1:{ports[0]}", "ollama", max_concurrent=8).id
        out["fill_rows_per_s"] = _fill(store, people, backend, rows, days, time.time()) if rows else 0.0
        out["setup_s"] = time.perf_counter() - started
        store.close()

        server, base = await _daemon(tmp, retention_days=days + 10, frozen=frozen)
        try:
            async with aiohttp.ClientSession() as client:

                async def chat(key: str) -> None:
                    body = {"model": MODELS[0], "messages": [{"role": "user", "content": "hi"}]}
                    auth = {"Authorization": f"Bearer {key}"}
                    async with client.post(f"{base}/v1/chat/completions", json=body, headers=auth) as resp:
                        assert resp.status == 200, await resp.text()

                for key in keys:  # everyone active in the fairness window
                    await chat(key)
                mine = {"Authorization": f"Bearer {keys[0]}"}
                admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
                person = await _login(base, keys[0])
                boss = await _login(base, ADMIN_KEY)
                idle = await _loop_ms(client, f"{base}/health", {}, loads)
                few = max(3, loads // 5)
                out["loop_ms"] = {
                    "/v1/me": await _loop_ms(client, f"{base}/v1/me", mine, loads) - idle,
                    "/metrics": await _loop_ms(client, f"{base}/metrics", admin, loads) - idle,
                    "mr share": await _loop_ms(client, f"{base}/admin/share", admin, few) - idle,
                    "/ui/me": await _loop_ms(person, f"{base}/ui/me", {}, loads) - idle,
                    "mr status": await _loop_ms(client, f"{base}/admin/status", admin, loads) - idle,
                    "Live (/ui/admin/top)": await _loop_ms(boss, f"{base}/ui/admin/top", {}, few) - idle,
                    "Groups (/ui/admin/groups)": await _loop_ms(boss, f"{base}/ui/admin/groups", {}, few) - idle,
                    "mr group list": await _loop_ms(client, f"{base}/admin/groups", admin, few) - idle,
                    "mr user list (/admin/users)": await _loop_ms(client, f"{base}/admin/users", admin, few) - idle,
                }
                await person.close()
                await boss.close()
                with _Stalls() as quiet:
                    await asyncio.sleep(2.0)
                _record(out, "noise", quiet)
                with _Stalls() as stalls:
                    began = time.perf_counter()
                    kinds = (("user,model", "30d"), ("user", "365d"), ("day", "7d"), ("model", "1d"))
                    for n in range(reports):
                        by, since = kinds[n % len(kinds)]
                        async with client.get(f"{base}/admin/usage?by={by}&since={since}", headers=admin) as resp:
                            assert resp.status == 200, await resp.text()
                            await resp.read()
                    out["report_s"] = (time.perf_counter() - began) / reports
                _record(out, "report", stalls)
                with _Stalls() as alone:  # the same traffic as during retention, with nothing to delete
                    out["traffic_requests_per_s"] = await _paced(lambda n: chat(keys[n % len(keys)]), rate, seconds)
                _record(out, "traffic", alone)
        finally:
            await server.close()
        # Retention: half the rows are now past a shorter retention; requests go on meanwhile.
        server, base = await _daemon(tmp, retention_days=days / 2, frozen=frozen)
        db = sqlite3.connect(tmp / "state" / "mindrouter.db")  # the same with every commit's app
        try:
            async with aiohttp.ClientSession() as client:
                with _Stalls() as stalls:
                    out["retention_requests_per_s"] = await _paced(lambda n: chat(keys[n % len(keys)]), rate, seconds)
                _record(out, "retention", stalls)
                left = db.execute("SELECT count(*) FROM usage WHERE at < ?", (time.time() - days / 2 * DAY,))
                out["retention_rows_left"] = left.fetchone()[0]
        finally:
            db.close()
            await server.close()
    await fake.cleanup()
    return out


def _run(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Measure with the ``mindrouter`` package of ``tree`` in a process of its own (and its bench_ui.py), by
    this file's code."""
    script = tree / "benchmarks" / Path(__file__).name
    if script.resolve() != Path(__file__).resolve():  # the same measurement on both sides
        shutil.copy(__file__, script)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    flags = ["--users", str(args.users), "--active", str(args.active), "--rows", str(args.rows)]
    flags += ["--days", str(args.days), "--loads", str(args.loads), "--reports", str(args.reports), "--measure"]
    flags += ["--rate", str(args.rate), "--seconds", str(args.seconds)] + (["--unfrozen"] if args.unfrozen else [])
    done = subprocess.run([sys.executable, script, *flags], env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"the run in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _row(label: str, values: list[float | int | None], fmt: str) -> str:
    cells = "".join(f"{'-' if v is None else format(v, fmt):>14}" for v in values)
    return f"{label:44}{cells}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--active", type=int, default=50, help="users active in the fairness window")
    parser.add_argument("--rows", type=int, default=1_000_000, help="usage rows (the issue's figure: 10,000,000)")
    parser.add_argument("--days", type=float, default=28.0, help="days the usage rows span")
    parser.add_argument("--loads", type=int, default=30, help="requests a route is measured over")
    parser.add_argument("--reports", type=int, default=4, help="`mr usage` reports run one after another")
    parser.add_argument("--rate", type=float, default=200.0, help="requests/s sent while retention runs")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long they are sent")
    parser.add_argument("--against", default=BEFORE, help="git commit to compare with")
    parser.add_argument("--only", action="store_true", help="measure this tree alone")
    parser.add_argument("--unfrozen", action="store_true", help="leave the heap as built (as this bench did before)")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        figures = measure(
            args.users,
            args.active,
            args.rows,
            args.days,
            args.loads,
            args.rate,
            args.seconds,
            not args.unfrozen,
            args.reports,
        )
        print(json.dumps(asyncio.run(figures)))
        return
    runs = {"this tree": _run(ROOT, args)}
    if not args.only:
        with tempfile.TemporaryDirectory() as old:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.against], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", old], input=archive.stdout, check=True)
            runs = {args.against: _run(Path(old), args), **runs}
    results = list(runs.values())
    print(f"{args.users:,} users ({args.active} active), {args.rows:,} usage rows over {args.days:g} days")
    print(f"{'':44}" + "".join(f"{name:>14}" for name in runs))
    for route in results[0]["loop_ms"]:
        print(_row(f"loop ms per {route}", [r["loop_ms"].get(route) for r in results], ".2f"))
    phases = (
        ("noise", "nothing running"),
        ("report", f"{args.reports} `mr usage`"),
        ("traffic", "requests alone"),
        ("retention", "requests, retention"),
    )
    for key, label in phases:
        print(_row(f"longest stall, {label} (ms)", [r.get(f"{key}_stall_ms") for r in results], ".1f"))
    print(_row("one `mr usage` report (s)", [r["report_s"] for r in results], ".3f"))
    for key, label in phases:
        print(_row(f"longest collection, {label} (ms)", [r.get(f"{key}_gc_ms") for r in results], ".1f"))
    for key, label in phases:
        print(_row(f"stalls over 20 ms, {label}", [r.get(f"{key}_over_20ms") for r in results], "d"))
    for name, r in runs.items():
        for key, label in phases:
            for gap, loop_cpu, cpu in r.get(f"{key}_long", []):
                print(
                    f"{name}, {label}: a {gap * 1000:.1f} ms stall, {loop_cpu * 1000:.1f} ms of it the loop's CPU, "
                    f"{cpu * 1000:.1f} ms the process's"
                )
    print(_row("rows past retention left after it", [r["retention_rows_left"] for r in results], ",d"))
    for key in ("traffic", "retention"):
        print(_row(f"requests/s sent, {key}", [r.get(f"{key}_requests_per_s") for r in results], ".0f"))
    print(_row("fill (rows/s)", [r["fill_rows_per_s"] for r in results], ",.0f"))
    if len(results) == 2:
        for route in results[0]["loop_ms"]:
            before, after = results[0]["loop_ms"][route], results[1]["loop_ms"][route]
            print(f"{route}: loop time {after / max(before, 1e-6):.2f}x the first tree's")


if __name__ == "__main__":
    main()
