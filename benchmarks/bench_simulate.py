"""How long `mr simulate` takes, and what each shipped example measures.

Target (issue 2): an hour of simulated time with 3 users and 2 backends in a
few seconds. Run: ``.venv/bin/python benchmarks/bench_simulate.py [--repeat N] [--hours H]``.

``--figures`` prints instead the table of docs/simulate.md: for every example,
over its full duration, the worst pool share over the run, the worst 60 s
window of any pool (points off its target, and the points allowed), the user
passed over longest against 3 x its longest request (``max_passed_over_s``,
``passed_over_allowed_s``), the user starved longest against the same,
timeouts, and the largest service gap of any pool (and its bound, 2 x the
pool's largest request cost).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from mindrouter.simulate import build, example_names, load_example, simulate


def figures_row(name: str, result: dict[str, Any]) -> str:
    users = result["users"]
    passed = max(users, key=lambda u: u["max_passed_over_s"] / max(u["passed_over_allowed_s"], 1e-9))
    starved = max(users, key=lambda u: u["max_starved_s"] / max(u["longest_request_s"], 1e-9))
    windows = [p["worst_window"] for p in result["pools"] if p["worst_window"] is not None]
    worst = max(windows, key=lambda w: w["deviation"] - w["allowed"], default=None)
    window = "-" if worst is None else f"{100 * worst['deviation']:.1f} / {100 * worst['allowed']:.1f}"
    gap = max(result["pools"], key=lambda p: p["max_service_gap"] / max(p["gap_bound"], 1e-9))
    off = max(abs(p["unit_shares"][n] - p["target_shares"][n]) for p in result["pools"] for n in p["users"])
    return (
        f"| {name} | {100 * off:.1f} | {window}"
        f" | {passed['name']} {passed['max_passed_over_s']:.1f} / {passed['passed_over_allowed_s']:.1f}"
        f" | {starved['name']} {starved['max_starved_s']:.1f} / {3 * starved['longest_request_s']:.1f}"
        f" | {sum(u['timeouts'] for u in users)} | {gap['max_service_gap']:,.0f}"
        f" ({gap['max_service_gap_beyond_head_start']:,.0f} beyond head starts) / {gap['gap_bound']:,.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--hours", type=float, default=None, help="simulate this many hours instead of each file's duration"
    )
    parser.add_argument("--figures", action="store_true", help="print what each example measures instead")
    args = parser.parse_args()
    if args.figures:
        print("| example | worst share over the run: points off | worst window: points off / allowed", end=" ")
        print(
            "| longest passed over: s / 3 x its longest request | longest starved: s / 3 x its longest request", end=" "
        )
        print("| timeouts | service gap (beyond what already ran when both waited) / bound |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name in example_names():
            print(figures_row(name, build(simulate(load_example(name)))))
        return
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
