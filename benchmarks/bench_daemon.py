"""`mr serve` side by side with a bare aiohttp proxy (and LiteLLM's proxy), in one run.

Starts, on 127.0.0.1: a fake OpenAI backend that answers at once
(`_servers.py`), the bare pass-through proxy in front of it, `mr serve`
(temporary state) in front of it, and, when ``MR_BENCH_LITELLM`` names a
virtualenv with LiteLLM installed, LiteLLM's proxy in front of it. For JSON
answers and 20-chunk streams, at 1, 16 and 64 concurrent clients, it measures
requests/s, p50 and p99 latency (the whole answer) and each proxy's CPU time
per request (from /proc), then prints the ratios to the bare proxy against the
targets (issue 11):

- router CPU per request <= 1.3x the bare proxy's;
- p99 at 16 and 64 clients <= 2x the bare proxy's;
- requests/s at 16 and 64 clients >= 0.75x the bare proxy's;
- added p50 at one client <= 0.3 ms over the bare proxy's.

    python benchmarks/bench_daemon.py [--seconds 4] [--loop uvloop|asyncio] [--pin] [--rounds 1] [--against TREE]
        [--store-url URL]

``--against TREE`` also runs the `mr serve` of another source tree (a checkout of main, say), as
"mr serve (TREE)", in the same run, beside this tree's, and prints its CPU per request beside this
tree's: a change measured against what it changes, on the same machine at the same time.

``--store-url postgresql://...`` (an empty database) adds a `mr serve` that keeps its state
there ("mr serve pg"), and prints its CPU per request over the SQLite one's (issue 33:
<= 1.3x). Its CPU counts its database sessions' server processes too (found in
``pg_stat_activity``; the server must run on this machine), as SQLite's work is in the router.

``--rounds N`` measures every cell N times and then prints, at 16 and 64
clients, the median and range over the rounds of mr serve's CPU per request,
p50 and p99 over the bare proxy's (issue 20: p99 <= 2x), and its tail factor:
its own p99/p50 over the proxy's. A round takes about a minute.

All traffic stays on loopback and every run is bounded in time. The load
generator shares the machine, so figures on a busy machine are noisy. By
default every process shares every core, so in the closed loops at 16 and 64
clients a router's latency follows its CPU per request and that of the load
generator and backend beside it. ``--pin`` gives the routers (the bare proxy,
mr serve, LiteLLM) the last core and the load generator and backend the
others, as in a lab where clients and inference servers are other machines.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import tomli_w

HERE = Path(__file__).parent
CLIENTS = (1, 16, 64)
MODES = ("json", "stream")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate the processes, then kill any still there after 10 s."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


async def wait_http(url: str, timeout: float = 60.0, below: int = 500) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(url) as r:
                    if r.status < below:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


async def run(url: str, headers: dict[str, str], mode: str, clients: int, seconds: float) -> tuple[int, list[float]]:
    """Requests done and each one's latency (seconds), with ``clients`` workers for ``seconds``."""
    body = {"model": "bench", "messages": [{"role": "user", "content": "one two three"}], "stream": mode == "stream"}
    stop = time.monotonic() + seconds
    latencies: list[float] = []

    async def worker(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            async with session.post(url, json=body, headers=headers) as r:
                await r.read()
                assert r.status == 200, (url, r.status)
            latencies.append(time.perf_counter() - t0)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(worker(session) for _ in range(clients)))
    return len(latencies), latencies


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] * 1000


async def launch_daemon(
    tmp: Path, loop: str, settings: dict[str, dict[str, Any]] | None = None, command: list[str] | None = None
) -> tuple[subprocess.Popen[bytes], int, Path]:
    """`mr serve` with temporary state and ``settings`` (TOML sections) on a free port: process, port, socket.

    ``command`` runs the daemon some other way (it is given ``--config PATH``); default ``mr serve``.
    """
    port, sock = free_port(), tmp / "mr.sock"
    config: dict[str, dict[str, Any]] = {
        "server": {
            "port": port,
            "socket": str(sock),
            "state_dir": str(tmp / "state"),
            "log_level": "warning",
            "discover": False,
        },
        "scheduler": {"max_queued_per_user": 100000},
    }
    for section, values in (settings or {}).items():
        config.setdefault(section, {}).update(values)
    (tmp / "config.toml").write_text(tomli_w.dumps(config))
    env = {**os.environ, "MR_EVENT_LOOP": loop}
    daemon = subprocess.Popen(
        [*(command or [sys.executable, "-m", "mindrouter.cli", "serve"]), "--config", str(tmp / "config.toml")],
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=tmp,  # not the caller's folder: a mindrouter/ there would shadow PYTHONPATH=<tree> for `python -m`
    )
    await wait_http(f"http://127.0.0.1:{port}/api/version")
    if config.get("store", {}).get("url"):  # a router on PostgreSQL serves once it leads
        await wait_http(f"http://127.0.0.1:{port}/health", below=300)
    return daemon, port, sock


