"""Added latency and throughput of `mr serve` against the backend alone and a bare proxy (DESIGN §9).

Starts, on 127.0.0.1: a fast fake OpenAI backend, a bare aiohttp pass-through
proxy in front of it, and `mr serve` (temporary state) in front of it; then
measures, side by side in one run:

- latency at one client (p50/p99, non-streaming; first chunk when streaming),
  direct vs proxy vs daemon, and the added overhead;
- requests/s at 16 and 64 concurrent clients, daemon vs bare proxy;
- the daemon's CPU time per request (from /proc).

    python benchmarks/bench_daemon.py [--seconds 5]

All traffic stays on loopback and every loop is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

HERE = Path(__file__).parent
BODY = {"model": "bench", "messages": [{"role": "user", "content": "one two three four five"}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_http(url: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(url) as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


async def latencies(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], n: int, stream: bool
) -> list[float]:
    out = []
    body = {**BODY, "stream": stream}
    for _ in range(n):
        t0 = time.perf_counter()
        async with session.post(url, json=body, headers=headers) as r:
            if stream:
                await r.content.readline()  # first SSE line
                out.append(time.perf_counter() - t0)
                await r.read()
            else:
                await r.read()
                out.append(time.perf_counter() - t0)
        assert r.status == 200, r.status
    return out


async def throughput(url: str, headers: dict[str, str], clients: int, seconds: float) -> tuple[float, int]:
    stop = time.monotonic() + seconds
    count = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal count
        while time.monotonic() < stop:
            async with session.post(url, json=BODY, headers=headers) as r:
                await r.read()
                assert r.status == 200, r.status
            count += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        t0 = time.monotonic()
        await asyncio.gather(*(worker(session) for _ in range(clients)))
        return count / (time.monotonic() - t0), count


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] * 1000


async def main(seconds: float, samples: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="mr-bench-"))
    bport, pport, dport = free_port(), free_port(), free_port()
    backend_url = f"http://127.0.0.1:{bport}"
    procs = [
        subprocess.Popen([sys.executable, str(HERE / "_servers.py"), "backend", str(bport)]),
        subprocess.Popen([sys.executable, str(HERE / "_servers.py"), "proxy", str(pport), backend_url]),
    ]
    sock = tmp / "mr.sock"
    (tmp / "config.toml").write_text(
        f'[server]\nport = {dport}\nsocket = "{sock}"\nstate_dir = "{tmp / "state"}"\nlog_level = "warning"\ndiscover = false\n[scheduler]\nmax_queued_per_user = 100000\n'
    )
    daemon = subprocess.Popen(
        [sys.executable, "-m", "mindrouter.cli", "serve", "--config", str(tmp / "config.toml")],
        stderr=subprocess.DEVNULL,
    )
    procs.append(daemon)
    try:
        await wait_http(backend_url + "/v1/models")
        await wait_http(f"http://127.0.0.1:{pport}/v1/chat/completions")
        await wait_http(f"http://127.0.0.1:{dport}/api/version")
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock))) as admin:
            async with admin.post(
                "http://mr/admin/backends",
                json={"name": "fast", "url": backend_url, "engine": "openai", "max_concurrent": 256},
            ) as r:
                assert r.status == 201, await r.text()
            async with admin.post("http://mr/admin/users", json={"name": "bench", "group": "staff"}) as r:
                assert r.status == 201
            async with admin.post("http://mr/admin/users/bench/keys") as r:
                key = (await r.json())["key"]
        auth = {"Authorization": f"Bearer {key}"}
        targets = {
            "direct": (backend_url + "/v1/chat/completions", {}),
            "bare proxy": (f"http://127.0.0.1:{pport}/v1/chat/completions", {}),
            "mr serve": (f"http://127.0.0.1:{dport}/v1/chat/completions", auth),
        }
        print(f"one client, {samples} requests each (ms)")
        print(f"{'':>12} {'p50':>7} {'p99':>7} {'stream first chunk p50':>24}")
        lat = {}
        async with aiohttp.ClientSession() as session:
            for name, (url, headers) in targets.items():
                await latencies(session, url, headers, 50, False)  # warm up
                plain = await latencies(session, url, headers, samples, False)
                first = await latencies(session, url, headers, samples, True)
                lat[name] = (pct(plain, 0.5), pct(plain, 0.99), pct(first, 0.5))
                print(f"{name:>12} {lat[name][0]:>7.3f} {lat[name][1]:>7.3f} {lat[name][2]:>24.3f}")
        d, m = lat["direct"], lat["mr serve"]
        print(
            f"added by mr serve: p50 {m[0] - d[0]:.3f} ms, p99 {m[1] - d[1]:.3f} ms, stream first chunk {m[2] - d[2]:.3f} ms"
            "  (targets <= 0.6, <= 2, <= 1)"
        )
        for clients in (16, 64):
            cpu0 = cpu_seconds(daemon.pid)
            mr_rps, mr_n = await throughput(*targets["mr serve"], clients, seconds)
            cpu = cpu_seconds(daemon.pid) - cpu0
            bare_rps, _ = await throughput(*targets["bare proxy"], clients, seconds)
            print(
                f"{clients:>3} clients: mr serve {mr_rps:,.0f} req/s, bare proxy {bare_rps:,.0f} req/s, ratio {mr_rps / bare_rps:.2f} (target >= 0.5); "
                f"daemon CPU {cpu / mr_n * 1000:.3f} ms/request"
            )
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput run")
    parser.add_argument("--samples", type=int, default=500, help="requests per latency measurement")
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.samples))
