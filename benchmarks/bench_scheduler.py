"""Cost of one routing decision with many queued jobs (DESIGN §9).

Keeps N jobs queued from 1,000 users over 50 backends that are all full, then
repeatedly frees one slot, queues one more job and times the ``dispatch`` call
that makes the single decision. Every backend serves the model, so each
decision weighs all 50 candidates (the worst case). Each job is a turn of one of
its user's conversations behind one of three apps' system prompts, hashed into
blocks (``scheduler/prefix.py``), so every candidate's estimate looks up what of
it that backend holds (issue 31); ``--no-prefixes`` sends none.

    python benchmarks/bench_scheduler.py [--decisions 20000] [--no-prefixes]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from mindrouter.scheduler import Backend, Job, Prefix, Scheduler, SchedulerSettings, chain


def measure(
    queued: int, users: int = 1000, backends: int = 50, decisions: int = 20000, seed: int = 1, prefixes: bool = True
) -> tuple[float, float]:
    rng = random.Random(seed)
    # No anticipation nor kept slots: its random users send 0.01 s after a job ends, so they would learn a short
    # think time and hold slots, and a decision here must start exactly one job (holds: tests/test_anticipation.py,
    # tests/test_served_quickly.py).
    settings = SchedulerSettings(
        max_queued_per_user=10**6, max_queued=10**6, queue_timeout=10**9, anticipation=0.0, max_think_time=0.0
    )
    s = Scheduler(settings)
    models = frozenset({"llama3"})
    for b in range(backends):
        s.set_backend(Backend(id=b, name=f"gpu{b}", models=models, max_concurrent=4, utilization=rng.random()))
    for u in range(users):
        s.set_user(u, rng.choice((1, 2, 3, 10)))
    now = 0.0
    n = 0

    def conversation(user: int) -> Prefix:
        """A turn of 1-10 of one of the user's three conversations (system prompt, then messages)."""
        if not prefixes:
            return ()
        conv, turns = rng.randrange(3), rng.randint(1, 10)
        blocks = [(("app", user % 3), 400)] + [((user, conv, i), rng.randint(30, 300)) for i in range(2 * turns - 1)]
        return chain(blocks)

    def submit() -> None:
        nonlocal n
        n += 1
        user = rng.randrange(users)
        s.submit(
            Job(
                id=f"j{n}",
                user_id=user,
                model="llama3",
                submitted_at=now,
                prompt_tokens=rng.randint(50, 500),
                max_tokens=rng.randint(100, 800),
                prefix=conversation(user),
            ),
            now,
        )

    for _ in range(queued + backends * 4):
        submit()
    running = [d.job.id for d in s.dispatch(now)]
    assert s.queued_count == queued, s.queued_count
    times = []
    gc.disable()
    try:
        for _ in range(decisions):
            now += 0.01
            done = running.pop(rng.randrange(len(running)))
            s.complete(
                done,
                now,
                prompt_tokens=rng.randint(50, 500),
                completion_tokens=rng.randint(100, 800),
                latency=0.2,
                duration=2.0,
            )
            submit()
            t0 = time.perf_counter_ns()
            out = s.dispatch(now)
            times.append(time.perf_counter_ns() - t0)
            assert len(out) == 1
            running.append(out[0].job.id)
    finally:
        gc.enable()
    times.sort()
    return statistics.median(times) / 1000, times[int(len(times) * 0.99)] / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=20000)
    parser.add_argument("--no-prefixes", action="store_true", help="jobs carry no prefix (no cache lookups)")
    args = parser.parse_args()
    results = {}
    print(f"{'queued jobs':>12} {'median µs':>10} {'p99 µs':>8}")
    for queued in (100, 1000, 10000):
        med, p99 = measure(queued, decisions=args.decisions, prefixes=not args.no_prefixes)
        results[queued] = med
        print(f"{queued:>12} {med:>10.1f} {p99:>8.1f}")
    print(
        f"growth 100 -> 10,000 queued: {results[10000] / results[100]:.2f}x "
        f"(log ratio would be {4.6 / 2.3:.1f}x at most)"
    )


if __name__ == "__main__":
    main()
