"""How fast `mr usage` answers over a year of a lab's usage (issue 13: 5 million rows in under a second).

Writes ROWS usage rows spread over the last 365 days (100 users in 4 groups,
8 models, 6 backends) into the store's own table with ``executemany`` in
batches and rolls them into the daily and monthly totals as the store does
before a report, then times ``Store.usage_report`` (what
``GET /admin/usage`` runs) for the reports an admin asks for: first with every
per-request row kept, then after the 30-day retention has rolled the older
rows into daily totals. For contrast it also times one plain ``GROUP BY`` over
all per-request rows, which is what a report would cost without the daily
totals.

    python benchmarks/bench_usage.py [--rows 5000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from mindrouter.localtime import day_start, month_start
from mindrouter.store import Store

DAY = 86_400.0


def fill(store: Store, rows: int, now: float, seed: int = 1) -> float:
    """Insert ``rows`` usage rows over the last year; returns rows per second."""
    rng = random.Random(seed)
    groups = ["student", "staff", "faculty", "admin"]
    users = [(store.add_user(f"user{i:03d}", groups[i % 4]).id, groups[i % 4]) for i in range(100)]
    backends = [store.add_backend(f"gpu{i}", f"http://10.0.0.{i + 1}:11434", "ollama").id for i in range(6)]
    models = [f"model{i}:8b" for i in range(8)]
    db = store._db  # the store's own connection: the same indexes as the daemon's writes
    sql = (
        "INSERT INTO usage (at, user_id, request_id, model, backend_id, prompt_tokens, completion_tokens,"
        " gpu_seconds, group_name) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    started = time.perf_counter()
    batch = 100_000
    for first in range(0, rows, batch):
        params = []
        for n in range(first, min(rows, first + batch)):
            user, group = users[int(rng.paretovariate(1.2)) % 100]
            params.append(
                (
                    now - rng.random() * 365 * DAY,
                    user,
                    f"r{n}",
                    models[int(rng.expovariate(0.5)) % 8],
                    backends[n % 6],
                    rng.randrange(20, 4000),
                    rng.randrange(1, 1500),
                    rng.random() * 20,
                    group,
                )
            )
        db.execute("BEGIN")
        db.executemany(sql, params)
        db.execute("COMMIT")
    store.roll_usage()
    return rows / (time.perf_counter() - started)


def timed(fn, repeat: int) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(repeat):
        t = time.perf_counter()
        size = len(fn())
        times.append(time.perf_counter() - t)
    return statistics.median(times), size


def reports(store: Store, now: float, repeat: int) -> None:
    this_month = month_start(now)
    last_month = month_start(this_month - 1)
    cases = [
        ("--by user --since 365d", ["user"], now - 365 * DAY, now),
        ("--by group,model (last month)", ["group", "model"], last_month, this_month),
        ("--by day --since 365d", ["day"], now - 365 * DAY, now),
        ("--by user,model,month --since 365d", ["user", "model", "month"], now - 365 * DAY, now),
        ("--by backend,week --since 90d", ["backend", "week"], now - 90 * DAY, now),
        ("--by user --since 7d", ["user"], now - 7 * DAY, now),
    ]
    for label, by, since, until in cases:
        seconds, size = timed(lambda by=by, since=since, until=until: store.usage_report(by, since, until).rows, repeat)
        print(f"  {label:<40} {seconds * 1000:8.1f} ms  ({size} rows)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    now = day_start(time.time()) + 15 * 3600.0  # 15:00 today: every report has partial days at its ends
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "m.db", usage_retention=400 * DAY) as store:
        store.ensure_default_groups()
        rate = fill(store, args.rows, now)
        daily, monthly = (
            store._db.execute(f"SELECT count(*) FROM usage_{t}").fetchone()[0] for t in ("daily", "monthly")
        )
        print(
            f"{args.rows:,} usage rows written at {rate:,.0f} rows/s (triggers included);"
            f" {daily:,} daily and {monthly:,} monthly totals"
        )
        print("reports with every per-request row kept (median of", args.repeat, "runs):")
        reports(store, now, args.repeat)
        seconds, _ = timed(
            lambda: store._db.execute(
                "SELECT user_id, count(*), sum(prompt_tokens), sum(completion_tokens), sum(gpu_seconds)"
                " FROM usage GROUP BY user_id"
            ).fetchall(),
            1,
        )
        print(f"  for contrast, GROUP BY user over all per-request rows: {seconds * 1000:,.0f} ms")
        store.usage_retention = 30 * DAY
        t = time.perf_counter()
        pruned = store.prune_usage(now)
        took = time.perf_counter() - t
        print(f"retention 30 days: {pruned:,} rows rolled up (deleted; daily totals kept) in {took:.1f} s")
        print("reports after the roll-up:")
        reports(store, now, args.repeat)


if __name__ == "__main__":
    main()
