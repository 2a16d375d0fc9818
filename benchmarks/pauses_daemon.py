"""How long `mr serve`'s event loop pauses under load, and for what: its own work, or waiting for a core.

A pause of the loop holds up every request in flight, so the daemon's p99 is
its pauses more than its average cost. This starts the fast fake backend and
`mr serve` on the asyncio loop with a probe inside it, drives JSON and stream
clients (16 and 64) as bench_daemon.py does, and prints per cell: p50 and
p99; loop callbacks that took over 2 ms of thread CPU time (the daemon's own
pauses: how many, the longest, by task or callback); garbage collections (the
longest); and callbacks that took over 2 ms of wall-clock time but less CPU
(the daemon runnable, waiting for a core others held).

    python benchmarks/pauses_daemon.py [--seconds 3]

py-spy is not needed; the probe is ``gc.callbacks`` and a timed
``asyncio.Handle._run``, so it runs on the asyncio loop only.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import bench_daemon as bench

HERE = Path(__file__).parent
SELF = Path(__file__).resolve()
SLOW = 0.002
"""A callback or collection at least this long (seconds) is a pause worth listing."""


def probe(out: str, argv: list[str]) -> None:
    """Run the daemon with ``argv`` and write its pauses to ``out`` when it exits."""
    import asyncio.events

    from mindrouter.daemon.__main__ import main as daemon

    pauses: list[tuple[float, str, float, float]] = []
    """(wall time it ended, what, wall seconds, thread CPU seconds)."""
    started = [0.0, 0.0]

    def collected(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter(), time.thread_time()]
        else:
            wall, cpu = time.perf_counter() - started[0], time.thread_time() - started[1]
            pauses.append((time.time(), f"gc{info['generation']}", wall, cpu))

    def name(handle: asyncio.Handle) -> str:
        callback = handle._callback  # type: ignore[attr-defined]
        task = getattr(callback, "__self__", None)
        if isinstance(task, asyncio.Task):
            return task.get_coro().__qualname__  # type: ignore[union-attr]
        return getattr(callback, "__qualname__", repr(callback))

    run = asyncio.events.Handle._run

    def timed(handle: asyncio.Handle) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        run(handle)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        if wall >= SLOW:
            pauses.append((time.time(), name(handle), wall, cpu))

    gc.callbacks.append(collected)
    asyncio.events.Handle._run = timed  # type: ignore[method-assign,assignment]
    try:
        daemon(argv)
    finally:
        Path(out).write_text(json.dumps(pauses))


def report(cell: str, latencies: list[float], pauses: list[tuple[float, str, float, float]]) -> None:
    own = [p for p in pauses if not p[1].startswith("gc") and p[3] >= SLOW]
    gcs = [p[3] for p in pauses if p[1].startswith("gc")]
    waited = [p for p in pauses if not p[1].startswith("gc") and p[3] < SLOW]
    longest = max((p[3] for p in own), default=0.0) * 1000
    print(
        f"{cell:<18} p50 {bench.pct(latencies, 0.5):7.2f} p99 {bench.pct(latencies, 0.99):7.2f} ms | own pauses "
        f"{len(own):3} (over 5 ms: {sum(1 for p in own if p[3] >= 0.005)}), longest {longest:5.1f} ms | longest gc "
        f"{max(gcs, default=0.0) * 1000:5.1f} ms | waiting for a core: {len(waited)} callbacks, "
        f"{sum(p[2] - p[3] for p in waited) * 1000:.0f} ms"
    )
    for what, count in Counter(p[1] for p in own).most_common(3):
        print(f"{'':<18}   {count:3} x {what}")


Cell = tuple[str, float, float, list[float]]
"""What a cell was, when it began and ended (wall time), and its latencies."""


async def drive(seconds: float, out: Path) -> list[Cell]:
    """The backend and the probed daemon, each cell run against it; the daemon has written ``out`` on return."""
    tmp = out.parent
    port = bench.free_port()
    backend_url = f"http://127.0.0.1:{port}"
    backend = subprocess.Popen([sys.executable, str(HERE / "_servers.py"), "backend", str(port)])
    procs = [backend]
    cells: list[Cell] = []
    try:
        await bench.wait_http(backend_url + "/v1/models")
        command = [sys.executable, str(SELF), "--probe", str(out), "--"]
        daemon, url, auth = await bench.start_daemon(tmp, backend_url, "asyncio", command=command)
        procs.append(daemon)
        for mode in bench.MODES:
            await bench.run(url, auth, mode, 16, 0.5)  # first-use costs stay out of the cells
        for mode in bench.MODES:
            for clients in (16, 64):
                t0 = time.time()
                _, latencies = await bench.run(url, auth, mode, clients, seconds)
                cells.append((f"{mode}, {clients} clients", t0, time.time(), latencies))
    finally:
        bench.stop_all(procs)
    return cells


def main(seconds: float) -> None:
    out = Path(tempfile.mkdtemp(prefix="mr-pauses-")) / "pauses.json"
    cells = asyncio.run(drive(seconds, out))
    pauses: list[tuple[float, str, float, float]] = [tuple(p) for p in json.loads(out.read_text())]
    print(f"mr serve (asyncio loop), {seconds:g} s per cell, load average {os.getloadavg()[0]:.1f}")
    for cell, t0, t1, latencies in cells:
        report(cell, latencies, [p for p in pauses if t0 <= p[0] <= t1])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each cell")
    parser.add_argument("--probe", metavar="OUT", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.probe:
        probe(args.probe, [a for a in rest if a != "--"])
    else:
        main(args.seconds)
