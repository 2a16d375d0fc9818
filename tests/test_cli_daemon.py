"""Every `mr` command against a real running daemon (in a background thread) with a fake Ollama behind it."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from .fakes import FakeOllama
from .harness import ThreadDaemon, daemon_in_thread
from .test_cli_fake import mr


@dataclasses.dataclass
class Live:
    """A daemon on its own loop (Unix socket and TCP port), a fake Ollama behind it, and a config file for ``mr``."""

    daemon: ThreadDaemon
    fake: FakeOllama
    config_file: Path
    tmp: Path
    key: str = ""
    """A user's key, where a test makes one."""

    @property
    def port(self) -> int:
        return self.daemon.port

    @property
    def app(self) -> Any:
        return self.daemon.daemon.app

    def call(self, coro: Any, timeout: float = 10) -> Any:
        return self.daemon.call(coro, timeout)


@contextlib.contextmanager
def live_daemon(tmp: Path) -> Iterator[Live]:
    """A daemon for ``mr`` (``run``) in a thread, with a fake Ollama serving llama3 (loaded) and mistral."""
    with daemon_in_thread(tmp, unix=True) as d:
        fake = FakeOllama(models=["llama3", "mistral"], loaded=["llama3"])
        d.call(fake.start())
        try:
            server = d.daemon.config.server
            config_file = tmp / "config.toml"
            config_file.write_text(f'[server]\nsocket = "{server.socket_path}"\nstate_dir = "{server.state_path}"\n')
            yield Live(d, fake, config_file, tmp)
        finally:
            d.call(fake.stop())


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with live_daemon(tmp_path_factory.mktemp("live")) as d:
        yield d


def run(live: Live, *args: str) -> Any:
    return mr("--config", str(live.config_file), *args)


def test_every_command_against_a_running_daemon(live: Live) -> None:
    # Set up the pool.
    assert run(live, "group", "add", "phd", "--weight", "2").exit_code == 0
    assert run(live, "group", "set-weight", "phd", "2.5").exit_code == 0
    groups = run(live, "group", "list", "--json").json()
    assert {"name": "phd", "scheduler_weight": 2.5} in [{k: g[k] for k in ("name", "scheduler_weight")} for g in groups]
    r = run(
        live, "backend", "add", "ws1", live.fake.url, "--engine", "ollama", "--max-concurrent", "3", "--priority", "1"
    )
    assert r.exit_code == 0, r
    assert run(live, "user", "add", "alice", "--group", "faculty").exit_code == 0
    assert run(live, "user", "add", "bob", "--group", "phd", "--weight", "4").exit_code == 0
    key = run(live, "user", "key", "alice", "--json").json()
    assert key["user"] == "alice" and key["key"].startswith("mr-")
    users = {u["name"]: u for u in run(live, "user", "list", "--json").json()}
    assert users["bob"]["weight_override"] == 4 and users["bob"]["weight"] == 4 and users["alice"]["weight"] == 3
    assert run(live, "user", "set-weight", "bob", "--clear").exit_code == 0
    assert run(live, "user", "list", "--json").json()[1]["weight"] == 2.5

    # Traffic, so there is something to show.
    async def chat() -> str:
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                f"http://127.0.0.1:{live.port}/v1/chat/completions",
                json={"model": "llama3", "messages": [{"role": "user", "content": "a b c"}], "max_tokens": 3},
                headers={"Authorization": f"Bearer {key['key']}"},
            ) as resp,
        ):
            assert resp.status == 200
            return resp.headers["X-Request-Id"]

    rid = live.call(chat())

    status = run(live, "status", "--json").json()
    assert status["backends"] == 1 and status["queue_total"] == 0 and status["requests_total"] == 1
    backends = run(live, "backend", "list", "--json").json()
    assert {
        k: backends[0][k] for k in ("name", "engine", "status", "healthy", "max_concurrent", "models", "loaded_models")
    } == {
        "name": "ws1",
        "engine": "ollama",
        "status": "healthy",
        "healthy": True,
        "max_concurrent": 3,
        "models": ["llama3", "mistral"],
        "loaded_models": ["llama3"],
    }
    models = run(live, "models", "--json").json()
    assert [m["model"] for m in models] == ["llama3", "mistral"]
    queue = run(live, "queue", "--json").json()
    assert queue["queue"]["total"] == 0 and queue["fair_share"]["global_recent_tokens"] == 6
    share = run(live, "share", "--json").json()
    alice = next(u for u in share["users"] if u["name"] == "alice")
    # A newcomer stands one typical request (256 answer tokens at 2 units each) above the reference; it used
    # 6 tokens since (3 prompt tokens and 3 answer tokens: 9 service units).
    assert alice["recent_tokens"] == 6 and alice["actual_share"] == 1.0 and alice["deficit"] == 2 * 256 - 9
    assert alice["recent_units"] == 9 and alice["unit_share"] == 1.0 and share["global_recent_units"] == 9
    lines = run(live, "decisions", "--json", "--limit", "5").stdout.strip().splitlines()
    record = json.loads(lines[-1])
    assert record["request_id"] == rid and record["selected_backend"] == "ws1"
    why = run(live, "why", rid, "--json").json()
    assert why["request_id"] == rid
    assert run(live, "gpu", "--json").json() == []
    exported = run(live, "export").stdout
    assert "alice" in exported and key["key"] not in exported

    # People's output: each command prints a table with the names in it.
    for args, words in [
        (("status",), ["healthy"]),
        (("group", "list"), ["faculty", "phd"]),
        (("user", "list"), ["alice", "bob"]),
        (("backend", "list"), ["ws1", "healthy"]),
        (("models",), ["llama3", "ws1"]),
        (("queue",), []),
        (("share",), ["alice", "faculty"]),
        (("decisions", "--limit", "3"), [rid]),
        (("why", rid), ["ws1", "wait"]),
        (("top", "--once"), ["ws1", "alice"]),
    ]:
        r = run(live, *args)
        assert r.exit_code == 0, (args, r)
        for word in words:
            assert word in r.stdout, (args, word, r.stdout)

    # Changes, then clean-up.
    assert run(live, "backend", "drain", "ws1", "--force", "--json").json()["status"] in ("draining", "drained")
    assert run(live, "backend", "enable", "ws1", "--json").json()["status"] == "healthy"
    assert run(live, "user", "rm", "bob").exit_code == 0
    assert run(live, "group", "rm", "phd").exit_code == 0
    assert run(live, "backend", "rm", "ws1").exit_code == 0
    assert run(live, "backend", "list", "--json").json() == []


