"""Profile `mr serve` under load with py-spy: where its CPU goes, by function.

Starts the fast fake backend and `mr serve` (as bench_daemon.py does), drives
16 clients for 8 s while `py-spy record` samples the daemon, then prints the
share of samples under the functions that matter (inclusive).

    pip install py-spy
    python benchmarks/profile_daemon.py [json|stream] [--loop uvloop|asyncio]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import bench_daemon as bench

HERE = Path(__file__).parent


async def main(mode: str, loop: str) -> None:
    spy_bin = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    tmp = Path(tempfile.mkdtemp(prefix="mr-prof-"))
    port = bench.free_port()
    url = f"http://127.0.0.1:{port}"
    backend = subprocess.Popen([sys.executable, str(HERE / "_servers.py"), "backend", str(port)])
    try:
        await bench.wait_http(url + "/v1/models")
        daemon, daemon_url, auth = await bench.start_daemon(tmp, url, loop)
        await bench.run(daemon_url, auth, mode, 16, 0.5)
        out = tmp / "profile.txt"
        spy = subprocess.Popen(
            [spy_bin, "record", "-p", str(daemon.pid), "-d", "8", "-r", "200", "-f", "raw", "-o", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        await bench.run(daemon_url, auth, mode, 16, 9)
        spy.wait(30)
        daemon.terminate()
        daemon.wait(10)
    finally:
        backend.terminate()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in out.read_text().splitlines():
        stack, count = line.rsplit(" ", 1)
        total += int(count)
        for name in {frame.split(" (")[0] for frame in stack.split(";")}:
            inclusive[name] += int(count)
    print(f"{total} samples of mr serve, {mode}, 16 clients; share under each function:")
    for name, count in inclusive.most_common(60):
        print(f"{count / total * 100:5.1f}%  {name}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=bench.MODES, nargs="?", default="json")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = parser.parse_args()
    asyncio.run(main(args.mode, args.loop))