async def admin_call(sock: Path, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """One call to the daemon's admin API over its Unix socket; the JSON answer (asserts 2xx)."""
    async with (
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock))) as admin,
        admin.request(method, f"http://mr{path}", json=body) as r,
    ):
        assert r.status < 300, (path, r.status, await r.text())
        return await r.json()


async def start_daemon(
    tmp: Path, backend_url: str, loop: str, command: list[str] | None = None, store_url: str = ""
) -> tuple[subprocess.Popen[bytes], str, dict[str, str]]:
    settings = {"store": {"url": store_url}} if store_url else None
    daemon, port, sock = await launch_daemon(tmp, loop, settings, command=command)
    backend = {"name": "fast", "url": backend_url, "engine": "openai", "max_concurrent": 256}
    await admin_call(sock, "POST", "/admin/backends", backend)
    await admin_call(sock, "POST", "/admin/users", {"name": "bench", "group": "staff"})
    key = (await admin_call(sock, "POST", "/admin/users/bench/keys"))["key"]
    return daemon, f"http://127.0.0.1:{port}/v1/chat/completions", {"Authorization": f"Bearer {key}"}


LITELLM_KEY = "sk-mr-bench-local"
"""The master key LiteLLM's proxy is started with (recent versions refuse to start without one)."""
LITELLM_AUTH = {"Authorization": f"Bearer {LITELLM_KEY}"}


