"""Invariants of the core under random operation sequences (hypothesis, seeded)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindrouter.scheduler import Backend, Job, Scheduler, SchedulerSettings

MODELS = ("a", "b")

ops = st.lists(
    st.tuples(
        st.sampled_from(
            ["submit", "submit", "submit", "dispatch", "complete", "cancel", "fail", "expire", "backend", "weight"]
        ),
        st.integers(0, 1000),
    ),
    min_size=1,
    max_size=120,
)


@pytest.mark.parametrize("unit", ["tokens", "gpu"])
@settings(max_examples=150, deadline=None)
@given(sequence=ops)
def test_no_job_lost_or_run_twice_and_capacity_never_exceeded(unit, sequence):
    """With either service unit: the gpu unit's prompt weights move as answers teach the rates."""
    s = Scheduler(
        SchedulerSettings(queue_timeout=50, heavy_refresh_interval=0.0, deficit_shift_threshold=2000, service_unit=unit)
    )
    for bid in range(3):
        s.set_backend(Backend(id=bid, name=f"b{bid}", models=frozenset(MODELS[: 1 + bid % 2]), max_concurrent=1 + bid))
    for uid in range(4):
        s.set_user(uid, 1 + uid)
    now = 0.0
    submitted: set[str] = set()
    started: list[str] = []
    ended: set[str] = set()
    running: set[str] = set()
    retries = 0
    n = 0
    for op, arg in sequence:
        now += arg / 100
        if op == "submit":
            n += 1
            job = Job(
                id=f"j{n}",
                user_id=arg % 4,
                model=MODELS[arg % 2],
                submitted_at=now,
                prompt_tokens=arg % 300,
                max_tokens=arg % 500 or None,
            )
            if s.submit(job, now) is None:
                submitted.add(job.id)
        elif op == "dispatch":
            for d in s.dispatch(now):
                assert d.job.id in submitted and d.job.id not in running and d.job.id not in ended
                backend = s.backend(d.backend_id)
                assert d.job.model in backend.models
                started.append(d.job.id)
                running.add(d.job.id)
        elif op == "complete" and running:
            jid = sorted(running)[arg % len(running)]
            assert s.complete(jid, now, prompt_tokens=arg % 300, completion_tokens=arg % 70, latency=0.1, duration=1)
            running.discard(jid)
            ended.add(jid)
        elif op == "cancel" and submitted:
            jid = sorted(submitted)[arg % len(submitted)]
            if s.cancel(jid, now):
                running.discard(jid)
                ended.add(jid)
        elif op == "fail" and running:
            jid = sorted(running)[arg % len(running)]
            running.discard(jid)
            if s.fail(jid, now, retry=arg % 2 == 0):
                retries += 1
            else:
                ended.add(jid)
        elif op == "expire":
            for e in s.expire(now):
                assert e.job.id not in running
                ended.add(e.job.id)
        elif op == "backend":
            bid = arg % 3
            old = s.backend(bid)
            s.set_backend(
                Backend(
                    id=bid, name=old.name, models=old.models, max_concurrent=old.max_concurrent, healthy=arg % 5 != 0
                )
            )
        elif op == "weight":
            s.set_user(arg % 4, 1 + arg % 7)
        s.check()
        for bid, backend in s.backends.items():
            assert s.load(bid).in_flight <= backend.max_concurrent
        # Every submitted job is in exactly one place.
        for jid in submitted:
            places = [s.is_queued(jid), s.is_running(jid), jid in ended]
            assert sum(places) == 1, (jid, places)
    # A job starts again only after a failure that queued it again.
    assert len(started) - len(set(started)) <= retries


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.lists(st.floats(0.5, 10), min_size=2, max_size=6))
def test_a_backlogged_user_is_never_starved(seed, weights):
    """Under saturation every backlogged user is served within a bounded number of decisions."""
    rng = random.Random(seed)
    s = Scheduler(SchedulerSettings(deprioritize_threshold=1.0))
    s.set_backend(Backend(id=1, name="b", models=frozenset({"m"}), max_concurrent=2))
    users = list(range(len(weights)))
    for uid, w in zip(users, weights, strict=False):
        s.set_user(uid, w)
    n = 0
    now = 0.0
    for uid in users:
        for _ in range(5):
            n += 1
            s.submit(Job(id=f"j{n}", user_id=uid, model="m", submitted_at=now, prompt_tokens=50, max_tokens=100), now)
    last_served = {uid: 0 for uid in users}
    running: list[str] = []
    total_weight = sum(weights)
    for step in range(1, 400):
        now += 1
        for d in s.dispatch(now):
            running.append(d.job.id)
            last_served[d.job.user_id] = step
            n += 1
            s.submit(
                Job(id=f"j{n}", user_id=d.job.user_id, model="m", submitted_at=now, prompt_tokens=50, max_tokens=100),
                now,
            )
        done = running.pop(rng.randrange(len(running)))
        s.complete(done, now, prompt_tokens=rng.randint(10, 100), completion_tokens=rng.randint(10, 150))
        for uid, w in zip(users, weights, strict=False):
            # A user with weight w gets about w/total of the decisions; allow generous slack.
            bound = 10 + 6 * total_weight / w
            assert step - last_served[uid] <= bound, (uid, w, step, last_served)
