"""Every ``mr`` command of DESIGN §5 against the fake daemon: tables, ``--json``, exit codes and messages."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from mindrouter.cli import _client
from mindrouter.cli.transfer import normalize
from mindrouter.config import Config, load_config

from . import test_cli_fake
from .test_cli_fake import FakeDaemon, decision, mr

fake = test_cli_fake.fake
fake_server = test_cli_fake.fake_server  # the fixtures, shared with test_cli_fake

SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")


def sent(fake: FakeDaemon) -> list[tuple[str, str, Any]]:
    """The requests that would change something."""
    return [r for r in fake.requests if r[0] != "GET"]


def assert_rows(rows: Any, keys: set[str]) -> None:
    assert isinstance(rows, list) and rows
    for row in rows:
        assert keys <= set(row), keys - set(row)
        assert all(SNAKE.match(k) for k in row), row


# -- status ------------------------------------------------------------------------------


def test_status_table_and_json(fake: FakeDaemon) -> None:
    run = mr("status")
    assert run.exit_code == 0, run
    assert "0.1.0" in run.stdout and "1h 02m" in run.stdout and "1 healthy of 3" in run.stdout
    data = mr("status", "--json").json()
    assert {"version", "backends", "queue_total"} <= set(data)
    assert data["queue_total"] == 3


def test_unreachable_daemon_is_exit_3_with_one_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sock = tmp_path / "gone.sock"
    (tmp_path / "c.toml").write_text(f'[server]\nsocket = "{sock}"\n')
    monkeypatch.setenv("MR_CONFIG", str(tmp_path / "c.toml"))
    for args in (
        ["status"],
        ["group", "list"],
        ["backend", "list", "--json"],
        ["top", "--once"],
        ["why", "x"],
        ["decisions", "-f"],
    ):
        run = mr(*args)
        assert run.exit_code == 3, (args, run)
        assert run.stderr == (
            f"mr: cannot reach the daemon at {sock} ([server] socket from {tmp_path / 'c.toml'}); is `mr serve` "
            "running? Point at another daemon with --config FILE or MR_CONFIG (its [server] socket)\n"
        )
        assert run.stdout == ""


def test_config_option_before_and_after_the_command(
    fake: FakeDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = os.environ["MR_CONFIG"]
    monkeypatch.delenv("MR_CONFIG")
    assert mr("--config", config, "status", "--json").json()["version"] == "0.1.0"
    assert mr("status", "--json", "--config", config).json()["version"] == "0.1.0"
    run = mr("--config", str(tmp_path / "missing.toml"), "status")
    assert run.exit_code == 1
    assert "does not exist; create it with `mr config init`" in run.stderr


def test_bad_config_file_is_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nport = 'x'\n")
    monkeypatch.setenv("MR_CONFIG", str(bad))
    run = mr("status")
    assert run.exit_code == 1 and run.stderr.startswith("mr: [server] port must be a whole number")


# -- groups ------------------------------------------------------------------------------


def test_group_list(fake: FakeDaemon) -> None:
    run = mr("group", "list")
    assert run.exit_code == 0
    assert re.search(r"faculty\s+3\s+1", run.stdout)
    rows = mr("group", "list", "--json").json()
    assert_rows(rows, {"name", "scheduler_weight"})
    assert {r["name"]: r["scheduler_weight"] for r in rows}["admin"] == 10


def test_group_add_set_weight_rm(fake: FakeDaemon) -> None:
    run = mr("group", "add", "phd", "--weight", "2.5")
    assert run.exit_code == 0, run
    assert run.stdout.strip() == "added group phd with weight 2.5"
    assert sent(fake)[-1] == ("POST", "/admin/groups", {"name": "phd", "weight": 2.5})
    assert mr("group", "set-weight", "phd", "4", "--json").json() == {
        "name": "phd",
        "scheduler_weight": 4.0,
        "users": 0,
    }
    assert "now has weight 4" in mr("group", "set-weight", "phd", "4").stdout
    assert mr("group", "rm", "phd", "--json").json() == {"removed": "phd"}
    assert "phd" not in fake.groups


@pytest.mark.parametrize("weight", ["0", "-1", "nan", "inf", "-inf", "lots", "1e999", ""])
def test_bad_weights_are_refused_before_sending(fake: FakeDaemon, weight: str) -> None:
    for args in (
        ["group", "add", "phd", "--weight", weight],
        ["group", "set-weight", "faculty", weight],
        ["user", "set-weight", "alice", weight],
        ["user", "add", "carol", "--group", "staff", "--weight", weight],
    ):
        run = mr(*args)
        assert run.exit_code == 2, (args, run)
        assert run.stderr.startswith(f"mr: weight {weight!r} ")
        assert run.stderr.count("\n") == 1
    assert sent(fake) == []


def test_unknown_group_is_exit_1_with_the_daemons_sentence(fake: FakeDaemon) -> None:
    run = mr("group", "set-weight", "nope", "2")
    assert run.exit_code == 1
    assert run.stderr == "mr: group 'nope' does not exist; `mr group list` shows the groups\n"
    run = mr("group", "rm", "faculty")
    assert run.exit_code == 1 and "still has users" in run.stderr


def test_bad_names_are_refused(fake: FakeDaemon) -> None:
    for args in (
        ["group", "add", "_x", "--weight", "1"],
        ["user", "add", "a b", "--group", "staff"],
        ["backend", "add", "x/y", "http://h:1", "--engine", "ollama"],
    ):
        run = mr(*args)
        assert run.exit_code == 2, (args, run)
        assert "is not valid; use 1 to 64 letters" in run.stderr
    assert sent(fake) == []


# -- users -------------------------------------------------------------------------------


def test_user_list(fake: FakeDaemon) -> None:
    run = mr("user", "list")
    assert run.exit_code == 0
    assert re.search(r"alice\s+faculty\s+3\s+-", run.stdout)
    assert re.search(r"bob\s+student\s+2\s+2", run.stdout)
    rows = mr("user", "list", "--json").json()
    assert_rows(rows, {"name", "group", "weight_override", "weight"})
    assert rows[0]["weight_override"] is None and rows[0]["weight"] == 3


def test_user_add_and_group_rules(fake: FakeDaemon) -> None:
    run = mr("user", "add", "carol", "--group", "staff")
    assert run.exit_code == 0, run
    assert "added user carol to group staff (weight 2 from group staff)" in run.stdout
    assert "mr user key carol" in run.stdout
    row = mr("user", "add", "dave", "-g", "staff", "-w", "5", "--json").json()
    assert row["weight_override"] == 5 and row["weight"] == 5
    assert sent(fake)[-1] == ("POST", "/admin/users", {"name": "dave", "group": "staff", "weight": 5.0})
    run = mr("user", "add", "erin")
    assert run.exit_code == 2 and "--group is required" in run.stderr
    run = mr("user", "add", "erin", "--group", "nope")
    assert run.exit_code == 1 and "group 'nope' does not exist" in run.stderr


def test_user_set_weight_clear_and_group(fake: FakeDaemon) -> None:
    assert mr("user", "set-weight", "alice", "5", "--json").json()["weight"] == 5
    run = mr("user", "set-weight", "alice", "--clear")
    assert run.exit_code == 0 and "weight 3 from group faculty" in run.stdout
    assert sent(fake)[-1] == ("PUT", "/admin/users/alice", {"weight": None})
    assert mr("user", "set-weight", "alice", "2", "--clear").exit_code == 2
    run = mr("user", "set-weight", "alice")
    assert run.exit_code == 2 and "--clear" in run.stderr
    assert mr("user", "set-group", "bob", "staff", "--json").json()["group"] == "staff"
    run = mr("user", "set-weight", "zed", "2")
    assert run.exit_code == 1 and run.stderr == "mr: user 'zed' does not exist; `mr user list` shows the users\n"


def test_user_key_is_printed_once_on_stdout(fake: FakeDaemon) -> None:
    run = mr("user", "key", "alice")
    assert run.exit_code == 0
    assert run.stdout == "mr-alice-secretkey2\n"  # nothing else on stdout: KEY=$(mr user key alice)
    assert "shown only once" in run.stderr
    assert mr("user", "key", "alice", "--json").json() == {"user": "alice", "key": "mr-alice-secretkey3"}
    assert mr("user", "key", "zed").exit_code == 1


def test_user_key_to_a_file_is_0600_and_never_overwrites_one(fake: FakeDaemon, tmp_path) -> None:
    target = tmp_path / "alice.key"
    run = mr("user", "key", "alice", "-o", str(target))
    assert run.exit_code == 0 and run.stdout == "", run.stderr
    assert oct(target.stat().st_mode & 0o777) == "0o600"  # whatever the umask: no other account reads it
    assert target.read_text() == "mr-alice-secretkey2\n" and str(target) in run.stderr
    made = len(sent(fake))
    run = mr("user", "key", "alice", "--output", str(target))
    assert run.exit_code == 1 and run.stderr.count("\n") == 1 and "already exists" in run.stderr, run.stderr
    assert len(sent(fake)) == made and target.read_text() == "mr-alice-secretkey2\n"  # no key made, none lost
    run = mr("user", "key", "alice", "-o", str(tmp_path / "no" / "such" / "dir" / "k"))
    assert run.exit_code == 1 and "cannot write" in run.stderr and len(sent(fake)) == made


def test_user_key_redirected_into_a_file_others_can_read_makes_it_private(fake: FakeDaemon, tmp_path) -> None:
    """``mr user key alice > alice.key``: the shell makes the file 0644 before mr runs; the key must not stay so."""
    target = tmp_path / "alice.key"
    with target.open("w") as out:
        target.chmod(0o644)
        cmd = [sys.executable, "-m", "mindrouter.cli", "user", "key", "alice"]
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert target.read_text() == "mr-alice-secretkey2\n"
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert "0600" in done.stderr, done.stderr


def test_user_rm(fake: FakeDaemon) -> None:
    assert "revoked" in mr("user", "rm", "bob").stdout
    assert mr("user", "rm", "bob").exit_code == 1


# -- backends ----------------------------------------------------------------------------


def test_backend_list(fake: FakeDaemon) -> None:
    run = mr("backend", "list")
    assert run.exit_code == 0
    assert re.search(r"ws1\s+ollama\s+healthy\s+2/4\s+llama3.2", run.stdout)
    assert "old is unhealthy: connection refused" in run.stdout and "draining" in run.stdout
    rows = mr("backend", "list", "--json").json()
    assert_rows(
        rows,
        {"id", "name", "url", "engine", "status", "healthy", "in_flight", "max_concurrent", "models", "loaded_models"},
    )
    assert {r["status"] for r in rows} <= {"healthy", "unhealthy", "draining", "drained"}


def test_backend_add_sends_checked_values(fake: FakeDaemon) -> None:
    run = mr(
        "backend",
        "add",
        "ws3",
        "http://ws3.lab:11434/",
        "--engine",
        "Ollama",
        "--max-concurrent",
        "2",
        "--gpus",
        "0, 1",
        "--node",
        "http://ws3.lab:8485",
        "--priority",
        "-5",
    )
    assert run.exit_code == 0, run
    assert "added backend ws3 (ollama, http://ws3.lab:11434): healthy, 2 models" in run.stdout
    assert sent(fake)[-1] == (
        "POST",
        "/admin/backends",
        {
            "name": "ws3",
            "url": "http://ws3.lab:11434",
            "engine": "ollama",
            "max_concurrent": 2,
            "gpus": [0, 1],
            "node": "http://ws3.lab:8485",
            "priority": -5.0,
        },
    )
    row = mr("backend", "add", "ws4", "https://ws4", "-e", "vllm", "--json").json()
    assert row["name"] == "ws4" and row["engine"] == "vllm"
    assert sent(fake)[-1][2] == {"name": "ws4", "url": "https://ws4", "engine": "vllm"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["ftp://ws3:21", "--engine", "ollama"], "URL 'ftp://ws3:21' is not an http(s) URL with a host"),
        (["ws3:11434", "--engine", "ollama"], "URL 'ws3:11434' is not an http(s) URL with a host"),
        (["http://", "--engine", "ollama"], "URL 'http://' is not an http(s) URL with a host"),
        (
            ["http://ws3:99999", "--engine", "ollama"],
            "URL 'http://ws3:99999' has a port that is not a number from 1 to 65535",
        ),
        (["http://ws3:11434"], "--engine is required; say which server runs there: ollama, vllm, llamacpp, openai"),
        (
            ["http://ws3:11434", "--engine", "tgi"],
            "--engine 'tgi' is not known; use one of ollama, vllm, llamacpp, openai",
        ),
        (["http://ws3:11434", "-e", "ollama", "--max-concurrent", "0"], "--max-concurrent '0' must be at least 1"),
        (
            ["http://ws3:11434", "-e", "ollama", "--max-concurrent", "many"],
            "--max-concurrent 'many' is not a whole number",
        ),
        (["http://ws3:11434", "-e", "ollama", "--gpus", "0,a"], "--gpus '0,a' is not a comma list of GPU indexes"),
        (["http://ws3:11434", "-e", "ollama", "--gpus", "-1"], "--gpus '-1' is not a comma list of GPU indexes"),
        (["http://ws3:11434", "-e", "ollama", "--gpus", "1,1"], "--gpus '1,1' names GPU 1 twice"),
        (["http://ws3:11434", "-e", "ollama", "--node", "ws3"], "--node 'ws3' is not an http(s) URL with a host"),
        (["http://ws3:11434", "-e", "ollama", "--priority", "inf"], "--priority 'inf' must be a finite number"),
        (["http://ws3:11434", "-e", "ollama", "--priority", "high"], "--priority 'high' is not a number"),
    ],
)
def test_backend_add_refuses_bad_input_before_sending(fake: FakeDaemon, extra: list[str], message: str) -> None:
    run = mr("backend", "add", "ws3", *extra)
    assert run.exit_code == 2, run
    assert run.stderr.startswith("mr: " + message), run.stderr
    assert run.stderr.count("\n") == 1
    assert sent(fake) == []


def test_backend_drain_enable_rm(fake: FakeDaemon) -> None:
    run = mr("backend", "drain", "ws1")
    assert run.exit_code == 0 and "draining ws1: no new requests; 2 still in flight" in run.stdout
    assert mr("backend", "enable", "ws1", "--json").json()["status"] == "healthy"
    assert "enabled ws2" in mr("backend", "enable", "ws2").stdout
    assert mr("backend", "rm", "old", "--json").json() == {"removed": "old"}
    for verb in ("drain", "enable", "rm"):
        run = mr("backend", verb, "nope")
        assert run.exit_code == 1
        assert run.stderr == "mr: backend 'nope' does not exist; `mr backend list` shows the backends\n"


def test_names_are_quoted_in_paths(fake: FakeDaemon) -> None:
    mr("backend", "drain", "a b/c")
    assert fake.requests[-1][1] == "/admin/backends/a%20b%2Fc/drain"


# -- models, queue, share ------------------------------------------------------------------


def test_models(fake: FakeDaemon) -> None:
    run = mr("models")
    assert run.exit_code == 0
    assert re.search(r"llama3.2\s+ws1, ws2\s+ws1", run.stdout)
    assert run.stdout.index("llama3.2") < run.stdout.index("mistral")
    rows = mr("models", "--json").json()
    assert_rows(rows, {"model", "backends", "loaded_on"})


def test_queue(fake: FakeDaemon) -> None:
    run = mr("queue")
    assert run.exit_code == 0
    assert re.search(r"alice\s+llama3.2\s+2\s+4.8s", run.stdout) and re.search(r"bob\s+mistral\s+1\s+500ms", run.stdout)
    assert "average wait" in run.stdout and "fair share" in run.stdout
    data = mr("queue", "--json").json()
    assert data["queue"]["total"] == 3 and data["fair_share"]["user_stats"][0]["deficit"] == -1000


def test_share_like_sshare(fake: FakeDaemon) -> None:
    run = mr("share")
    assert run.exit_code == 0
    lines = run.stdout.splitlines()
    faculty = next(i for i, line in enumerate(lines) if line.lstrip().startswith("faculty"))
    assert lines[faculty + 1].lstrip().startswith("alice")  # users under their group
    assert re.search(r"alice\s+3\s+60.0%\s+30.0k\s+71.4%\s+52.0k\s+74.3%\s+-1,000\s+0.57\s+2\s+1", run.stdout)
    assert "(42.0k tokens, 70.0k service units)" in run.stdout
    assert "burst" not in run.stdout  # the same for everyone: it never reorders anyone
    for header in ("weight", "target", "recent tokens", "actual", "recent units", "unit share", "deficit"):
        assert header in run.stdout
    data = mr("share", "--json").json()
    assert {"groups", "users", "window_seconds"} <= set(data)


# -- decisions, why --------------------------------------------------------------------------


def test_decisions_table_and_json_lines(fake: FakeDaemon) -> None:
    run = mr("decisions")
    assert run.exit_code == 0
    assert re.search(r"req-1\s+alice \(faculty\)\s+llama3.2\s+ws1\s+1.2s.*\sok\s", run.stdout)
    run = mr("decisions", "--json", "--limit", "5", "--user", "alice")
    lines = run.stdout.splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["request_id"] == "req-1"
    assert fake.requests[-1][1] == "/admin/decisions?limit=5&user=alice"
    assert mr("decisions", "--limit", "0").exit_code == 2
    assert mr("decisions", "-n", "x").exit_code == 2


def test_decisions_follow_streams_until_the_daemon_closes(fake: FakeDaemon) -> None:
    fake.stream_records = [
        decision("req-2", user="bob", backend=2),
        decision("new-1"),
        decision("new-2", user="bob", backend=2),
    ]
    run = mr("decisions", "--follow", "--json")
    ids = [json.loads(line)["request_id"] for line in run.stdout.splitlines()]
    assert ids == ["req-1", "req-2", "new-1", "new-2"]  # the recent ones, then the stream, without repeats
    assert run.exit_code == 3 and "closed the decision stream" in run.stderr
    run = mr("decisions", "-f")
    assert "new-1" in run.stdout and "→ ws1" in run.stdout


def test_decisions_follow_ctrl_c_exits_0_quietly(fake: FakeDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    def stream(self: Any, path: str, **query: Any) -> Any:
        yield decision("live-1")
        raise KeyboardInterrupt

    monkeypatch.setattr(_client.AdminClient, "stream", stream)
    run = mr("decisions", "--follow")
    assert run.exit_code == 0 and "live-1" in run.stdout and run.stderr == ""


def test_why_explains_priority_and_scores(fake: FakeDaemon) -> None:
    run = mr("why", "req-1")
    assert run.exit_code == 0, run
    out = run.stdout
    assert "request req-1: alice (faculty) asked for llama3.2" in out and "went to ws1" in out
    assert "Ended: ok: it was answered in full (HTTP 200)." in out
    for term in (
        "deficit",
        "in-flight charge",
        "credit",
        "weight",
        "factor",
        "usage fraction",
        "wait bonus",
        "priority",
    ):
        assert term in out
    assert re.search(r"ws1 ✓\s+-4.5\s+0\s+0.5\s+4\s+4.5\s+0\s+n/a\s+n/a\s+64\s+1\s+0\s+0", out)  # no delay, scarcity
    assert re.search(r"ws2\s+-20.2\s+12.5\s+0.8\s+7\s+20.2\s+0\s+n/a\s+n/a\s+36.5\s+0", out)
    assert "ws2 lost: it would have to load the model or wait for a slot (+12.5 s)" in out
    assert "ws2 would evict coder" in out
    assert re.search(r"recent tokens\s+30,?000|recent tokens\s+30(\.0)?k", out), out
    assert re.search(r"recent units\s+52,?000|recent units\s+52(\.0)?k", out), out
    assert re.search(r"old\s+model not available; unhealthy", out)  # id 3 shown by name
    data = mr("why", "req-1", "--json").json()
    assert data["priority"]["priority"] == -300.1 and data["backend_names"]["3"] == "old"
    run = mr("why", "nope")
    assert run.exit_code == 1
    assert run.stderr == "mr: no decision record for request 'nope'; `mr decisions` lists recent ones\n"


def test_why_says_how_a_failed_request_ended(fake: FakeDaemon) -> None:
    fake.decisions[0].update(outcome="backend_failed", status=503, reason="the backend did not answer in time")
    run = mr("why", "req-1")
    assert "Ended: backend_failed: the backend failed (HTTP 503); the backend did not answer in time." in run.stdout
    assert re.search(r"req-1.*\sbackend_failed", mr("decisions").stdout)


def test_why_says_a_request_the_shutdown_ended_was_shut_down_not_refused(fake: FakeDaemon) -> None:
    fake.decisions[0].update(
        outcome="shutdown",
        status=503,
        reason="the router is shutting down",
        selected_backend=None,
        selected_backend_id=None,
    )
    run = mr("why", "req-1")
    assert "Ended: shutdown: the router shut down before it was answered (HTTP 503)" in run.stdout, run.stdout
    assert re.search(r"req-1.*\sshut down", mr("decisions").stdout)  # where its backend would be


def test_why_survives_a_removed_backend(fake: FakeDaemon) -> None:
    del fake.backends["old"]
    run = mr("why", "req-1")
    assert run.exit_code == 0 and "#3" in run.stdout


# -- config --------------------------------------------------------------------------------


def test_config_init_show_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "etc" / "config.toml"
    monkeypatch.setenv("MR_CONFIG", str(target))
    assert mr("config", "path").stdout.strip() == str(target)
    assert mr("config", "path", "--json").json() == {"path": str(target), "exists": False}
    run = mr("config", "init")
    assert run.exit_code == 0 and target.exists()
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    text = target.read_text()
    assert "# Seconds of recent usage that decide who is a heavy user." in text
    assert "# fairness_window = 300.0" in text and "[scheduler.scores]" in text
    assert tomllib.loads(text) == {"server": {}, "scheduler": {"scores": {}}, "backends": {}, "store": {}}
    run = mr("config", "init")
    assert run.exit_code == 1 and "already exists" in run.stderr and "--force" in run.stderr
    assert mr("config", "init", "--force").exit_code == 0
    # every commented default, uncommented, is a valid setting equal to the default
    # (but not the examples of settings that are unset by default: return_credit, max_slot_share ...)
    lines = text.splitlines()
    active = "\n".join(
        line[2:] if re.match(r"# [a-z_]+ = ", line) and "Not set by default" not in lines[i - 1] else line
        for i, line in enumerate(lines)
    )
    target.write_text(active)
    loaded = load_config(target, environ={})
    assert loaded.server == Config().server and loaded.backends == Config().backends
    assert loaded.scheduler == Config().scheduler


def test_config_show(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "config.toml"
    target.write_text('[server]\nport = 9000\nadmin_key = "s3cret"\n[scheduler.scores]\nlatency = 10\n')
    monkeypatch.setenv("MR_CONFIG", str(target))
    data = mr("config", "show", "--json").json()
    assert data["server"]["port"] == 9000 and data["server"]["admin_key"] == "********"
    assert data["scheduler"]["scores"]["latency"] == 10 and data["path"] == str(target)
    run = mr("config", "show")
    assert run.exit_code == 0 and "s3cret" not in run.stdout
    assert "port = 9000  # default: 8484" in run.stdout.splitlines()
    assert "# admin_key is set (not shown)" in run.stdout.splitlines()


def test_config_show_prints_toml_that_loads_back_to_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It printed Python reprs (True, 'text') before: not TOML (issue 21)."""
    target = tmp_path / "config.toml"
    target.write_text(
        '[server]\nport = 9000\ndiscover = false\nlog_level = "debug"\n'
        "[scheduler]\nreturn_credit = 100.0\n[scheduler.scores]\nlatency = 10\n"
    )
    monkeypatch.setenv("MR_CONFIG", str(target))
    run = mr("config", "show")
    assert run.exit_code == 0, run
    parsed = tomllib.loads(run.stdout)
    assert parsed["server"]["discover"] is False and parsed["server"]["log_level"] == "debug"
    assert parsed["scheduler"]["return_credit"] == 100.0 and "return_debt" not in parsed["scheduler"]
    assert parsed["scheduler"]["scores"]["latency"] == 10.0
    shown = tmp_path / "shown.toml"
    shown.write_text(run.stdout)
    loaded, original = load_config(shown, environ={}), load_config(target, environ={})
    assert (loaded.server, loaded.scheduler, loaded.backends) == (
        original.server,
        original.scheduler,
        original.backends,
    )


