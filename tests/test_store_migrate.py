"""`mr store migrate`: a lab's SQLite state into an empty PostgreSQL database, and back (``-m postgres``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mindrouter.store import Store

pytestmark = pytest.mark.postgres

MR = [sys.executable, "-m", "mindrouter.cli"]


def migrate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MR, "store", "migrate", *args], capture_output=True, text=True, timeout=60)


def lab(path: Path) -> str:
    """A state with every kind of row; returns ann's key."""
    with Store(path, clock=lambda: 1000.0) as s:
        s.ensure_default_groups()
        s.add_group("Lab", 2.5)
        s.set_group_quota("lab", {"tokens_per_day": 5000})
        s.add_user("ann", "lab")
        proxy = s.add_user("webui", "staff", proxy=True, proxy_group="student")
        s.add_person(proxy.id, "student", "bob@uni.edu")
        s.remove_user(s.add_user("gone", "lab").name)  # its id is never given again
        s.add_backend("gpu1", "http://h:1", "vllm", max_concurrent=4)
        key = s.create_key("ann")
        ann = s.get_user("ann").id
        for i in range(300):
            s.record_usage(ann, f"r{i}", "llama3", 1, 10, 5, 1_700_000_000.0 + i, gpu_seconds=0.5, group="lab")
        s.add_decisions([{"request_id": f"r{i}", "user": "ann", "wall_time": 1_700_000_000.0 + i} for i in range(5)])
    return key


def facts(s: Store, key: str) -> dict[str, object]:
    report = s.usage_report(["user", "day"], 1_699_000_000.0, 1_701_000_000.0)
    return {
        "export": s.export(),
        "keys": [(k.id, k.user, k.prefix) for k in s.list_keys()],
        "key_owner": s.user_for_key(key).name,
        "person": s.get_user("bob@uni.edu").owner_id == s.get_user("webui").id,
        "usage": (report.rows, report.total),
        "decisions": [d["request_id"] for d in s.recent_decisions(10)],
    }


def test_migrate_to_postgresql_and_back_keeps_everything(tmp_path: Path, pg_url: str) -> None:
    state = tmp_path / "mindrouter.db"
    key = lab(state)
    with Store(state) as s:
        before = facts(s, key)
    r = migrate("--from", str(state), "--to", pg_url)
    assert r.returncode == 0, r.stderr
    assert "usage: 300 rows" in r.stdout
    with Store(tmp_path / "unused", url=pg_url) as s:
        assert facts(s, key) == before
        assert s.add_user("new", "lab").id == 5  # after webui's person (3) and the removed user (4)
        s.remove_user("new")
        s.add_group("later", 1)  # groups and keys count on from the copied ids too
        s.create_key("ann")
        s.remove_group("later")
        s.revoke_key("ann", s.list_keys("ann")[-1].id)

    back = tmp_path / "back.db"
    r = migrate("--from", pg_url, "--to", str(back))
    assert r.returncode == 0, r.stderr
    with Store(back) as s:
        assert facts(s, key) == before

    r = migrate("--from", str(state), "--to", pg_url)  # not empty any more
    assert r.returncode == 1 and "already has groups" in r.stderr and len(r.stderr.strip().splitlines()) == 1