async def start_litellm_config(venv: str, tmp: Path, config_yaml: str) -> tuple[subprocess.Popen[bytes], str]:
    """LiteLLM's proxy from ``venv`` with ``config_yaml`` (plus its master key): the process and its base URL.

    ``LITELLM_LOCAL_MODEL_COST_MAP`` keeps it from fetching its price list from the internet at start.
    """
    port = free_port()
    (tmp / "litellm.yaml").write_text(config_yaml + f"general_settings:\n  master_key: {LITELLM_KEY}\n")
    proc = subprocess.Popen(
        [str(Path(venv) / "bin" / "litellm"), "--config", str(tmp / "litellm.yaml"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    await wait_http(f"http://127.0.0.1:{port}/health/liveliness", timeout=120)
    return proc, f"http://127.0.0.1:{port}"


async def start_litellm(venv: str, tmp: Path, backend_url: str) -> tuple[subprocess.Popen[bytes], str]:
    proc, url = await start_litellm_config(
        venv,
        tmp,
        "model_list:\n  - model_name: bench\n    litellm_params:\n"
        f"      model: openai/bench\n      api_base: {backend_url}/v1\n      api_key: none\n",
    )
    return proc, f"{url}/v1/chat/completions"


def pin(routers: list[int], others: list[int]) -> str:
    """Routers on the last core, the rest on the others: what the run's header says of it."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--pin needs at least 2 cores.")
    for pid in routers:
        os.sched_setaffinity(pid, cores[-1:])
    for pid in others:
        os.sched_setaffinity(pid, cores[:-1])
    return f"routers on core {cores[-1]}, load generator and backend on {len(cores) - 1} other core(s)"


def store_sessions(store_url: str) -> tuple[int, ...]:
    """The server processes of mindrouter's sessions on ``store_url``'s PostgreSQL (all on this machine)."""
    import psycopg

    with psycopg.connect(store_url) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'mindrouter%'").fetchall()
    return tuple(r[0] for r in rows)


Target = tuple[str, dict[str, str], tuple[int, ...]]
"""A router's URL, headers and processes whose CPU it costs (the first is the router; none: the backend)."""

Results = dict[tuple[str, str, int], tuple[float, float, float, float | None]]
"""(mode, router, clients) -> requests/s, p50 ms, p99 ms, CPU ms per request (None for the backend)."""


async def measure(targets: dict[str, Target], seconds: float) -> Results:
    """Every cell once, each router right after the other, printed as it goes."""
    results: Results = {}
    for mode in MODES:
        print(f"\n{mode}: {'':<10} {'clients':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/req':>10}")
        for clients in CLIENTS:
            for name, (url, headers, pids) in targets.items():
                await run(url, headers, mode, clients, 0.3)  # warm up
                cpu0 = sum(map(cpu_seconds, pids))
                t0 = time.monotonic()
                n, lat = await run(url, headers, mode, clients, seconds)
                rps = n / (time.monotonic() - t0)
                cpu = (sum(map(cpu_seconds, pids)) - cpu0) / n * 1000 if pids else None
                results[mode, name, clients] = (rps, pct(lat, 0.5), pct(lat, 0.99), cpu)
                cpu_text = f"{cpu:>10.3f}" if cpu is not None else f"{'':>10}"
                print(
                    f"{'':>6}{name:<10} {clients:>7} {rps:>8,.0f} {pct(lat, 0.5):>8.3f} {pct(lat, 0.99):>8.3f} "
                    f"{cpu_text}"
                )
    return results


def against_proxy(results: Results, litellm: bool) -> None:
    print("\nmr serve against the bare proxy (target in brackets):")
    for mode in MODES:
        cpu = [results[mode, "mr serve", c][3] / results[mode, "bare proxy", c][3] for c in CLIENTS]  # type: ignore[operator]
        added = results[mode, "mr serve", 1][1] - results[mode, "bare proxy", 1][1]
        line = f"  {mode:<6} CPU/request {max(cpu):.2f}x [<= 1.3]  added p50 at 1 client {added:+.3f} ms [<= 0.3]"
        for c in (16, 64):
            m, p = results[mode, "mr serve", c], results[mode, "bare proxy", c]
            line += f"  {c} clients: req/s {m[0] / p[0]:.2f}x [>= 0.75], p99 {m[2] / p[2]:.2f}x [<= 2]"
        print(line)
        if litellm:
            lite = results[mode, "litellm", 16]
            print(f"  {mode:<6} LiteLLM at 16 clients: {lite[0]:,.0f} req/s, CPU {lite[3]:.3f} ms/request")


def against_tree(rounds: list[Results], other: str) -> None:
    """This tree's CPU per request over the other tree's, each cell's median over the rounds (and range)."""
    print(f"\nmr serve (this tree) against {other}: CPU ms per request, median of {len(rounds)} round(s)")
    for mode in MODES:
        cells = []
        for c in CLIENTS:
            ratios = sorted(r[mode, "mr serve", c][3] / r[mode, other, c][3] for r in rounds)  # type: ignore[operator]
            mine = statistics.median(r[mode, "mr serve", c][3] for r in rounds)  # type: ignore[type-var]
            theirs = statistics.median(r[mode, other, c][3] for r in rounds)  # type: ignore[type-var]
            spread = f" [{ratios[0]:.2f}-{ratios[-1]:.2f}]" if len(ratios) > 1 else ""
            cells.append(f"{c} clients {mine:.3f} vs {theirs:.3f} = {statistics.median(ratios):.2f}x{spread}")
        print(f"  {mode:<6} " + "; ".join(cells))


def against_sqlite(results: Results) -> None:
    print("\nmr serve on PostgreSQL (router and its database sessions) against mr serve on SQLite:")
    for mode in MODES:
        cpu = [results[mode, "mr serve pg", c][3] / results[mode, "mr serve", c][3] for c in CLIENTS]  # type: ignore[operator]
        cells = ", ".join(f"{c} clients {x:.2f}x" for c, x in zip(CLIENTS, cpu, strict=True))
        print(f"  {mode:<6} CPU/request {cells} [<= 1.3]")


def across_rounds(rounds: list[Results]) -> None:
    """Medians over the rounds, ranges in brackets; the tail factor is mr serve's p99/p50 over the proxy's.

    In these closed loops the p50 ratio follows the routers' CPU per request (and the share of a core
    each gets); a tail factor at or under 1 says mr serve adds no tail beyond that.
    """

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"

    print(f"\nacross {len(rounds)} rounds, mr serve over the bare proxy: median (range)")
    print(f"  {'':<6} {'clients':>7}  {'CPU/request':<18} {'p50':<18} {'p99 [<= 2]':<18} {'tail factor':<18}")
    for mode in MODES:
        for c in (16, 64):
            m = [r[mode, "mr serve", c] for r in rounds]
            p = [r[mode, "bare proxy", c] for r in rounds]
            cpu = [a[3] / b[3] for a, b in zip(m, p, strict=True)]  # type: ignore[operator]
            p50 = [a[1] / b[1] for a, b in zip(m, p, strict=True)]
            p99 = [a[2] / b[2] for a, b in zip(m, p, strict=True)]
            tail = [(a[2] / a[1]) / (b[2] / b[1]) for a, b in zip(m, p, strict=True)]
            print(f"  {mode:<6} {c:>7}  {cell(cpu):<18} {cell(p50):<18} {cell(p99):<18} {cell(tail):<18}")


async def main(
    seconds: float, loop: str, pinned: bool, rounds: int, against: Path | None = None, store_url: str = ""
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="mr-bench-"))
    bport, pport = free_port(), free_port()
    backend_url = f"http://127.0.0.1:{bport}"
    procs = [
        subprocess.Popen([sys.executable, str(HERE / "_servers.py"), "backend", str(bport)]),
        subprocess.Popen([sys.executable, str(HERE / "_servers.py"), "proxy", str(pport), backend_url]),
    ]
    try:
        await wait_http(backend_url + "/v1/models")
        await wait_http(f"http://127.0.0.1:{pport}/v1/chat/completions")
        daemon, daemon_url, auth = await start_daemon(tmp, backend_url, loop)
        procs.append(daemon)
        targets: dict[str, Target] = {
            "backend": (backend_url + "/v1/chat/completions", {}, ()),
            "bare proxy": (f"http://127.0.0.1:{pport}/v1/chat/completions", {}, (procs[1].pid,)),
            "mr serve": (daemon_url, auth, (daemon.pid,)),
        }
        if store_url:
            (tmp / "pg").mkdir()
            pg, pg_url, pg_auth = await start_daemon(tmp / "pg", backend_url, loop, store_url=store_url)
            procs.append(pg)
            targets["mr serve pg"] = (pg_url, pg_auth, (pg.pid, *store_sessions(store_url)))
        other = None
        if against is not None:  # its own state folder, and its own tree first on the path
            other = f"mr serve ({against.name})"
            (tmp / "against").mkdir()
            command = ["env", f"PYTHONPATH={against}", sys.executable, "-m", "mindrouter.cli", "serve"]
            theirs, theirs_url, theirs_auth = await start_daemon(tmp / "against", backend_url, loop, command)
            procs.append(theirs)
            targets[other] = (theirs_url, theirs_auth, (theirs.pid,))
        if os.environ.get("MR_BENCH_LITELLM"):
            litellm, litellm_url = await start_litellm(os.environ["MR_BENCH_LITELLM"], tmp, backend_url)
            procs.append(litellm)
            targets["litellm"] = (litellm_url, LITELLM_AUTH, (litellm.pid,))
        for url, headers, _ in targets.values():  # first-use costs (connections, caches) stay out of the cells
            for mode in MODES:
                await run(url, headers, mode, 16, 0.5)
        where = "every core shared with the load generator and backend"
        if pinned:
            routers = [pids[0] for _, _, pids in targets.values() if pids]
            where = pin(routers, [os.getpid(), procs[0].pid])
        print(f"mr serve event loop: {loop}; {seconds:g} s per cell; {where}")
        rounds_seen: list[Results] = []
        for i in range(rounds):
            if rounds > 1:
                print(f"\nround {i + 1} of {rounds}")
            rounds_seen.append(await measure(targets, seconds))
            against_proxy(rounds_seen[-1], "litellm" in targets)
            if store_url:
                against_sqlite(rounds_seen[-1])
        if rounds > 1:
            across_rounds(rounds_seen)
        if other is not None:
            against_tree(rounds_seen, other)
    finally:
        stop_all(procs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="duration of each cell")
    parser.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        help="mr serve's event loop (default: uvloop when installed, the [fast] extra)",
    )
    parser.add_argument(
        "--pin", action="store_true", help="routers on a core of their own, load generator and backend on the others"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="measure every cell this many times; print medians over the rounds"
    )
    parser.add_argument(
        "--against", type=Path, help="also run the mr serve of this source tree (a checkout), in the same run"
    )
    parser.add_argument(
        "--store-url", default="", help="also measure mr serve with its state in this (empty) PostgreSQL database"
    )
    args = parser.parse_args()
    asyncio.run(
        main(args.seconds, args.loop, args.pin, args.rounds, args.against and args.against.resolve(), args.store_url)
    )