# -- import / export -------------------------------------------------------------------------


def test_export_then_import_round_trips(fake: FakeDaemon, tmp_path: Path) -> None:
    out = tmp_path / "lab.toml"
    run = mr("export", "-o", str(out))
    assert run.exit_code == 0 and out.exists()
    data = tomllib.loads(out.read_text())
    assert {g["name"] for g in data["groups"]} == {"student", "staff", "faculty", "admin"}
    assert "key" not in out.read_text().lower().replace("keys", "")  # users never carry keys
    run = mr("import", str(out))
    assert run.exit_code == 0, run
    assert "imported 4 groups, 2 users and 3 backends" in run.stdout
    method, path, body = sent(fake)[-1]
    assert (method, path) == ("POST", "/admin/import")
    assert body["version"] == 1 and body["users"][1] == {"name": "bob", "group": "student", "weight_override": 2.0}
    assert all("id" not in b for b in body["backends"])
    assert mr("export", "--json").json()["version"] == 1
    assert tomllib.loads(mr("export").stdout)["groups"][0] == {"name": "student", "scheduler_weight": 1.0}


def test_import_checks_every_entry_first(fake: FakeDaemon, tmp_path: Path) -> None:
    cases = {
        "[[groups]]\nname = 'a'\nscheduler_weight = 0\n": "group 'a': weight 0 must be a finite number greater than 0",
        "[[groups]]\nname = 'a'\n": "group 'a' needs a weight",
        "[[users]]\nname = 'u'\n": "user 'u' needs a group",
        "[[users]]\nname = 'u'\ngroup = 'x'\nweigth = 2\n": "users[0] has an unknown key 'weigth'",
        "[[backends]]\nname = 'b'\nurl = 'ftp://x'\nengine = 'ollama'\n": (
            "backend 'b' url 'ftp://x' is not an http(s) URL with a host"
        ),
        "[[backends]]\nname = 'b'\nurl = 'http://x'\nengine = 'ollama'\nstate = 'off'\n": "backend 'b' has state 'off'",
        "[[groups]]\nname = 'a'\nweight = 1\n[[groups]]\nname = 'a'\nweight = 2\n": "group 'a' appears twice",
        "[pool]\n": "unknown section 'pool'",
        "groups = [ = ": "is not valid TOML",
    }
    for text, message in cases.items():
        file = tmp_path / "in.toml"
        file.write_text(text)
        run = mr("import", str(file))
        assert run.exit_code == 2, (text, run)
        assert message in run.stderr, (text, run.stderr)
    assert mr("import", str(tmp_path / "none.toml")).exit_code == 2
    assert sent(fake) == []


