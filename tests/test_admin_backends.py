"""`mr backend set` changes a backend in place; draining the last backend of a model asks for --force (issue 32).

Before, changing ``--parallel`` meant ``rm`` + ``add``, which split the backend's usage under a new id;
and draining the only backend of a model failed every request for it at once with a generic 503.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from mindrouter.daemon.edge.services import SERVICES

from .fakes import FakeOllama
from .test_cli_daemon import Live, live_daemon, run


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A daemon with user ann (key in ``lab.key``) and backend ws1 (llama3, mistral) on its fake Ollama."""
    with live_daemon(tmp_path_factory.mktemp("lab")) as daemon:
        assert run(daemon, "user", "add", "ann", "--group", "student").exit_code == 0
        daemon.key = run(daemon, "user", "key", "ann", "--json").json()["key"]
        added = run(daemon, "backend", "add", "ws1", daemon.fake.url, "--engine", "ollama", "--parallel", "2")
        assert added.exit_code == 0, added
        yield daemon


def chat(lab: Live, model: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    async def ask() -> tuple[int, dict[str, Any], dict[str, str]]:
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                f"http://127.0.0.1:{lab.port}/v1/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": "a b c"}], "max_tokens": 2},
                headers={"Authorization": f"Bearer {lab.key}"},
            ) as resp,
        ):
            return resp.status, await resp.json(), dict(resp.headers)

    result: tuple[int, dict[str, Any], dict[str, str]] = lab.call(ask())
    return result


def core(lab: Live, name: str) -> Any:
    """The scheduler's snapshot of backend ``name``, read on the daemon's loop."""

    async def read() -> Any:
        scheduler = lab.app[SERVICES].scheduler
        return next(b for b in (scheduler.backend(i) for i in range(1, 50)) if b is not None and b.name == name)

    return lab.call(read())


def test_backend_set_changes_it_in_place_and_keeps_its_usage_under_its_name(lab: Live) -> None:
    assert chat(lab, "llama3")[0] == 200
    before = {b["name"]: b for b in run(lab, "backend", "list", "--json").json()}["ws1"]
    assert (before["parallel"], before["max_concurrent"]) == (2, 6)
    changed = run(
        lab, "backend", "set", "ws1", "--parallel", "4", "--max-loaded", "2", "--max-concurrent", "8", "--priority", "3"
    )
    assert changed.exit_code == 0, changed
    assert " ".join(changed.stdout.split()) == (
        "changed ws1: parallel 2 → 4, max_loaded not set → 2, max_concurrent 6 → 8, priority 0 → 3"
    )
    row = {b["name"]: b for b in run(lab, "backend", "list", "--json").json()}["ws1"]
    assert row["id"] == before["id"] and row["status"] == "healthy"
    assert (row["parallel"], row["max_loaded"], row["max_concurrent"], row["priority"]) == (4, 2, 8, 3)
    snapshot = core(lab, "ws1")
    assert (snapshot.parallel, snapshot.max_loaded, snapshot.max_concurrent, snapshot.priority) == (4, 2, 8, 3)
    assert chat(lab, "llama3")[0] == 200
    usage = run(lab, "usage", "--by", "backend", "--json").json()
    assert [(r["backend"], r["requests"]) for r in usage] == [("ws1", 2)]
    cleared = run(lab, "backend", "set", "ws1", "--max-loaded", "none", "--gpus", "0,1", "--json").json()
    assert (cleared["max_loaded"], cleared["gpus"], cleared["parallel"]) == (None, [0, 1], 4)
    assert run(lab, "backend", "set", "ws1", "--gpus", "none", "--json").json()["gpus"] == []


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (("ws1",), 2, "give at least one setting to change, such as --max-concurrent 8"),
        (("ws1", "--parallel", "0"), 2, "--parallel '0' must be at least 1"),
        (("ws1", "--max-concurrent", "none"), 2, "--max-concurrent 'none' is not a whole number"),
        (("ws1", "--node", "ftp://x"), 2, "--node"),
        (("ghost", "--priority", "1"), 1, "backend 'ghost' does not exist"),
    ],
)
def test_backend_set_refusals_are_one_sentence(lab: Live, args: tuple[str, ...], code: int, says: str) -> None:
    result = run(lab, "backend", "set", *args)
    assert result.exit_code == code and says in result.stderr, result
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_admin_api_refuses_what_set_cannot_change(lab: Live) -> None:
    async def put(body: Any) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(lab.daemon.daemon.config.server.socket_path))
            ) as s,
            s.put("http://mr/admin/backends/ws1", json=body) as resp,
        ):
            return resp.status, await resp.json()

    status, body = lab.call(put({"url": "http://elsewhere:11434"}))
    assert status == 400 and "cannot change the url" in body["error"]["message"], body
    status, body = lab.call(put({"max_concurrent": 0}))
    assert status == 400 and "max_concurrent 0" in body["error"]["message"], body


def test_draining_the_last_backend_of_a_model_asks_for_force(lab: Live) -> None:
    async def second() -> FakeOllama:
        fake = FakeOllama(models=["llama3"])
        await fake.start()
        return fake

    other: FakeOllama = lab.call(second())
    try:
        assert run(lab, "backend", "add", "ws2", other.url, "--engine", "ollama").exit_code == 0
        refused = run(lab, "backend", "drain", "ws1")
        assert refused.exit_code == 1 and refused.stderr == (
            "mr: draining ws1 would leave mistral without a backend, so every request for it would fail; "
            "add a backend that serves it first, or drain anyway with `mr backend drain ws1 --force`\n"
        ), refused
        assert {b["name"]: b["status"] for b in run(lab, "backend", "list", "--json").json()}["ws1"] == "healthy"
        forced = run(lab, "backend", "drain", "ws1", "--force")
        assert forced.exit_code == 0, forced
        assert "mistral now has no backend" in " ".join(forced.stdout.split()), forced
        status, body, headers = chat(lab, "mistral")
        assert status == 503 and body["error"]["message"] == (
            "every backend serving 'mistral' (ws1) was drained by an admin, so no request for it can run; "
            "an admin brings one back with `mr backend enable ws1`"
        ), body
        assert headers.get("Retry-After")
        assert chat(lab, "llama3")[0] == 200  # ws2 serves it
        assert run(lab, "backend", "drain", "ws2").exit_code == 1  # now the last of llama3
    finally:
        assert run(lab, "backend", "enable", "ws1").exit_code == 0
        run(lab, "backend", "rm", "ws2")
        lab.call(other.stop())


def test_a_key_gets_a_label_that_mr_user_keys_lists(lab: Live) -> None:
    assert run(lab, "user", "key", "ann", "--label", "open-webui", "--json").exit_code == 0
    keys = run(lab, "user", "keys", "ann", "--json").json()
    assert [k["label"] for k in keys][-1] == "open-webui"
    assert "open-webui" in run(lab, "user", "keys", "ann").stdout
    bad = run(lab, "user", "key", "ann", "--label", "x" * 65)
    assert bad.exit_code != 0 and "up to 64 printable characters" in bad.stdout + bad.stderr
