"""The SQLite store: every operation, its refusals, restarts, SIGKILL durability and retention."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mindrouter import store as store_module
from mindrouter.errors import MindRouterError
from mindrouter.scheduler.settings import DEFAULT_GROUP_WEIGHTS
from mindrouter.store import (
    SCHEMA_VERSION,
    AlreadyExists,
    InUse,
    InvalidValue,
    NotFound,
    Store,
    StoreError,
    UsageRow,
    describe,
)
from mindrouter.store import schema as schema_module
from mindrouter.store import transfer as transfer_module

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "nested" / "mindrouter.db"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def st(request: pytest.FixtureRequest, path: Path):
    """The store on SQLite, and (``-m postgres``) on a fresh PostgreSQL database."""
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else ""
    with Store(path, clock=lambda: 1000.0, url=url) as s:
        s.ensure_default_groups()
        yield s


def one_sentence(exc: BaseException) -> str:
    msg = str(exc)
    assert msg and "\n" not in msg and msg.count(". ") == 0, msg
    return msg


# -- opening ---------------------------------------------------------------------


def test_open_creates_parents_wal_and_schema(path: Path) -> None:
    with Store(path) as s:
        assert path.exists()
        assert s.schema_version == SCHEMA_VERSION
        db = s._db
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_close_is_idempotent(path: Path) -> None:
    s = Store(path)
    s.close()
    s.close()


def test_newer_schema_is_refused(path: Path) -> None:
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="upgrade mindrouter"):
        Store(path)


def test_migration_steps_run_in_order(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Store(path).close()
    step = ("ALTER TABLE groups ADD COLUMN note TEXT NOT NULL DEFAULT ''",)
    monkeypatch.setattr(schema_module, "_MIGRATIONS", [*schema_module._MIGRATIONS, step])
    monkeypatch.setattr(schema_module, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    db = sqlite3.connect(path, isolation_level=None)
    assert schema_module.migrate(db) == SCHEMA_VERSION
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    assert "note" in [r[1] for r in db.execute("PRAGMA table_info(groups)")]
    assert schema_module.migrate(db) == SCHEMA_VERSION + 1  # nothing left to do
    db.close()


def test_failed_migration_leaves_version(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Store(path).close()
    monkeypatch.setattr(schema_module, "_MIGRATIONS", [*schema_module._MIGRATIONS, ("CREATE TABLE x (a)", "BOGUS")])
    monkeypatch.setattr(schema_module, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    db = sqlite3.connect(path, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError):
        schema_module.migrate(db)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'x'").fetchone() is None
    db.close()


# -- groups ----------------------------------------------------------------------


def test_default_groups_only_on_first_start(path: Path) -> None:
    with Store(path) as s:
        assert sorted(s.ensure_default_groups(DEFAULT_GROUP_WEIGHTS)) == ["admin", "faculty", "staff", "student"]
        assert {g.name: g.scheduler_weight for g in s.list_groups()} == DEFAULT_GROUP_WEIGHTS
        s.set_group_weight("staff", 5)
        s.remove_group("student")
    with Store(path) as s:
        assert s.ensure_default_groups(DEFAULT_GROUP_WEIGHTS) == []
        assert s.get_group("staff").scheduler_weight == 5
        with pytest.raises(NotFound):
            s.get_group("student")


def test_default_group_weights_are_checked(path: Path) -> None:
    with Store(path) as s, pytest.raises(InvalidValue):
        s.ensure_default_groups({"student": 0})


def test_group_operations(st: Store) -> None:
    g = st.add_group("PhD", 1.5)
    assert (g.name, g.scheduler_weight) == ("phd", 1.5)
    assert g.to_dict() == {
        "name": "phd",
        "scheduler_weight": 1.5,
        "tokens_per_day": None,
        "tokens_per_month": None,
        "requests_per_minute": None,
    }
    assert st.get_group("phd") == g == st.get_group("PHD")
    assert st.set_group_weight("phd", 4).scheduler_weight == 4.0
    assert [x.name for x in st.list_groups()] == ["admin", "faculty", "phd", "staff", "student"]
    st.remove_group("phd")
    with pytest.raises(NotFound):
        st.get_group("phd")


@pytest.mark.parametrize("weight", [0, -1, float("nan"), float("inf"), "x", None, True])
def test_bad_group_weights_are_refused(st: Store, weight: object) -> None:
    with pytest.raises(InvalidValue) as info:
        st.add_group("phd", weight)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError) and isinstance(info.value, MindRouterError)
    assert info.value.status == 400
    assert "phd" in one_sentence(info.value)
    with pytest.raises(InvalidValue):
        st.set_group_weight("staff", weight)  # type: ignore[arg-type]
    assert st.get_group("staff").scheduler_weight == 2.0


def test_group_errors_are_distinguishable(st: Store) -> None:
    with pytest.raises(AlreadyExists) as dup:
        st.add_group("staff", 1)
    assert dup.value.status == 409 and "set-weight staff" in one_sentence(dup.value)
    with pytest.raises(NotFound) as missing:
        st.set_group_weight("phd", 1)
    assert missing.value.status == 404
    assert one_sentence(missing.value) == "group 'phd' does not exist; create it with `mr group add phd --weight 1`"
    with pytest.raises(NotFound):
        st.remove_group("phd")
    assert not issubclass(NotFound, AlreadyExists) and not issubclass(AlreadyExists, NotFound)


@pytest.mark.parametrize("name", ["", " staff", "a b", "-x", "x" * 65, "é", None, 3])
def test_bad_names_are_refused(st: Store, name: object) -> None:
    with pytest.raises(InvalidValue):
        st.add_group(name, 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidValue):
        st.add_user(name, "staff")  # type: ignore[arg-type]
    with pytest.raises(InvalidValue):
        st.add_backend(name, "http://h:1", "ollama")  # type: ignore[arg-type]


def test_group_with_users_cannot_be_removed(st: Store) -> None:
    for name in ("a", "b", "c", "d"):
        st.add_user(name, "staff")
    with pytest.raises(InUse) as info:
        st.remove_group("staff")
    msg = one_sentence(info.value)
    assert "4 users" in msg and "a, b, c, ..." in msg and "mr user rm" in msg
    assert info.value.status == 409
    for name in ("a", "b", "c"):
        st.remove_user(name)
    st.set_user_group("d", "faculty")
    st.remove_group("staff")


# -- users -----------------------------------------------------------------------


def test_user_operations(st: Store) -> None:
    u = st.add_user("alice", "faculty")
    assert (u.name, u.group, u.weight_override, u.weight, u.created) == ("alice", "faculty", None, 3.0, 1000.0)
    assert u.to_dict() == {
        "name": "alice",
        "group": "faculty",
        "weight_override": None,
        "weight": 3.0,
        "tokens_per_day": None,
        "tokens_per_month": None,
        "requests_per_minute": None,
    }
    assert st.set_user_weight("alice", 7).weight == 7.0
    assert st.get_user("ALICE").weight_override == 7.0
    assert st.set_user_weight("alice", None).weight == 3.0
    assert st.set_user_group("alice", "student").weight == 1.0
    st.set_group_weight("student", 1.25)
    assert st.get_user("alice").weight == 1.25
    b = st.add_user("bob", "staff", weight=0.5)
    assert b.weight == 0.5 and b.id != u.id
    assert [x.name for x in st.list_users()] == ["alice", "bob"]
    assert [x.name for x in st.list_users(group="staff")] == ["bob"]
    st.remove_user("alice")
    with pytest.raises(NotFound) as info:
        st.get_user("alice")
    assert "mr user add alice" in one_sentence(info.value)


def test_user_errors(st: Store) -> None:
    st.add_user("alice", "staff")
    with pytest.raises(AlreadyExists):
        st.add_user("Alice", "staff")
    with pytest.raises(NotFound, match="group 'phd'"):
        st.add_user("bob", "phd")
    with pytest.raises(NotFound, match="group 'phd'"):
        st.set_user_group("alice", "phd")
    with pytest.raises(InvalidValue):
        st.add_user("bob", "staff", weight=0)
    with pytest.raises(InvalidValue):
        st.set_user_weight("alice", -2)
    for op in (
        lambda: st.set_user_weight("zed", 1),
        lambda: st.set_user_group("zed", "staff"),
        lambda: st.remove_user("zed"),
        lambda: st.create_key("zed"),
        lambda: st.revoke_keys("zed"),
    ):
        with pytest.raises(NotFound, match="user 'zed'"):
            op()


def test_user_ids_are_never_reused(st: Store) -> None:
    first = st.add_user("alice", "staff").id
    st.remove_user("alice")
    assert st.add_user("alice", "staff").id != first


# -- keys ------------------------------------------------------------------------


def test_keys(st: Store) -> None:
    st.add_user("alice", "staff")
    st.add_user("bob", "staff")
    k1, k2, kb = st.create_key("alice"), st.create_key("alice"), st.create_key("bob")
    assert k1.startswith("mr-") and len(k1) > 40 and len({k1, k2, kb}) == 3
    assert st.user_for_key(k1).name == "alice" and st.user_for_key(k2).name == "alice"
    assert st.user_for_key(kb).name == "bob"
    for bad in ("", "mr-nope", k1 + "x", k1[:-1], "x" * 10_000, None):
        assert st.user_for_key(bad) is None  # type: ignore[arg-type]
    infos = st.list_keys("alice")
    assert [i.prefix for i in infos] == [k1[:9], k2[:9]] and all(i.user == "alice" for i in infos)
    assert set(infos[0].to_dict()) == {"id", "user", "label", "prefix", "created", "last_used"}
    assert len(st.list_keys()) == 3
    assert st.revoke_keys("alice") == 2
    assert st.user_for_key(k1) is None and st.user_for_key(kb).name == "bob"
    st.remove_user("bob")
    assert st.user_for_key(kb) is None
    assert st.list_keys() == []
    st.add_user("bob", "staff")  # a new bob does not inherit the old one's key
    assert st.user_for_key(kb) is None


def test_key_weight_follows_group(st: Store) -> None:
    st.add_user("alice", "staff")
    key = st.create_key("alice")
    st.set_group_weight("staff", 9)
    assert st.user_for_key(key).weight == 9.0


def test_plaintext_key_is_nowhere_on_disk(path: Path) -> None:
    with Store(path) as s:
        s.ensure_default_groups()
        s.add_user("alice", "staff")
        key = s.create_key("alice")
        secret = key[len("mr-") + 6 :].encode()  # the part that is not the display prefix
        assert s.user_for_key(key) is not None

        def on_disk() -> bytes:
            return b"".join(p.read_bytes() for p in path.parent.iterdir())

        assert secret not in on_disk()  # before the WAL is checkpointed
        assert secret[:16] not in on_disk()
    assert secret not in on_disk() and key.encode() not in on_disk()
    import hashlib

    assert hashlib.sha256(key.encode()).hexdigest().encode() in on_disk()


# -- backends --------------------------------------------------------------------


def test_backend_operations(st: Store) -> None:
    b = st.add_backend(
        "gpu1",
        "http://10.0.0.5:11434/",
        "ollama",
        max_concurrent=2,
        gpus=[0, 1],
        node="http://10.0.0.5:8485",
        priority=5,
        parallel=4,
    )
    assert b.to_dict() == {
        "id": b.id,
        "name": "gpu1",
        "url": "http://10.0.0.5:11434",
        "engine": "ollama",
        "max_concurrent": 2,
        "gpus": [0, 1],
        "node": "http://10.0.0.5:8485",
        "priority": 5.0,
        "state": "enabled",
        "parallel": 4,
        "max_loaded": None,
    }
    assert st.get_backend("gpu1") == b == st.get_backend(b.id)
    assert st.update_backend("gpu1", max_loaded=2).max_loaded == 2
    c = st.add_backend("vllm1", "https://box:8000", "vllm")
    assert (c.max_concurrent, c.gpus, c.node, c.priority, c.state) == (4, (), "", 0.0, "enabled")
    assert [x.name for x in st.list_backends()] == ["gpu1", "vllm1"]
    u = st.update_backend("gpu1", url="http://10.0.0.6:11434", max_concurrent=8, gpus=[], node="", priority=-1)
    assert (u.id, u.url, u.max_concurrent, u.gpus, u.node, u.priority, u.engine) == (
        b.id,
        "http://10.0.0.6:11434",
        8,
        (),
        "",
        -1.0,
        "ollama",
    )
    assert st.set_backend_state("gpu1", "draining").state == "draining"
    assert st.set_backend_state(b.id, "disabled").state == "disabled"
    assert st.update_backend(b.id, engine="llamacpp").engine == "llamacpp"
    st.remove_backend("gpu1")
    with pytest.raises(NotFound) as info:
        st.get_backend("gpu1")
    assert "mr backend list" in one_sentence(info.value)
    d = st.add_backend("gpu1", "http://h:1", "openai")
    assert d.id not in (b.id, c.id)  # decision records keep meaning the old backend


@pytest.mark.parametrize(
    "kw",
    [
        {"url": "ftp://h"},
        {"url": "localhost:11434"},
        {"url": ""},
        {"url": "http://h x"},
        {"engine": "tgi"},
        {"max_concurrent": 0},
        {"max_concurrent": 1.5},
        {"max_concurrent": True},
        {"gpus": [-1]},
        {"gpus": [0, 0]},
        {"gpus": "0,1"},
        {"gpus": [True]},
        {"node": "box"},
        {"priority": float("nan")},
        {"priority": "high"},
        {"state": "on"},
    ],
)
def test_bad_backend_fields_are_refused(st: Store, kw: dict) -> None:
    args = {"url": "http://h:1", "engine": "ollama", **kw}
    with pytest.raises(InvalidValue) as info:
        st.add_backend("gpu1", args.pop("url"), args.pop("engine"), **args)
    assert "gpu1" in one_sentence(info.value)
    st.add_backend("ok", "http://h:1", "ollama")
    with pytest.raises(InvalidValue):
        st.update_backend("ok", **kw)
    assert st.get_backend("ok").to_dict()["url"] == "http://h:1"


def test_backend_errors(st: Store) -> None:
    st.add_backend("gpu1", "http://h:1", "ollama")
    with pytest.raises(AlreadyExists):
        st.add_backend("GPU1", "http://h:2", "vllm")
    for op in (
        lambda: st.update_backend("x", priority=1),
        lambda: st.set_backend_state("x", "enabled"),
        lambda: st.remove_backend("x"),
        lambda: st.get_backend(999),
    ):
        with pytest.raises(NotFound):
            op()


# -- usage -----------------------------------------------------------------------


def test_usage(st: Store) -> None:
    a = st.add_user("alice", "staff").id
    b = st.add_user("bob", "staff").id
    st.record_usage(a, "r1", "llama3", 1, 10, 20, at=100.0)
    st.record_usage(b, "r2", "llama3", None, 5, 0, at=150.0)
    st.record_usage(a, "r3", "llama3", 1, 1, 2, at=200.0)
    assert st.recent_usage(150.0) == [UsageRow(b, 5, 0, 150.0, "llama3"), UsageRow(a, 1, 2, 200.0, "llama3")]
    assert st.recent_usage(0) == [(a, 10, 20, 100.0, "llama3"), (b, 5, 0, 150.0, "llama3"), (a, 1, 2, 200.0, "llama3")]
    totals = st.usage_totals(0)
    assert (totals[a].requests, totals[a].prompt_tokens, totals[a].completion_tokens, totals[a].tokens) == (
        2,
        11,
        22,
        33,
    )
    assert totals[b].to_dict() == {
        "user_id": b,
        "user": "bob",
        "requests": 1,
        "prompt_tokens": 5,
        "completion_tokens": 0,
        "tokens": 5,
    }
    assert set(st.usage_totals(160)) == {a}
    st.remove_user("bob")  # usage stays for accounting, and recording for a removed user never fails
    st.record_usage(b, "r4", "llama3", 1, 1, 1, at=210.0)
    assert st.usage_totals(0)[b].user is None


def test_usage_pruning(path: Path) -> None:
    with Store(path, usage_retention=100.0) as s:
        for i in range(10):
            s.record_usage(1, f"r{i}", "m", 1, 1, 1, at=float(i * 20))
        assert s.prune_usage(200.0) == 5  # keeps at >= 100
        assert [r.at for r in s.recent_usage(0)] == [100.0, 120.0, 140.0, 160.0, 180.0]
        assert s.prune_usage(1000.0, limit=2) == 2
        assert len(s.recent_usage(0)) == 3


def test_usage_prunes_itself_as_it_grows(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Store, "_PRUNE_USAGE_EVERY", 10)
    with Store(path, usage_retention=50.0) as s:
        for i in range(200):
            s.record_usage(1, f"r{i}", "m", 1, 1, 1, at=float(i))
        assert min(r.at for r in s.recent_usage(0)) >= 190 - 50


# -- decisions -------------------------------------------------------------------


def decision(i: int, user: str = "alice") -> dict:
    return {
        "request_id": f"req{i}",
        "selected_backend_id": 1,
        "candidate_backends": [1, 2],
        "scores": {"1": 150.0, "2": 80.0},
        "user_deficit": -1000,
        "user_weight": 3,
        "user_group": "faculty",
        "user_recent_usage": 30000,
        "user": user,
        "time": 12.5,
        "wall_time": 1_700_000_000.0 + i,
    }


def test_decisions(st: Store) -> None:
    for i in range(5):
        st.add_decision(decision(i, "alice" if i % 2 == 0 else "bob"))
    assert [d["request_id"] for d in st.recent_decisions(3)] == ["req2", "req3", "req4"]  # newest last
    assert [d["request_id"] for d in st.recent_decisions(10, user="bob")] == ["req1", "req3"]
    assert st.recent_decisions(0) == []
    assert st.get_decision("req3") == decision(3, "bob")
    assert st.get_decision("nope") is None
    st.add_decision({**decision(3, "bob"), "attempt": 2})
    assert st.get_decision("req3")["attempt"] == 2  # the newest attempt
    row = st._db.execute("SELECT user, at FROM decisions WHERE request_id = 'req0'").fetchone()
    assert row == ("alice", 1_700_000_000.0)
    with pytest.raises(InvalidValue):
        st.add_decision({"selected_backend_id": 1})


def test_decisions_filtered_by_their_fields_among_the_newest(st: Store) -> None:
    for i in range(6):
        st.add_decision({**decision(i, "alice" if i % 2 == 0 else "bob"), "model": "qwen" if i < 3 else "llama3"})

    def ids(rows: list[dict[str, object]]) -> list[str]:
        return [str(d["request_id"]) for d in rows]

    assert ids(st.recent_decisions(10, fields={"model": "qwen"}, searched=100)) == ["req0", "req1", "req2"]
    assert ids(st.recent_decisions(10, user="alice", fields={"model": "qwen"}, searched=100)) == ["req0", "req2"]
    assert ids(st.recent_decisions(10, fields={"model": "qwen"}, searched=4)) == ["req2"]  # among req2..req5
    assert ids(st.recent_decisions(10, user="bob", fields={"model": "llama3"}, searched=1)) == ["req5"]
    with pytest.raises(ValueError):
        st.recent_decisions(10, fields={"record": "x"})


def test_add_decisions_in_one_commit(path: Path) -> None:
    with Store(path, max_decisions=20) as s:
        s.add_decisions(decision(i) for i in range(50))
        assert [d["request_id"] for d in s.recent_decisions(20)] == [f"req{i}" for i in range(30, 50)]
        with pytest.raises(InvalidValue):
            s.add_decisions([decision(50), {"user": "x"}])  # checked before anything is written
        assert s.get_decision("req50") is None


def test_decision_retention_is_bounded(path: Path) -> None:
    with Store(path, max_decisions=50) as s:
        batch = s._decision_batch
        for i in range(1000):
            s.add_decision(decision(i))
            count = s._db.execute("SELECT count(*) FROM decisions").fetchone()[0]
            assert count <= 50 + batch
        kept = [d["request_id"] for d in s.recent_decisions(1000)]
        assert kept[-50:] == [f"req{i}" for i in range(950, 1000)]
        assert s.get_decision("req0") is None
    with Store(path, max_decisions=50) as s:  # the bound holds across a restart
        for i in range(1000, 1100):
            s.add_decision(decision(i))
        assert s._db.execute("SELECT count(*) FROM decisions").fetchone()[0] <= 50 + s._decision_batch
        assert s.recent_decisions(1)[0]["request_id"] == "req1099"


# -- restart and SIGKILL ---------------------------------------------------------


def test_everything_survives_restart(path: Path) -> None:
    with Store(path) as s:
        s.ensure_default_groups()
        s.add_group("phd", 1.5)
        s.add_user("alice", "phd", weight=2)
        key = s.create_key("alice")
        backend = s.add_backend("gpu1", "http://h:1", "vllm", gpus=[2])
        s.record_usage(1, "r1", "m", backend.id, 3, 4, at=50.0)
        s.add_decision(decision(1))
        before = s.export()
    with Store(path) as s:
        assert s.export() == before
        assert s.user_for_key(key).name == "alice"
        assert s.recent_usage(0) == [(1, 3, 4, 50.0, "m")]
        assert s.get_decision("req1") == decision(1)


def test_sigkill_loses_nothing_that_returned(path: Path) -> None:
    child = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from mindrouter.store import Store
        s = Store(Path({str(path)!r}))
        s.ensure_default_groups()
        s.add_user("alice", "staff")
        key = s.create_key("alice")
        s.add_backend("gpu1", "http://h:1", "ollama")
        for i in range(100):
            s.record_usage(1, f"r{{i}}", "llama3", 1, i, 1, at=1000.0 + i)
        s.add_decision({{"request_id": "last", "user": "alice"}})
        print(key, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", child],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        key = proc.stdout.readline().strip()  # type: ignore[union-attr]
        assert key.startswith("mr-"), key
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()  # type: ignore[union-attr]
    assert proc.returncode == -signal.SIGKILL
    with Store(path) as s:
        assert s.get_user("alice").group == "staff"
        assert s.user_for_key(key).name == "alice"
        assert s.get_backend("gpu1").engine == "ollama"
        usage = s.recent_usage(0)
        assert len(usage) == 100 and (usage[-1].user_id, usage[-1].tokens, usage[-1].at) == (1, 100, 1099.0)
        assert s.get_decision("last") is not None


# -- export / import -------------------------------------------------------------


def test_export_shape_and_round_trip(st: Store, tmp_path: Path) -> None:
    st.add_user("alice", "faculty")
    st.add_user("bob", "staff", weight=0.5)
    st.create_key("alice")
    st.add_backend("gpu1", "http://h:1", "ollama", gpus=[0], node="http://n:1", state="draining")
    data = st.export()
    assert set(data) == {"version", "groups", "users", "backends"}
    assert {"name": "staff", "scheduler_weight": 2.0} in data["groups"]
    assert data["users"] == [
        {"name": "alice", "group": "faculty"},
        {"name": "bob", "group": "staff", "weight_override": 0.5},
    ]
    assert "mr-" not in json.dumps(data)
    import tomllib

    import tomli_w

    text = tomli_w.dumps(data)  # TOML can hold it: no nulls
    with Store(tmp_path / "other.db") as other:
        assert other.import_(tomllib.loads(text)) | {"changes": []} == {
            "groups": 4,
            "users": 2,
            "backends": 1,
            "changes": [],
        }
        assert other.export() == data
        assert other.list_keys() == []


def test_import_upserts_by_name(st: Store) -> None:
    st.add_user("alice", "staff", weight=4)
    st.add_user("carol", "staff")
    st.add_backend("gpu1", "http://h:1", "ollama", priority=3)
    result = st.import_(
        {
            "groups": [{"name": "PhD", "scheduler_weight": 1.5}, {"name": "staff", "scheduler_weight": 2.5}],
            "users": [{"name": "alice", "group": "phd"}, {"name": "bob", "group": "faculty", "weight": 99}],
            "backends": [{"id": 77, "name": "gpu1", "url": "http://h:2", "engine": "vllm"}],
        }
    )
    assert {k: result[k] for k in ("groups", "users", "backends")} == {"groups": 2, "users": 2, "backends": 1}
    assert [describe(c) for c in result["changes"]] == [
        "group phd: new (scheduler_weight 1.5)",
        "group staff: scheduler_weight 2 → 2.5",
        "user alice: group staff → phd",
        "user alice: weight_override 4 → not set",
        "user bob: new (group faculty)",
        "backend gpu1: engine ollama → vllm",
        "backend gpu1: priority 3 → 0",
        "backend gpu1: url http://h:1 → http://h:2",
    ]
    alice = st.get_user("alice")
    assert (alice.group, alice.weight_override, alice.weight) == ("phd", None, 1.5)  # a left-out field is its default
    assert st.get_user("bob").weight == 3.0  # derived `weight` ignored
    assert st.get_user("carol").weight == 2.5  # untouched, follows its group
    b = st.get_backend("gpu1")
    assert (b.url, b.engine, b.priority) == ("http://h:2", "vllm", 0.0) and b.id != 77
    assert st.import_({}) == {"groups": 0, "users": 0, "backends": 0, "changes": []}


def test_a_dry_run_import_lists_its_changes_and_changes_nothing(st: Store) -> None:
    st.add_backend("gpu1", "http://h:1", "ollama", max_concurrent=6)
    st.set_group_quota("staff", {"tokens_per_day": 1000})
    before = st.export()
    doc = {
        "groups": [{"name": "staff", "scheduler_weight": 2}],  # its quota left out: removed
        "backends": [{"name": "gpu1", "url": "http://h:1", "engine": "ollama", "max_concurrent": 8}],
    }
    dry = st.import_(doc, dry_run=True)
    assert dry["changes"] == [
        {"kind": "group", "name": "staff", "field": "tokens_per_day", "before": 1000, "after": None},
        {"kind": "backend", "name": "gpu1", "field": "max_concurrent", "before": 6, "after": 8},
    ]
    assert st.export() == before
    assert st.import_(doc)["changes"] == dry["changes"] and st.get_backend("gpu1").max_concurrent == 8


GOOD = {
    "groups": [{"name": "new", "scheduler_weight": 1}, {"name": "staff", "scheduler_weight": 9}],
    "users": [{"name": "alice", "group": "new"}, {"name": "zed", "group": "new"}],
    "backends": [{"name": "gpu1", "url": "http://h:9", "engine": "vllm"}],
}


def plus(section: str, entry: object) -> dict:
    """GOOD with one bad entry after the good ones, which must not be applied either."""
    return {**GOOD, section: [*GOOD[section], entry]}


@pytest.mark.parametrize(
    "doc, needle",
    [
        ([], "must be a table"),
        ({**GOOD, "secrets": []}, "unknown section 'secrets'"),
        ({**GOOD, "version": 2}, "version 2"),
        ({**GOOD, "groups": {"name": "x"}}, "must be a list"),
        (plus("groups", "x"), "groups[2] must be a table"),
        (plus("groups", {"name": "x"}), "lacks 'scheduler_weight'"),
        (plus("groups", {"name": "x", "scheduler_weight": 1, "color": "red"}), "unknown field 'color'"),
        (plus("groups", {"name": "x y", "scheduler_weight": 1}), "groups[2]: group name"),
        (plus("groups", {"name": "x", "scheduler_weight": -1}), "groups[2]: cannot set the weight"),
        (plus("groups", {"name": "NEW", "scheduler_weight": 2}), "repeats"),
        (plus("users", {"name": "eve", "group": "nobody"}), "group 'nobody'"),
        (plus("users", {"name": "eve", "group": "staff", "weight_override": 0}), "users[2]"),
        (plus("backends", {"name": "b", "url": "nope", "engine": "ollama"}), "backends[1]"),
        (plus("backends", {"name": "b", "url": "http://h:1", "engine": "tgi"}), "engine 'tgi'"),
        (
            plus("backends", {"name": "b", "url": "http://h:1", "engine": "ollama", "max_concurrent": 0}),
            "max_concurrent",
        ),
    ],
)
def test_bad_import_changes_nothing(st: Store, doc: object, needle: str) -> None:
    st.add_user("alice", "staff")
    st.add_backend("gpu1", "http://h:1", "ollama")
    before = st.export()
    with pytest.raises(InvalidValue) as info:
        st.import_(doc)  # type: ignore[arg-type]
    assert needle in one_sentence(info.value)
    assert st.export() == before
    st.import_(GOOD)  # and the good part alone goes in
    assert st.get_user("alice").group == "new"


def test_import_rolls_back_when_a_write_fails(st: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    before = st.export()
    real = transfer_module._validate_import

    def sneaky(data, groups):  # validation passes, then the database refuses a row
        g, u, b = real(data, groups)
        return g, u, [(name, (f[0], "tgi", *f[2:])) for name, f in b]

    monkeypatch.setattr(transfer_module, "_validate_import", sneaky)
    with pytest.raises(sqlite3.IntegrityError):
        st.import_(
            {
                "groups": [{"name": "new", "scheduler_weight": 1}],
                "backends": [{"name": "b", "url": "http://h:1", "engine": "ollama"}],
            }
        )
    assert st.export() == before


def test_exported_members() -> None:
    assert all(hasattr(store_module, name) for name in store_module.__all__)
    assert len(set(store_module.__all__)) == len(store_module.__all__)


def test_proxies_survive_export_and_import(st: Store, tmp_path: Path) -> None:
    st.add_user("webui", "staff", proxy=True, proxy_group="student")
    st.add_user("gate", "staff", proxy=True)
    st.add_person(st.get_user("webui").id, "student", "alice@lab.edu")
    doc = st.export()
    rows = {u["name"]: u for u in doc["users"]}
    assert rows["webui"]["proxy_for"] == "student" and rows["gate"]["proxy_for"] == "staff"
    assert "proxy_for" not in rows["alice@lab.edu"] and rows["alice@lab.edu"]["person_of"] == "webui"
    with Store(tmp_path / "other.db") as other:
        other.ensure_default_groups()
        other.import_(doc)
        assert (other.get_user("webui").forwards_to, other.get_user("gate").forwards_to) == ("student", "staff")
        assert other.get_user("alice@lab.edu").forwards_to is None
        assert other.get_user("alice@lab.edu").person_of == "webui"
    with pytest.raises(InvalidValue, match="proxy_for 'nope'"):
        st.import_({"users": [{"name": "x", "group": "staff", "proxy_for": "nope"}]})


def test_a_revoked_keys_id_is_never_given_again(st: Store) -> None:
    st.add_user("kim", "staff")
    st.create_key("kim")
    st.create_key("kim")
    last = st.list_keys("kim")[-1].id
    st.revoke_key("kim", last)
    st.create_key("kim")
    assert st.list_keys("kim")[-1].id == last + 1  # was `last` again


def test_counts_and_the_users_by_id_are_read_without_reading_every_user(st: Store) -> None:
    """What Live, Groups, `mr group list` and `mr user list` read instead of every row (issue 33)."""
    ids = {name: st.add_user(name, group).id for name, group in (("Zoe", "staff"), ("al", "student"), ("bo", "staff"))}
    st.create_key("al"), st.create_key("al"), st.create_key("Zoe")
    assert st.users_per_group() == {"staff": 2, "student": 1, "faculty": 0, "admin": 0}
    assert st.key_counts() == {"al": 2, "Zoe": 1}
    assert [u.name for u in st.users_by_id([ids["Zoe"], ids["al"], ids["al"], 999])] == ["al", "Zoe"]
    assert st.users_by_id([]) == []
