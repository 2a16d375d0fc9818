"""What a request's durable writes cost on SQLite and on PostgreSQL, side by side in one run.

Per request the daemon commits one usage row and one decision record; under load the
rows of one loop turn share a commit. For batches of 1 and 10 requests a commit, this
calls the store as the daemon does and prints CPU per request: the process's own, and
on PostgreSQL its server session's (read from /proc, so the server must run on this
machine), whose sum compares with SQLite's (all in the process).

    python benchmarks/bench_store.py --url postgresql://USER@/DB?host=/socket/dir [--requests 2000]

The database must exist; the benchmark adds a user of its own and leaves its rows.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from mindrouter.store import Store, decision_row


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(store: Store, requests: int, batch: int) -> tuple[float, float]:
    """Microseconds of CPU per request: this process's and the database server session's."""
    user = store.add_user(f"bench{os.getpid()}b{batch}", "staff").id
    session = [store._db.raw.info.backend_pid] if store.url else []  # type: ignore[attr-defined]
    record = {"user": "bench", "wall_time": time.time(), "scores": {"gpu1": 1.0}, "candidate_backends": ["gpu1"]}
    mine, server = time.process_time(), sum(map(cpu_seconds, session))
    for i in range(requests // batch):
        ids = [f"r{batch}-{i}-{j}" for j in range(batch)]
        store.record_usages([(user, rid, "llama3", None, 120, 80, time.time(), 0.4, "staff") for rid in ids])
        store.add_decision_rows([decision_row({**record, "request_id": rid}) for rid in ids])
    mine, server = time.process_time() - mine, sum(map(cpu_seconds, session)) - server
    return mine / requests * 1e6, server / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="a PostgreSQL database on this machine")
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    print(f"{'store':<11} {'batch':>5} {'router µs/req':>14} {'server µs/req':>14} {'total':>8}")
    totals: dict[tuple[str, int], float] = {}
    for name, url in (("sqlite", ""), ("postgresql", args.url)):
        with Store(Path(tempfile.mkdtemp()) / "m.db", url=url) as store:
            store.ensure_default_groups()
            for batch in (1, 10):
                mine, server = measure(store, args.requests, batch)
                totals[name, batch] = mine + server
                print(f"{name:<11} {batch:>5} {mine:>14.1f} {server:>14.1f} {mine + server:>8.1f}")
    for batch in (1, 10):
        ratio = totals["postgresql", batch] / totals["sqlite", batch]
        print(f"batch {batch:>2}: PostgreSQL costs {ratio:.1f}x SQLite's per request (router and server together)")


if __name__ == "__main__":
    main()