def test_import_dry_run_and_json_files(fake: FakeDaemon, tmp_path: Path) -> None:
    file = tmp_path / "in.json"
    file.write_text(
        json.dumps(
            {
                "groups": [{"name": "phd", "weight": 2, "users": 0}],
                "users": [{"name": "zoe", "group": "phd", "weight": 2, "weight_override": None, "keys": 3}],
            }
        )
    )
    run = mr("import", str(file), "--dry-run")
    assert run.exit_code == 0 and "would import 1 groups, 1 users and 0 backends" in run.stdout
    assert [path for _, path, _ in sent(fake)] == ["/admin/import/dry-run"]
    assert mr("import", str(file), "--json").json() == {"groups": 1, "users": 1, "backends": 0}
    assert sent(fake)[-1][2] == {
        "version": 1,
        "groups": [{"name": "phd", "scheduler_weight": 2.0}],
        "users": [{"name": "zoe", "group": "phd"}],
        "backends": [],
    }


def test_normalize_accepts_listing_rows() -> None:
    body = normalize(
        {
            "backends": [
                {
                    "id": 1,
                    "name": "ws1",
                    "url": "http://ws1:11434",
                    "engine": "ollama",
                    "status": "healthy",
                    "gpus": [0],
                    "node": None,
                    "max_concurrent": 4,
                    "priority": 0,
                    "models": ["x"],
                }
            ]
        }
    )
    assert body["backends"] == [
        {
            "name": "ws1",
            "url": "http://ws1:11434",
            "engine": "ollama",
            "gpus": [0],
            "max_concurrent": 4,
            "priority": 0.0,
        }
    ]


