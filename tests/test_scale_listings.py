"""One machine at a campus's size (issue 33): listings cost the people active, reports and retention stay off the loop.

Counts, not clocks: what a listing reads does not grow with registered idle users.
"""

from __future__ import annotations

import gc
import json
import random
import re
import sqlite3
import sys
import threading
import time

import pytest

from mindrouter.daemon.process.serve import YOUNG_COLLECTION_EVERY, settle_process
from mindrouter.daemon.request.weights import apply_user
from mindrouter.daemon.usage.writer import UsageWriter
from mindrouter.localtime import day_start
from mindrouter.store import Store, schema
from mindrouter.store import worker as store_worker
from mindrouter.store.worker import SLICE, StoreWorker, json_bytes, sorted_in_slices

from .harness import ADMIN_KEY, Daemon, until
from .inprocess import InProcess
from .test_web_ui import login

IDLE = 500
DAY = 86_400.0


async def _pool(daemon: Daemon) -> tuple[str, str]:
    """Two people who sent a request each, and IDLE registered people who never did."""
    await daemon.backend("b1", InProcess(models=("llama3",), completion_tokens=4))
    alice = await daemon.user("alice", "staff")
    bob = await daemon.user("bob")
    store, scheduler = daemon.store, daemon.scheduler
    for i in range(IDLE):
        row = store.add_user(f"idle{i:04d}", "student")
        apply_user(scheduler, row.id, store.get_user(row.name))
    for key in (alice, bob):
        body = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        resp = await daemon.client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        assert resp.status == 200, await resp.text()
    return alice, bob


@pytest.mark.asyncio
async def test_per_user_metrics_list_the_active_people_only(daemon):
    await _pool(daemon)
    resp = await daemon.client.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    lines = [line for line in (await resp.text()).splitlines() if line.startswith("mindrouter_user_recent_tokens{")]
    assert sorted(re.search(r'user="([^"]+)"', line)[1] for line in lines) == ["alice", "bob"]  # was: all 502


@pytest.mark.asyncio
async def test_me_reads_the_active_people_and_an_idle_person_still_sees_their_standing(daemon):
    alice, _ = await _pool(daemon)
    me = await (await daemon.client.get("/v1/me", headers={"Authorization": f"Bearer {alice}"})).json()
    share = me["fair_share"]
    assert share["active_users"] == 2 and share["position"] in (1, 2) and share["recent_tokens"] > 0
    assert share["target_share"] == pytest.approx(2 / 3, abs=1e-3)  # weight 2 next to bob's 1, not 502 users
    idle = daemon.store.create_key("idle0001")
    mine = await (await daemon.client.get("/v1/me", headers={"Authorization": f"Bearer {idle}"})).json()
    assert mine["fair_share"]["weight"] == 1 and mine["fair_share"]["position"] is None
    assert mine["fair_share"]["target_share"] is None  # idle: no target


def _decision(i: int, at: float) -> dict:
    return {"request_id": f"req{i}", "user": "alice", "wall_time": at}


