"""How long `mr simulate` takes: wall seconds per example scenario, median of a few runs.

Target (issue 2): an hour of simulated time with 3 users and 2 backends in a
few seconds. Run: ``.venv/bin/python benchmarks/bench_simulate.py [--repeat N] [--hours H]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from mindrouter.simulate import example_names, load_example, simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--hours", type=float, default=None, help="simulate this many hours instead of each file's duration"
    )
    args = parser.parse_args()
    print("| scenario | simulated s | events | wall s (median) | events/s |")
    print("|---|---:|---:|---:|---:|")
    for name in example_names():
        sc = load_example(name)
        if args.hours is not None:
            sc = sc.replace(duration=args.hours * 3600)
        walls = []
        events = 0
        for _ in range(args.repeat):
            began = time.perf_counter()
            run = simulate(sc)
            walls.append(time.perf_counter() - began)
            events = run.events
        wall = statistics.median(walls)
        print(f"| {name} | {sc.duration:g} | {events:,} | {wall:.3f} | {events / wall:,.0f} |")


if __name__ == "__main__":
    main()
