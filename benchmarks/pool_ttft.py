"""Where the slowest first tokens of a bench_pool.py run went: mindrouter's queue, the workstation, prefill.

    python benchmarks/bench_pool.py --only "mr serve" --trace /tmp/trace
    python benchmarks/pool_ttft.py /tmp/trace/mr-serve [--phase steady] [--top 0.05] [--pool lab]

For the chat requests of the phase whose time to first token is in the top
``--top`` (the 5% that make the p95), one row each: its model and sizes, the
backend mr chose, the wait in mr's queue (its decision record), the wait
inside the workstation (for a runner: a pending load or eviction; for its
load; for a slot), prefill, and what is left (the rest of the first chunk,
the proxy), with the prefill it would have taken alone on that GPU; then the
same summed per model, each decision's estimate of the backends it did not
choose, and the phase's TTFT p95 as measured, as it would be were every
prefill as short as alone on the GPU chosen, and with nothing but each
prefill alone on the fastest GPU. Lab seconds throughout.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from _pools import POOLS

from mindrouter.simulate.scenario import Rates

COLUMNS = ("queue", "runner", "load", "slot", "prefill", "alone", "rest")
"""``alone``: the prefill that request would take alone on the GPU chosen (part of ``prefill``, not added)."""


def speeds(pool_name: str) -> tuple[dict[str, Mapping[str, Rates]], dict[str, float]]:
    """Each server's rates in the pool ``pool_name``, and per model the fastest prefill any of them has
    (a prompt's first token can come no sooner)."""
    rates = {spec.name: spec.rates for spec in POOLS[pool_name]}
    fastest: dict[str, float] = {}
    for per_model in rates.values():
        for model, speed in per_model.items():
            fastest[model] = max(fastest.get(model, 0.0), speed.prefill)
    return rates, fastest


def p95(values: list[float]) -> float:
    """As bench_pool's figures take it."""
    return sorted(values)[int(len(values) * 0.95)]


def decisions(state: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The last decision record of each request, and backend ids' names, from mr serve's state."""
    db = next(state.glob("*.db"))
    con = sqlite3.connect(db)
    names = {str(bid): name for bid, name in con.execute("SELECT id, name FROM backends")}
    last = {rid: json.loads(rec) for rid, rec in con.execute("SELECT request_id, record FROM decisions ORDER BY id")}
    return last, names


def breakdown(folder: Path, phase: str, compression: float, pool_name: str = "lab") -> list[dict[str, Any]]:
    """Every answered chat request of ``phase``, slowest first token first, with where its time went."""
    rates, fastest = speeds(pool_name)
    outcomes = json.loads((folder / "outcomes.json").read_text())
    traces = json.loads((folder / "workstations.json").read_text())
    records, names = decisions(folder / "state")
    unused: dict[tuple[str, str, int, int], list[dict[str, Any]]] = defaultdict(list)
    for ws, rows in traces.items():
        for row in rows:
            unused[(ws, row["model"], row["prompt"], row["out"])].append(row)
    chat = [o for o in outcomes if o["phase"] == phase and o["out"] > 0 and o["error"] is None]
    for o in chat:
        o["ttft"] = (o["first"] if o["first"] is not None else o["end"]) - o["sent"]
    chat.sort(key=lambda o: o["ttft"], reverse=True)
    rows = []
    for o in chat:
        rec = records.get(o["request_id"] or "", {})
        ws = names.get(str(rec.get("selected_backend_id")), "?")
        match = unused.get((ws, o["model"], o["prompt"], o["out"])) or [{}]
        w = match.pop(0) if match[0] else {}
        parts = {
            "queue": rec.get("queue_wait", 0.0) * compression,
            "runner": w.get("runner_wait", 0.0),
            "load": w.get("load_wait", 0.0),
            "slot": w.get("slot_wait", 0.0),
            "prefill": w.get("prefill", 0.0),
        }
        parts["rest"] = o["ttft"] - sum(parts.values())
        speed = rates.get(ws, {}).get(o["model"])
        parts["alone"] = o["prompt"] / speed.prefill if speed else 0.0
        parts["unshared"] = o["ttft"] - parts["prefill"] + parts["alone"]
        parts["floor"] = o["prompt"] / fastest[o["model"]]
        others = {
            names.get(b, b): round(c["score"], 1)
            for b, c in rec.get("score_components", {}).items()
            if b != str(rec.get("selected_backend_id"))
        }
        chosen = rec.get("score_components", {}).get(str(rec.get("selected_backend_id")), {})
        rows.append(
            {
                "at": o["sent"],
                "model": o["model"].split(":")[0],
                "prompt": o["prompt"],
                "ttft": o["ttft"],
                "backend": ws,
                **parts,
                "score": chosen.get("score"),
                "others": others,
                "closed": {names.get(b, b): r for b, r in rec.get("rejected", {}).items()},
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a target's folder under bench_pool.py's --trace DIR")
    parser.add_argument("--phase", default="steady", choices=("steady", "burst"))
    parser.add_argument("--top", type=float, default=0.05, help="the slowest part to show (0.05: the p95's)")
    parser.add_argument("--compression", type=float, default=10.0, help="the run's --compression")
    parser.add_argument("--pool", default="lab", choices=tuple(POOLS), help="the run's --pool")
    args = parser.parse_args()
    every = breakdown(args.folder, args.phase, args.compression, args.pool)
    rows = every[: max(1, round(len(every) * args.top))]
    print(f"{'at':>6} {'model':<18} {'prompt':>6} {'backend':<8} {'TTFT':>6}" + "".join(f"{c:>8}" for c in COLUMNS))
    sums: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(("n", "ttft", *COLUMNS), 0.0))
    for r in rows:
        cells = "".join(f"{r[c]:>8.1f}" for c in COLUMNS)
        print(f"{r['at']:>6.0f} {r['model']:<18} {r['prompt']:>6} {r['backend']:<8} {r['ttft']:>6.1f}{cells}")
        print(f"{'':>8}chosen score {r['score']}; others {r['others']}; closed {r['closed']}")
        s = sums[r["model"]]
        s["n"] += 1
        for c in ("ttft", *COLUMNS):
            s[c] += r[c]
    print("\nper model (sums, lab s):")
    for model, s in sums.items():
        cells = "".join(f"{c} {s[c]:.1f}  " for c in COLUMNS)
        print(f"  {model:<18} {s['n']:.0f} requests, TTFT {s['ttft']:.1f}: {cells}")
    print(
        f"\n{len(every)} requests, TTFT p95 {p95([r['ttft'] for r in every]):.1f} s; with each prefill as long as"
        f" alone on the GPU chosen {p95([r['unshared'] for r in every]):.1f} s; each prefill alone on the fastest"
        f" GPU and nothing else {p95([r['floor'] for r in every]):.1f} s"
    )


if __name__ == "__main__":
    main()