def test_decisions_go_by_age_a_day_at_a_time_and_usage_by_retention_off_the_loop(tmp_path):
    """The daemon's own Store deletes nothing as rows arrive; its worker deletes what is old, in short batches."""
    now = time.time()
    path = tmp_path / "state.db"
    with Store(path, usage_retention=10 * DAY, prune_inline=False, max_decisions=0) as store:
        for i in range(3000):  # 2,000 rows past retention, 1,000 within; 3,000 inserts once pruned 8,192 inline
            at = now - 20 * DAY if i < 2000 else now - DAY
            store.record_usage(1, f"r{i}", "m", 1, 1, 1, at=at)
            store.add_decision(_decision(i, now - (9 - i // 500) * DAY))  # 500 a day, 9 to 4 days old
        assert store._db.execute("SELECT count(*) FROM usage").fetchone()[0] == 3000
        assert store._db.execute("SELECT count(*) FROM decisions").fetchone()[0] == 3000
        worker = StoreWorker(path, usage_retention=10 * DAY, decision_days=7, batch_seconds=1e-9)
        worker.batch = 100  # then as many rows as take batch_seconds (here: the least, 16)
        sizes: list[int] = []
        real = Store.prune_usage

        def spy(self, when, *, limit=None):
            sizes.append(limit)
            return real(self, when, limit=limit)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Store, "prune_usage", spy)
            assert worker.retain(now).result(30) == (2000, 1000)
        worker.close()
        assert sizes[0] == 100 and max(sizes[1:]) == 16 and len(sizes) > 100  # short transactions, never one big
        assert store._db.execute("SELECT count(*) FROM usage").fetchone()[0] == 1000
        kept = store._db.execute("SELECT min(at) FROM decisions").fetchone()[0]
        assert kept >= day_start(now - 7 * DAY) and store.recent_decisions(1)[0]["request_id"] == "req2999"


@pytest.mark.asyncio
async def test_the_daemon_deletes_old_usage_and_decisions_at_start_on_its_worker(new_daemon, tmp_path):
    now = time.time()
    with Store(tmp_path / "state" / "mindrouter.db") as store:
        for i in range(50):
            store.record_usage(1, f"old{i}", "m", 1, 1, 1, at=now - 3 * DAY)
            store.add_decision(_decision(i, now - 3 * DAY))
        store.record_usage(1, "new", "m", 1, 1, 1, at=now - 600)
        store.add_decision(_decision(99, now - 600))
    daemon = await new_daemon(server={"usage_retention_days": 2.0, "decision_retention_days": 2.0})
    db = daemon.store._db
    await until(lambda: db.execute("SELECT count(*) FROM decisions").fetchone()[0] == 1, "old decisions stayed")
    assert [r[0] for r in db.execute("SELECT request_id FROM usage")] == ["new"]
    assert daemon.store.recent_decisions(5)[0]["request_id"] == "req99"


def test_json_bytes_encodes_long_lists_a_slice_at_a_time_and_reads_back_the_same():
    value = {"rows": [{"user": f"u{i}", "tokens": i, "pools": []} for i in range(1234)], "total": {"n": 2}, "x": []}
    sliced = json.loads(json_bytes(value))
    assert sliced == value and json.loads(json_bytes((1, 2))) == [1, 2]
    assert json.loads(json_bytes(list(range(1001)))) == list(range(1001))  # two full slices and one more


@pytest.mark.asyncio
async def test_live_groups_and_the_group_and_user_lists_never_read_every_user_on_the_loop(daemon, monkeypatch):
    """At 10,000 users these read every row on the loop: Live 107 ms, Groups 113, `mr user list` 225."""
    await _pool(daemon)
    read: list[int] = []
    every = daemon.store.list_users

    def spy(group=None):
        rows = every(group)
        read.append(len(rows))
        return rows

    monkeypatch.setattr(daemon.store, "list_users", spy)  # the loop's store; the worker has its own
    groups = {g["name"]: g["users"] for g in await daemon.admin("GET", "/admin/groups")}
    assert groups["student"] == IDLE + 1 and groups["staff"] == 1  # counted in SQL
    users = await daemon.admin("GET", "/admin/users")
    assert len(users) == IDLE + 2 and {u["name"] for u in users} >= {"alice", "bob", "idle0499"}
    assert next(u for u in users if u["name"] == "alice")["keys"] == 1
    await login(daemon, ADMIN_KEY)
    live = await (await daemon.client.get("/ui/admin/top")).text()
    assert "alice" in live and "bob" in live and "idle0001" not in live
    page = await (await daemon.client.get("/ui/admin/groups")).text()
    assert "alice" in page and "idle0001" not in page
    assert re.search(r'data-label="users">\s*501<', page), "the student group's member count"
    assert read == []


def test_a_report_of_30000_rows_sets_off_young_collections_only(tmp_path, monkeypatch):
    """A report is built on the store's worker; a collection holds the GIL whichever thread runs it, so the
    loop waits. Under `mr serve`'s settings (``settle_process``) its 30,000 rows once set off 11 young
    collections and one of the middle generation (list sort keys: 90,000 more objects), now 4 young ones.
    So does a sort in C: its rows are sorted a slice at a time (three sorts of 30,000 rows held the GIL
    7-11 ms each on a slow core)."""
    sorts: list[int] = []

    def counted(items, key):
        sorts.append(len(items))
        return sorted(items, key=key)

    monkeypatch.setattr(store_worker, "sorted", counted, raising=False)
    now = time.time()
    with Store(tmp_path / "state.db", prune_inline=False) as store:
        store.ensure_default_groups()
        ids = [store.add_user(f"u{i:05d}", "student").id for i in range(10_000)]
        store.record_usages([(u, f"r{u}{m}", m, None, 1, 1, now - 600, 0.0, "student") for u in ids for m in "abc"])
        seen: list[int] = []

        def count(phase, info):
            if phase == "start":
                seen.append(info["generation"])

        threshold = gc.get_threshold()
        gc.collect()
        gc.set_threshold(YOUNG_COLLECTION_EVERY)
        gc.callbacks.append(count)
        try:
            report = store.usage_report(["user", "model"], now - DAY, now)
        finally:
            gc.callbacks.remove(count)
            gc.set_threshold(*threshold)
        assert len(report.rows) == 30_000 and report.rows[0]["user"] == "u00000"
        assert seen and set(seen) == {0}, seen
        assert sum(sorts) == 3 * 30_000 and max(sorts) == SLICE


@pytest.mark.parametrize("size", [0, SLICE, SLICE + 1, 2 * SLICE, 3 * SLICE + 7])
def test_sorted_in_slices_sorts_as_sorted_does_ties_in_their_order(size):
    rng = random.Random(size)
    items = [(n, rng.randrange(6)) for n in range(size)]  # many ties: only a stable merge keeps their order
    assert sorted_in_slices(items, lambda item: item[1]) == sorted(items, key=lambda item: item[1])


@pytest.mark.asyncio
async def test_the_loops_usage_write_never_waits_behind_the_workers_delete(tmp_path):
    """A delete on the worker that ran long (a cold page cache, a busy disk) held up the loop's commit, and
    every request with it (31 ms once at 10 M rows); the rows now follow as soon as the delete ends."""
    with Store(tmp_path / "state.db", prune_inline=False) as store:
        writer = UsageWriter(store)
        held, release = threading.Event(), threading.Event()

        def delete() -> None:  # the worker's transaction on its own connection, as long as the test says
            db = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
            with schema.transaction(db):
                held.set()
                release.wait(2)
            db.close()

        worker = threading.Thread(target=delete)
        worker.start()
        held.wait(2)
        writer._unwritten.append((1, "r1", "m", None, 3, 4, time.time(), 0.0, "student"))  # a request settled
        writer.write()  # on the loop: returns at once, the row kept
        still_held = not release.is_set() and worker.is_alive()
        release.set()
        worker.join()
        assert still_held and store._db.execute("SELECT count(*) FROM usage").fetchone()[0] == 0
        await until(lambda: store._db.execute("SELECT count(*) FROM usage").fetchone()[0] == 1, "the row follows")


def test_mr_serve_hands_the_gil_over_after_a_millisecond(monkeypatch):
    """While the worker builds a report in Python, the loop waited up to Python's 5 ms switch interval a turn."""
    intervals: list[float] = []
    monkeypatch.setattr(sys, "setswitchinterval", intervals.append)
    for name in ("collect", "freeze", "set_threshold"):
        monkeypatch.setattr(gc, name, lambda *args: None)
    settle_process()
    assert intervals == [0.001]
