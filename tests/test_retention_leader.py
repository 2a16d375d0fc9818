"""On a shared PostgreSQL store only the leader deletes what retention lets go, fenced by its epoch.

Marked ``postgres``: tests/pg.py starts a throwaway PostgreSQL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import psycopg
import pytest

from mindrouter.config import StoreSettings
from mindrouter.daemon.edge.services import SERVICES
from mindrouter.daemon.pollers.leader import LEADER_LOCK
from mindrouter.store import Store
from mindrouter.store.worker import StoreWorker

from .harness import _configured, daemon, until

pytestmark = pytest.mark.postgres

DAY = 86_400.0


def _old_rows(store: Store, now: float, count: int) -> None:
    for i in range(count):
        store.record_usage(1, f"old{i}", "m", None, 1, 1, at=now - 30 * DAY)
    store.record_usage(1, "new", "m", None, 1, 1, at=now - 600)


def _usage(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM usage").fetchone()[0]


async def test_a_standby_deletes_nothing_and_a_new_leader_runs_retention_at_once(tmp_path: Path, pg_url: str):
    now = time.time()
    with Store(tmp_path / "x", url=pg_url, prune_inline=False) as store:
        _old_rows(store, now, 40)
    config = _configured(tmp_path, None, {"usage_retention_days": 7.0}, None)
    config = dataclasses.replace(config, store=StoreSettings(url=pg_url))
    holder = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)  # another router leads
    await holder.execute("SELECT pg_advisory_lock(%s)", (LEADER_LOCK,))
    try:
        async with daemon(tmp_path, config=config) as d:
            services = d.app[SERVICES]
            await until(lambda: services.leadership is not None and services.leadership._conn is not None, "contends")
            await asyncio.sleep(1.5)  # retention's first pass (at start, before: deleted the 40 rows)
            assert services.role == "standby"
            assert _usage(pg_url) == 41
            await holder.close()  # the leader's session ends: this router takes over
            await until(lambda: services.leading, "the standby leads", timeout=10)
            began = time.monotonic()
            await until(lambda: _usage(pg_url) == 1, "the new leader deleted the old rows", timeout=5)
            print(f"retention ran {time.monotonic() - began:.2f} s after the takeover")
    finally:
        await holder.close()


def test_the_workers_deletes_are_fenced_by_the_leaders_epoch(tmp_path: Path, pg_url: str):
    now = time.time()
    with Store(tmp_path / "x", url=pg_url, prune_inline=False) as store:
        _old_rows(store, now, 10)
        store._db.execute("UPDATE mindrouter_leader SET epoch = 2")  # a later leader took over
    worker = StoreWorker(tmp_path / "x", usage_retention=7 * DAY, decision_days=7, url=pg_url)
    try:
        with pytest.raises(Exception, match="passed to another"):
            worker.retain(now, epoch=1).result(30)  # a leader that was frozen and resumes
        assert _usage(pg_url) == 11
        assert worker.retain(now, epoch=2).result(30) == (10, 0)
        assert _usage(pg_url) == 1
    finally:
        worker.close()
