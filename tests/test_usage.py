"""Usage reports and their roll-up into daily totals, checked against totals worked out by hand.

Days, weeks and months are the server's local calendar; the ``tz`` fixture
sets the process's zone (as ``TZ`` does for the daemon) for each test.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from mindrouter.localtime import (
    Periods,
    day_key,
    day_start,
    month_key,
    month_start,
    next_day,
    next_month,
    parse_when,
    zone_label,
)
from mindrouter.store import SCHEMA_VERSION, InvalidValue, Store
from mindrouter.store import schema as schema_module


@pytest.fixture
def tz(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """Set the local zone: ``tz("Europe/Berlin")``; the old one is back after the test.

    A store on PostgreSQL set its session's zone when it connected: it is told the new one too."""

    def use(name: str) -> ZoneInfo:
        monkeypatch.setenv("TZ", name)
        time.tzset()
        if "st" in request.fixturenames and request.getfixturevalue("st").url:
            request.getfixturevalue("st")._db.execute("SELECT set_config('TimeZone', ?, false)", (name,))
        return ZoneInfo(name)

    yield use
    monkeypatch.undo()
    time.tzset()


def at(zone: ZoneInfo, text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def st(request: pytest.FixtureRequest, tmp_path: Path):
    """The store on SQLite, and (``-m postgres``) on a fresh PostgreSQL database."""
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else ""
    with Store(tmp_path / "m.db", usage_retention=1e12, url=url) as s:
        s.ensure_default_groups()
        s.add_user("alice", "staff")
        s.add_user("bob", "student")
        s.add_backend("gpu1", "http://h:1", "ollama")
        s.add_backend("gpu2", "http://h:2", "vllm")
        yield s


def record(st: Store, user: str, when: float, model: str, backend: str, p: int, c: int, g: float = 1.0) -> None:
    u = st.get_user(user)
    st.record_usage(u.id, f"r{when}", model, st.get_backend(backend).id, p, c, when, gpu_seconds=g, group=u.group)


def totals(rows: list[dict], *keys: str) -> dict:
    return {tuple(r[k] for k in keys): (r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in rows}


@pytest.mark.parametrize("zone_name", ["Europe/Berlin", "America/New_York", "UTC", "Asia/Kolkata"])
def test_days_and_months_follow_the_local_calendar(st: Store, tz, zone_name: str) -> None:
    zone = tz(zone_name)
    # 23:30 on Oct 31 and 00:30 on Nov 1, local: different days and different months.
    record(st, "alice", at(zone, "2026-10-31T23:30"), "llama3", "gpu1", 10, 20, 2.5)
    record(st, "alice", at(zone, "2026-11-01T00:30"), "llama3", "gpu1", 1, 2, 0.5)
    record(st, "bob", at(zone, "2026-11-01T12:00"), "qwen", "gpu2", 100, 200, 4.0)
    record(st, "bob", at(zone, "2026-11-30T23:59:59"), "qwen", "gpu2", 5, 5, 1.0)
    record(st, "bob", at(zone, "2026-12-01T00:00"), "qwen", "gpu1", 7, 7, 1.0)
    since, until = at(zone, "2026-10-01T00:00"), at(zone, "2027-01-01T00:00")

    report = st.usage_report(["month"], since, until)
    assert totals(report.rows, "month") == {
        ("2026-10",): (1, 10, 20),
        ("2026-11",): (3, 106, 207),
        ("2026-12",): (1, 7, 7),
    }
    assert report.total == {"requests": 5, "prompt_tokens": 123, "completion_tokens": 234, "gpu_seconds": 9.0}
    by_day = st.usage_report(["day", "user"], since, until)
    assert [(r["day"], r["user"], r["requests"]) for r in by_day.rows] == [
        ("2026-10-31", "alice", 1),
        ("2026-11-01", "bob", 1),  # most tokens first within a day
        ("2026-11-01", "alice", 1),
        ("2026-11-30", "bob", 1),
        ("2026-12-01", "bob", 1),
    ]
    # Weeks start on Monday: 2026-10-26 (Mon) holds Oct 31 and Nov 1 (Sun); Nov 30 and Dec 1 are in the next.
    assert totals(st.usage_report(["week"], since, until).rows, "week") == {
        ("2026-10-26",): (3, 111, 222),
        ("2026-11-30",): (2, 12, 12),
    }
    # "Last month" by group and model, with backend names.
    november = st.usage_report(
        ["group", "model", "backend"], at(zone, "2026-11-01T00:00"), at(zone, "2026-12-01T00:00")
    )
    assert totals(november.rows, "group", "model", "backend") == {
        ("student", "qwen", "gpu2"): (2, 105, 205),
        ("staff", "llama3", "gpu1"): (1, 1, 2),
    }
    assert november.rows[0]["gpu_seconds"] == 5.0


def test_partial_days_at_the_ends_count_only_their_hours(st: Store, tz) -> None:
    zone = tz("Europe/Berlin")
    for hour in (1, 9, 17):
        for day in (2, 3, 4):
            record(st, "alice", at(zone, f"2026-11-0{day}T{hour:02d}:00"), "m", "gpu1", 1, 0)
    report = st.usage_report(["day"], at(zone, "2026-11-02T08:00"), at(zone, "2026-11-04T10:00"))
    assert totals(report.rows, "day") == {
        ("2026-11-02",): (2, 2, 0),  # 09:00 and 17:00
        ("2026-11-03",): (3, 3, 0),  # whole day, from the daily totals
        ("2026-11-04",): (2, 2, 0),  # 01:00 and 09:00
    }
    within_one_day = st.usage_report([], at(zone, "2026-11-03T08:00"), at(zone, "2026-11-03T10:00"))
    assert within_one_day.rows == [{"requests": 1, "prompt_tokens": 1, "completion_tokens": 0, "gpu_seconds": 1.0}]
    assert st.usage_report(["user"], at(zone, "2026-12-01T00:00"), at(zone, "2026-12-02T00:00")).rows == []


def test_rolled_up_rows_still_report(tmp_path: Path, tz) -> None:
    zone = tz("America/New_York")
    with Store(tmp_path / "m.db", usage_retention=10 * 86400.0) as s:
        s.ensure_default_groups()
        s.add_user("alice", "staff")
        s.add_backend("gpu1", "http://h:1", "ollama")
        for day in range(1, 29):
            for hour in (3, 15):
                record(s, "alice", at(zone, f"2026-02-{day:02d}T{hour:02d}:00"), "m", "gpu1", day, 1)
        whole = s.usage_report(["month"], at(zone, "2026-02-01T00:00"), at(zone, "2026-03-01T00:00"))
        before = s.usage_report(["day"], at(zone, "2026-02-01T00:00"), at(zone, "2026-03-01T00:00")).rows
        deleted = s.prune_usage(at(zone, "2026-03-01T00:00"))
        assert deleted == 2 * 18  # Feb 1 .. Feb 18 are older than ten days
        assert s.usage_report(["month"], at(zone, "2026-02-01T00:00"), at(zone, "2026-03-01T00:00")).rows == whole.rows
        assert whole.total["prompt_tokens"] == 2 * sum(range(1, 29))
        after = s.usage_report(["day"], at(zone, "2026-02-01T00:00"), at(zone, "2026-03-01T00:00"))
        assert after.rows == before
        assert after.day_resolution_before == at(zone, "2026-02-18T15:00")
        # An end inside a rolled-up day widens to the whole day, and the report says where it starts.
        partial = s.usage_report(["day"], at(zone, "2026-02-05T12:00"), at(zone, "2026-02-06T12:00"))
        assert totals(partial.rows, "day") == {("2026-02-05",): (2, 10, 2), ("2026-02-06",): (2, 12, 2)}
        assert partial.since == at(zone, "2026-02-05T00:00") and partial.until == at(zone, "2026-02-07T00:00")
        assert s.recent_usage(0)[0].at == at(zone, "2026-02-19T03:00")


def daily_rows(s: Store) -> list[tuple]:
    return s._db.execute(
        "SELECT day, sum(requests), sum(prompt_tokens) FROM usage_daily GROUP BY day ORDER BY day"
    ).fetchall()


def test_a_requests_commit_writes_its_row_alone_and_every_row_is_rolled_up_once(st: Store, tz) -> None:
    """The totals are added up in batches, before they are read: each row once, however the reads fall."""
    zone = tz("Europe/Berlin")
    record(st, "alice", at(zone, "2026-11-02T09:00"), "m", "gpu1", 10, 1)
    assert daily_rows(st) == []  # the request's commit did not touch the totals
    whole_days = (at(zone, "2026-11-01T00:00"), at(zone, "2026-11-04T00:00"))
    assert st.usage_report([], *whole_days).total["requests"] == 1
    assert daily_rows(st) == [("2026-11-02", 1, 10)]
    record(st, "bob", at(zone, "2026-11-02T10:00"), "m", "gpu1", 5, 1)
    record(st, "alice", at(zone, "2026-11-03T10:00"), "m", "gpu1", 7, 1)
    assert st.daily_tokens(at(zone, "2026-11-02T00:00")) == [
        ("2026-11-02", st.get_user("alice").id, "staff", 11),
        ("2026-11-02", st.get_user("bob").id, "student", 6),
        ("2026-11-03", st.get_user("alice").id, "staff", 8),
    ]
    for _ in range(2):
        assert st.usage_report(["day"], *whole_days).rows == [
            {"day": "2026-11-02", "requests": 2, "prompt_tokens": 15, "completion_tokens": 2, "gpu_seconds": 2.0},
            {"day": "2026-11-03", "requests": 1, "prompt_tokens": 7, "completion_tokens": 1, "gpu_seconds": 1.0},
        ]
    assert daily_rows(st) == [("2026-11-02", 2, 15), ("2026-11-03", 1, 7)]


def test_rows_are_rolled_up_as_they_come_so_no_report_waits_on_a_long_backlog(st: Store, monkeypatch) -> None:
    monkeypatch.setattr(Store, "_ROLL_USAGE_EVERY", 4)
    for i in range(9):
        record(st, "alice", 1_000_000.0 + i, "m", "gpu1", 1, 0)
    assert sum(n for _, n, _ in daily_rows(st)) == 8  # rolled at the 4th and 8th row; the 9th waits for a read


def test_rows_after_a_prune_that_emptied_the_table_are_still_rolled_up(tmp_path: Path, tz) -> None:
    """SQLite numbers the next row from the highest id left: after every row is deleted it starts again at 1."""
    zone = tz("UTC")
    with Store(tmp_path / "m.db", usage_retention=86400.0) as s:
        s.ensure_default_groups()
        s.add_user("alice", "staff")
        s.add_backend("gpu1", "http://h:1", "ollama")
        for hour in range(5):
            record(s, "alice", at(zone, f"2026-01-05T{hour:02d}:00"), "m", "gpu1", 1, 0)
        assert s.prune_usage(at(zone, "2026-02-01T00:00")) == 5
        record(s, "alice", at(zone, "2026-02-01T10:00"), "m", "gpu1", 100, 0)
        record(s, "alice", at(zone, "2026-02-01T11:00"), "m", "gpu1", 200, 0)
        assert s._db.execute("SELECT min(id) FROM usage").fetchone()[0] == 1  # ids given again
        report = s.usage_report(["day"], at(zone, "2026-01-01T00:00"), at(zone, "2026-03-01T00:00"))
        assert totals(report.rows, "day") == {("2026-01-05",): (5, 5, 0), ("2026-02-01",): (2, 300, 0)}
        month = s.usage_report(["month"], at(zone, "2026-01-01T00:00"), at(zone, "2026-03-01T00:00"))
        assert totals(month.rows, "month") == {("2026-01",): (5, 5, 0), ("2026-02",): (2, 300, 0)}


def test_a_database_whose_triggers_kept_the_totals_moves_to_rolling_them_up(tmp_path: Path, tz, monkeypatch) -> None:
    zone = tz("UTC")
    path = tmp_path / "v8.db"
    monkeypatch.setattr(schema_module, "_MIGRATIONS", schema_module._MIGRATIONS[:8])
    monkeypatch.setattr(schema_module, "SCHEMA_VERSION", 8)
    with Store(path) as old:
        old.ensure_default_groups()
        old.add_user("alice", "staff")
        old.add_backend("gpu1", "http://h:1", "ollama")
        record(old, "alice", at(zone, "2026-03-02T10:00"), "m", "gpu1", 3, 4)
        assert daily_rows(old) == [("2026-03-02", 1, 3)]  # the trigger added it as it was written
    monkeypatch.undo()
    tz("UTC")
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        assert s._db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'trigger'").fetchone()[0] == 0
        record(s, "alice", at(zone, "2026-03-02T11:00"), "m", "gpu1", 5, 6)
        report = s.usage_report(["day"], at(zone, "2026-03-01T00:00"), at(zone, "2026-04-01T00:00"))
        assert totals(report.rows, "day") == {("2026-03-02",): (2, 8, 10)}  # the old row counted once
        assert daily_rows(s) == [("2026-03-02", 2, 8)]


def test_removed_users_and_backends_keep_their_usage(st: Store) -> None:
    record(st, "bob", 1000.0, "m", "gpu2", 3, 4)
    st.remove_user("bob")
    st.remove_backend("gpu2")
    rows = st.usage_report(["user", "group", "backend"], 0.0, 2000.0).rows
    assert rows == [
        {
            "user": f"#{2}",
            "group": "student",
            "backend": "#2",
            "requests": 1,
            "prompt_tokens": 3,
            "completion_tokens": 4,
            "gpu_seconds": 1.0,
        }
    ]


def test_report_refusals(st: Store) -> None:
    with pytest.raises(InvalidValue, match="cannot group usage by 'year'"):
        st.usage_report(["year"], 0, 1)
    with pytest.raises(InvalidValue, match="end must be after its start"):
        st.usage_report(["user"], 5, 5)


def test_version_1_database_gains_daily_totals_and_groups(tmp_path: Path, tz, monkeypatch: pytest.MonkeyPatch) -> None:
    zone = tz("Europe/Berlin")
    path = tmp_path / "old.db"
    monkeypatch.setattr(schema_module, "_MIGRATIONS", schema_module._MIGRATIONS[:1])
    monkeypatch.setattr(schema_module, "SCHEMA_VERSION", 1)
    db = sqlite3.connect(path, isolation_level=None)
    schema_module.migrate(db)
    db.execute("INSERT INTO groups (id, name, scheduler_weight) VALUES (1, 'faculty', 3)")
    db.execute("INSERT INTO users (id, name, group_id, created) VALUES (7, 'carol', 1, 0)")
    db.execute(
        "INSERT INTO usage (at, user_id, request_id, model, backend_id, prompt_tokens, completion_tokens)"
        " VALUES (?, 7, 'r1', 'm', 1, 10, 5), (?, 7, 'r2', 'm', 1, 1, 1)",
        (at(zone, "2026-11-01T23:00"), at(zone, "2026-11-02T01:00")),
    )
    db.close()
    monkeypatch.undo()
    tz("Europe/Berlin")
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        rows = s.usage_report(["day", "group"], at(zone, "2026-11-01T00:00"), at(zone, "2026-11-03T00:00")).rows
        assert totals(rows, "day", "group") == {
            ("2026-11-01", "faculty"): (1, 10, 5),
            ("2026-11-02", "faculty"): (1, 1, 1),
        }
        db = sqlite3.connect(path)
        assert db.execute("SELECT count(*) FROM usage_daily").fetchone()[0] == 2
        db.close()


def test_local_periods(tz) -> None:
    zone = tz("Europe/Berlin")
    t = at(zone, "2026-03-29T12:00")  # the day clocks go forward: 23 hours long
    assert day_key(t) == "2026-03-29"
    assert next_day(t) - day_start(t) == 23 * 3600
    assert month_start(t) == at(zone, "2026-03-01T00:00")
    assert next_month(at(zone, "2026-12-15T00:00")) == at(zone, "2027-01-01T00:00")
    assert zone_label(at(zone, "2026-01-10T00:00")) == "CET, UTC+01:00"
    assert parse_when("7d", 1_000_000.0) == 1_000_000.0 - 7 * 86400
    assert parse_when("2026-11-01", 0) == at(zone, "2026-11-01T00:00")
    assert parse_when("2026-11-01T08:30", 0) == at(zone, "2026-11-01T08:30")
    with pytest.raises(ValueError, match="give an age such as 7d"):
        parse_when("last tuesday", 0)
    assert os.environ["TZ"] == "Europe/Berlin"


def test_period_keys_remembered_for_a_day(tz) -> None:
    """``Periods`` answers what ``day_key`` and ``month_key`` do, across midnights, a short day and a month's end."""
    zone = tz("Europe/Berlin")
    periods = Periods()
    times = [
        at(zone, "2026-03-29T12:00"),  # 23 hours long
        at(zone, "2026-03-29T00:00"),
        at(zone, "2026-03-30T00:00") - 0.001,
        at(zone, "2026-03-30T00:00"),
        at(zone, "2026-03-31T23:59:59.999"),
        at(zone, "2026-04-01T00:00"),
        at(zone, "2026-03-29T23:00"),  # back to an earlier day
        at(zone, "2026-10-25T02:30"),  # 25 hours long
    ]
    assert [periods(t) for t in times] == [(day_key(t), month_key(t)) for t in times]
    assert periods(at(zone, "2026-04-01T00:00")) == ("2026-04-01", "2026-04")
    assert periods(at(zone, "2026-03-31T23:59:59.999")) == ("2026-03-31", "2026-03")


@pytest.mark.parametrize("zone_name", ["Europe/Berlin", "America/Los_Angeles"])
def test_any_range_matches_the_rows_summed_by_hand(st: Store, tz, zone_name: str) -> None:
    """Whatever mix of monthly, daily and per-request rows a report reads, it equals a plain sum of the rows."""
    zone = tz(zone_name)
    rng = random.Random(7)
    start, end = at(zone, "2026-09-20T00:00"), at(zone, "2027-01-10T00:00")
    rows = []
    for _ in range(600):
        when = start + rng.random() * (end - start)
        user, model = rng.choice(["alice", "bob"]), rng.choice(["m1", "m2:latest"])
        p, c = rng.randrange(1, 50), rng.randrange(1, 50)
        record(st, user, when, model, rng.choice(["gpu1", "gpu2"]), p, c)
        rows.append((when, user, model, p, c))
    bounds = [start - 86400, at(zone, "2026-10-01T00:00"), at(zone, "2026-10-15T13:17"), at(zone, "2026-11-30T23:00")]
    bounds += [at(zone, "2026-12-01T00:00"), at(zone, "2027-01-03T06:00"), end + 86400]
    for since in bounds:
        for until in bounds:
            if until <= since:
                continue
            for by in (["user"], ["user", "model"], ["month"], ["day"]):
                report = st.usage_report(by, since, until)
                expected: dict = {}
                for when, user, model, p, c in rows:
                    if since <= when < until:
                        key = tuple(
                            {"user": user, "model": model, "month": day_key(when)[:7], "day": day_key(when)}[d]
                            for d in by
                        )
                        n, pp, cc = expected.get(key, (0, 0, 0))
                        expected[key] = (n + 1, pp + p, cc + c)
                assert totals(report.rows, *by) == expected, (since, until, by)
