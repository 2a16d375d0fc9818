"""One machine at a campus's size (issue 33): listings cost the people active, reports and retention stay off the loop.

Counts, not clocks: what a listing reads does not grow with registered idle users.
"""

from __future__ import annotations

import re

import pytest

from mindrouter.daemon.request.weights import apply_user

from .harness import ADMIN_KEY, Daemon
from .inprocess import InProcess

pytestmark = pytest.mark.asyncio

IDLE = 500


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


async def test_per_user_metrics_list_the_active_people_only(daemon):
    await _pool(daemon)
    resp = await daemon.client.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    lines = [line for line in (await resp.text()).splitlines() if line.startswith("mindrouter_user_recent_tokens{")]
    assert sorted(re.search(r'user="([^"]+)"', line)[1] for line in lines) == ["alice", "bob"]  # was: all 502


async def test_me_reads_the_active_people_and_an_idle_person_still_sees_their_standing(daemon):
    alice, _ = await _pool(daemon)
    me = await (await daemon.client.get("/v1/me", headers={"Authorization": f"Bearer {alice}"})).json()
    share = me["fair_share"]
    assert share["active_users"] == 2 and share["position"] in (1, 2) and share["recent_tokens"] > 0
    assert share["normalized_share"] == pytest.approx(2 / 3, abs=1e-3)  # weight 2 next to bob's 1
    idle = daemon.store.create_key("idle0001")
    mine = await (await daemon.client.get("/v1/me", headers={"Authorization": f"Bearer {idle}"})).json()
    assert mine["fair_share"]["weight"] == 1 and mine["fair_share"]["position"] is None
    assert mine["fair_share"]["normalized_share"] == pytest.approx(1 / 4, abs=1e-3)  # were it to ask now