def state(live: Live) -> list[str]:
    """The exported pool, without its comment header (which carries the time)."""
    return [line for line in run(live, "export").stdout.splitlines() if not line.startswith("#")]


@pytest.mark.parametrize(
    "args, code, words",
    [
        (("group", "add", "x", "--weight", "0"), 2, "greater than 0"),
        (("group", "add", "x", "--weight", "nan"), 2, "weight"),
        (("group", "set-weight", "nobody", "2"), 1, "nobody"),
        (("user", "add", "zed", "--group", "nogroup"), 1, "nogroup"),
        (("backend", "add", "b", "ftp://x", "--engine", "ollama"), 2, "http"),
        (("backend", "add", "b", "http://x:1", "--engine", "tgi"), 2, "engine"),
        (("backend", "drain", "ghost"), 1, "ghost"),
        (("why", "mr-unknown"), 1, "mr-unknown"),
    ],
)
def test_bad_input_against_a_running_daemon(live: Live, args, code, words) -> None:
    before = state(live)
    r = run(live, *args)
    assert r.exit_code == code, r
    assert words in r.stderr and r.stderr.startswith("mr: ") and len(r.stderr.strip().splitlines()) == 1
    assert state(live) == before  # nothing changed


def test_a_proxys_settings_through_the_command_line(live: Live) -> None:
    assert run(live, "user", "add", "gateway", "--group", "staff", "--proxy-group", "student").exit_code == 0
    changed = run(live, "user", "set-proxy", "gateway", "--person-from", "user-field")
    assert changed.exit_code == 0 and "OpenAI's user field" in changed.stdout and "group student" in changed.stdout
    users = {u["name"]: u for u in run(live, "user", "list", "--json").json()}
    assert (users["gateway"]["proxy_for"], users["gateway"]["person_from"]) == ("student", "user-field")
    table = run(live, "user", "list").stdout
    assert "for student (user field)" in table
    assert run(live, "user", "set-proxy", "gateway", "on").exit_code == 0  # the group and source stay
    users = {u["name"]: u for u in run(live, "user", "list", "--json").json()}
    assert (users["gateway"]["proxy_for"], users["gateway"]["person_from"]) == ("student", "user-field")
    wrong = run(live, "user", "set-proxy", "gateway", "--person-from", "cookie")
    assert wrong.exit_code == 2 and "use header" in wrong.stderr
    assert run(live, "user", "set-proxy", "gateway", "off").exit_code == 0
    users = {u["name"]: u for u in run(live, "user", "list", "--json").json()}
    assert "proxy_for" not in users["gateway"] and "person_from" not in users["gateway"]


def test_user_add_person_of_makes_a_proxys_person_before_their_first_chat(live: Live) -> None:
    assert run(live, "user", "add", "webui", "--group", "student", "--proxy").exit_code == 0
    r = run(live, "user", "add", "Prof@Lab.edu", "--group", "faculty", "--person-of", "webui", "--json")
    assert r.exit_code == 0, r
    assert (r.json()["name"], r.json()["group"], r.json()["person_of"]) == ("prof@lab.edu", "faculty", "webui")
    r = run(live, "user", "add", "x@lab.edu", "--group", "faculty", "--person-of", "webui", "--weight", "2")
    assert r.exit_code == 2 and "--person-of takes only --group" in r.stderr
