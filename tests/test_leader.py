"""The leader lock in-process: one of two contenders leads, a failed takeover gives the lock back,
and a change through any session is heard (``-m postgres``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mindrouter.daemon.pollers.leader import Leadership
from mindrouter.store import Store

from .harness import until

pytestmark = pytest.mark.postgres


class Contender:
    def __init__(self, url: str, *, fail_first: bool = False) -> None:
        self.led: list[int] = []
        self.changes: list[str] = []
        self.lost = 0
        self.fail_first = fail_first
        self.leadership = Leadership(
            url, on_lead=self.on_lead, on_change=self.changes.append, on_lost=self.on_lost, heartbeat=0.2
        )

    async def on_lead(self, epoch: int) -> None:
        if self.fail_first:
            self.fail_first = False
            raise RuntimeError("the store is not there")
        self.led.append(epoch)

    def on_lost(self) -> None:
        self.lost += 1


async def test_one_of_two_leads_a_failed_takeover_gives_the_lock_back_and_changes_are_heard(
    tmp_path: Path, pg_url: str
) -> None:
    Store(tmp_path / "x", url=pg_url).close()  # the schema, the epoch table and the change triggers
    first, second = Contender(pg_url, fail_first=True), Contender(pg_url)
    tasks = [asyncio.create_task(first.leadership.run())]
    try:
        # Its first takeover (epoch 1) fails: it gives the lock back and wins it again (epoch 2).
        await until(lambda: first.leadership.leading, "the first leads after a failed takeover")
        assert first.led == [2] and first.leadership.epoch == 2
        tasks.append(asyncio.create_task(second.leadership.run()))
        await asyncio.sleep(0.5)
        assert (first.leadership.role, second.leadership.role) == ("leader", "standby")
        with Store(tmp_path / "y", url=pg_url) as store:
            store.ensure_default_groups()
        await until(lambda: "groups" in first.changes and "groups" in second.changes, "both hear of the groups")
        tasks[0].cancel()  # the leader's session ends: the other takes over
        await until(lambda: second.leadership.leading, "the other leads", timeout=5)
        assert second.led == [3]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert first.lost == second.lost == 0  # ended, not lost
