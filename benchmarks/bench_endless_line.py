"""A backend whose stream line never ends: how soon the daemon cuts it, and what it costs in memory.

Issue 19 measured one such stream growing the daemon from 90 to 297 MB in 25 s.
Now a line longer than ``max_line_bytes`` (8 MiB by default) is cut. This runs
the daemon in-process against the tests' FakeOllama, which sends two good lines
and then one that never ends (64 KiB pieces), and prints the time to each cut
and the process's RSS before, at its highest and after (docs/reliability.md):

    python benchmarks/bench_endless_line.py [--streams 5] [--max-line-bytes 8388608]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

from aiohttp.test_utils import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mindrouter.daemon.process.app import create_app
from tests.conftest import ADMIN_KEY, ServeServer, daemon_config
from tests.fake_nvml import FakeNvml
from tests.fakes import FakeOllama


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def main(streams: int, max_line_bytes: int) -> None:
    config = daemon_config(Path(tempfile.mkdtemp()))
    backends = dataclasses.replace(config.backends, poll_interval=60, max_line_bytes=max_line_bytes)
    config = dataclasses.replace(config, backends=backends)
    app = await create_app(config, nvml=FakeNvml(init_error=FakeNvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    client = TestClient(ServeServer(app, config))
    await client.start_server()
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    try:
        async with FakeOllama(models=["llama3"]) as liar:
            liar.endless_line = 2
            await client.post(
                "/admin/backends", json={"name": "liar", "url": liar.url, "engine": "ollama"}, headers=admin
            )
            await client.post("/admin/users", json={"name": "a", "group": "student"}, headers=admin)
            key = (await (await client.post("/admin/users/a/keys", headers=admin)).json())["key"]
            before = peak = rss_mb()
            body = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}
            for i in range(streams):
                started = time.monotonic()
                resp = await client.post("/api/chat", json=body, headers={"Authorization": f"Bearer {key}"})
                async for _ in resp.content.iter_any():
                    peak = max(peak, rss_mb())
                print(f"stream {i + 1}: cut after {time.monotonic() - started:.2f} s")
            print(f"RSS {before:.0f} MB before, {peak:.0f} MB at most, {rss_mb():.0f} MB after {streams} streams")
    finally:
        await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=5)
    parser.add_argument("--max-line-bytes", type=int, default=8 << 20)
    args = parser.parse_args()
    asyncio.run(main(args.streams, args.max_line_bytes))