# -- colour and the real entry point ------------------------------------------------------------


def test_no_color_and_force_color(fake: FakeDaemon) -> None:
    coloured = mr("backend", "list", env={"FORCE_COLOR": "1"})
    assert "\x1b[32m" in coloured.stdout  # healthy in green when forced to a terminal
    plain = mr("backend", "list", env={"FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert "\x1b[32m" not in plain.stdout
    assert "\x1b[" not in mr("backend", "list").stdout  # not a terminal: no escapes at all


def _main(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from mindrouter.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=30,
    )


def test_main_prints_one_line_and_exit_codes(fake: FakeDaemon, tmp_path: Path) -> None:
    env = {"MR_CONFIG": os.environ["MR_CONFIG"]}
    ok = _main("group", "list", "--json", env=env)
    assert ok.returncode == 0 and json.loads(ok.stdout)
    usage = _main("group", "add", "x", "--weight", "0", env=env)
    assert (usage.returncode, usage.stderr) == (
        2,
        "mr: weight '0' must be a finite number greater than 0, such as 1 or 2.5\n",
    )
    missing = _main("user", "rm", "zed", env=env)
    assert (missing.returncode, missing.stderr) == (
        1,
        "mr: user 'zed' does not exist; `mr user list` shows the users\n",
    )
    (tmp_path / "gone.toml").write_text(f'[server]\nsocket = "{tmp_path}/gone.sock"\n')
    away = _main("status", env={"MR_CONFIG": str(tmp_path / "gone.toml")})
    assert (away.returncode, away.stderr) == (
        3,
        f"mr: cannot reach the daemon at {tmp_path}/gone.sock ([server] socket from {tmp_path}/gone.toml); "
        "is `mr serve` running? Point at another daemon with --config FILE or MR_CONFIG (its [server] socket)\n",
    )


def test_follow_ends_on_sigint_with_exit_0(fake: FakeDaemon) -> None:
    fake.stream_records = [decision("live-9")]
    fake.stream_hold = 30
    # Ctrl-C as from a terminal: a run started in the background (`pytest &`, some CI runners) passes
    # on an ignored SIGINT, and Python then installs no handler of its own.
    start = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); from mindrouter.cli import main"
    proc = subprocess.Popen(
        [sys.executable, "-c", f"{start}; main()", "decisions", "--follow", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        seen = [proc.stdout.readline() for _ in range(3)]  # type: ignore[union-attr]
        assert json.loads(seen[-1])["request_id"] == "live-9"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
        assert proc.stderr.read() == ""  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_user_proxy_on_and_off(fake: FakeDaemon) -> None:
    row = mr("user", "add", "webui", "--group", "student", "--proxy-group", "staff", "--json").json()
    assert row["proxy_for"] == "staff"
    assert sent(fake)[-1][2] == {"name": "webui", "group": "student", "proxy": True, "proxy_group": "staff"}
    run = mr("user", "set-proxy", "webui", "off")
    assert run.exit_code == 0 and "webui is no longer a proxy" in run.stdout
    run = mr("user", "set-proxy", "webui", "on")
    assert run.exit_code == 0 and "the people its forwarding headers name go in group student" in run.stdout
    assert mr("user", "set-proxy", "webui", "maybe").exit_code == 2
