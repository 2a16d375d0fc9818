"""Memory with N waiting requests: `mr serve` against a plain aiohttp app holding as many requests.

Issue 20's target: `mr serve` holding 10,000 waiting requests takes at most
1.5x the memory of a plain aiohttp app that reads each chat request's body and
then waits (what aiohttp keeps for every request it is serving; a queued
request in `mr serve` waits in aiohttp's handler too). One run measures both,
on loopback:

    python benchmarks/bench_memory.py [--requests 10000] [--loop uvloop|asyncio]

1. The holder (`_servers.py hold`) alone: RSS before and while holding N requests.
2. `mr serve` in front of another holder (256 slots): RSS before and while N
   requests are in it, N - 256 of them queued.

Then the holder answers them all, and the run prints how each of the N requests
ended: an answer, 429, 503, 504, a stream that ended in an error, or cut.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from bench_daemon import HERE, free_port, start_daemon, wait_http

BODY = {"model": "bench", "messages": [{"role": "user", "content": "one two three"}]}


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024


def start_holder() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(HERE / "_servers.py"), "hold", str(port)])
    return proc, f"http://127.0.0.1:{port}"


async def fill(
    url: str, headers: dict[str, str], n: int, arrived: Callable[[], Awaitable[bool]]
) -> tuple[list[asyncio.Task[str]], aiohttp.ClientSession]:
    """Send ``n`` requests the holder holds; returns once ``arrived()`` says they are all in."""
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None))

    async def one(i: int) -> str:
        """How this request ended: "answer", its status, "stream error" (an error tail) or "cut"."""
        try:
            async with session.post(url, json={**BODY, "stream": i % 2 == 1}, headers=headers) as r:
                text = await r.text()
        except aiohttp.ClientError:
            return "cut"
        if r.status != 200:
            return str(r.status)
        if i % 2 == 0:
            return "answer"
        events = [e for e in text.split("\n\n") if e.startswith("data: ")]
        if events[-1:] != ["data: [DONE]"]:
            return "cut"
        return "stream error" if len(events) >= 2 and '"error"' in events[-2] else "answer"

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    deadline = time.monotonic() + 300
    while not await arrived():
        if time.monotonic() > deadline:
            raise RuntimeError("the requests did not all arrive within 300 s")
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)  # let the last ones settle before reading memory
    return tasks, session


async def release(holder_url: str, tasks: list[asyncio.Task[str]], session: aiohttp.ClientSession) -> Counter[str]:
    """Let the holder answer; how each request ended."""
    async with session.post(holder_url + "/release") as r:
        assert r.status == 200
    try:
        return Counter(await asyncio.wait_for(asyncio.gather(*tasks), 600))
    finally:
        await session.close()


async def measure_holder(n: int) -> tuple[float, float, Counter[str]]:
    proc, url = start_holder()
    try:
        await wait_http(url + "/held")
        idle = rss_mb(proc.pid)
        async with aiohttp.ClientSession() as probe:

            async def arrived() -> bool:
                async with probe.get(url + "/held") as r:
                    return bool((await r.json())["held"] >= n)

            tasks, session = await fill(url + "/v1/chat/completions", {}, n, arrived)
            held = rss_mb(proc.pid)
            ended = await release(url, tasks, session)
        return idle, held, ended
    finally:
        proc.kill()
        proc.wait()


async def measure_daemon(n: int, loop: str) -> tuple[float, float, Counter[str]]:
    holder, backend_url = start_holder()
    tmp = Path(tempfile.mkdtemp(prefix="mr-bench-memory-"))
    daemon = None
    try:
        await wait_http(backend_url + "/held")
        daemon, url, headers = await start_daemon(tmp, backend_url, loop)
        idle = rss_mb(daemon.pid)
        admin = aiohttp.UnixConnector(path=str(tmp / "mr.sock"))
        async with aiohttp.ClientSession(connector=admin) as probe:

            async def arrived() -> bool:
                async with probe.get("http://mr/admin/status") as r:
                    status = await r.json()
                return bool(status["queue_total"] + status["running"] >= n)

            tasks, session = await fill(url, headers, n, arrived)
            held = rss_mb(daemon.pid)
            ended = await release(backend_url, tasks, session)
        return idle, held, ended
    finally:
        if daemon is not None:
            daemon.kill()  # its state is temporary
            daemon.wait()
        holder.kill()
        holder.wait()


async def main(n: int, loop: str) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = n + 1000
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard) if hard != resource.RLIM_INFINITY else need, hard))
    bare = await measure_holder(n)
    mr = await measure_daemon(n, loop)
    print(f"{n:,} requests held, half of them streams; mr serve's event loop: {loop}")
    for name, (idle, held, ended) in (("plain aiohttp app", bare), ("mr serve", mr)):
        print(
            f"  {name:18} RSS {idle:6.1f} MB idle, {held:6.1f} MB holding: "
            f"{(held - idle) * 1024 / n:5.1f} KB per request"
        )
        print(f"  {'':18} how they ended: " + ", ".join(f"{how} {count:,}" for how, count in sorted(ended.items())))
    per_bare, per_mr = (bare[1] - bare[0]) / n, (mr[1] - mr[0]) / n
    print(
        f"mr serve holding them: {mr[1] / bare[1]:.2f}x the plain app's memory [target <= 1.5x]; "
        f"per request {per_mr / per_bare:.2f}x"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000, help="requests to hold")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="asyncio", help="mr serve's event loop")
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.loop))
