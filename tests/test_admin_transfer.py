"""`mr export` → `mr import` between two real daemons reproduces every setting; `--dry-run` lists each change.

Issue 32 item 2: an Ollama backend added as the README shows (``--parallel 4 --max-loaded 3``) exported
``parallel`` and ``max_loaded``, which import refused (exit 2), as it refused a proxy's ``proxy_for``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Daemon, until
from .fakes import FakeOllama
from .test_cli_daemon import Live, live_daemon, run


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Live, Live]]:
    """Two daemons: one set up by hand with every kind of setting, one fresh to import into."""
    with live_daemon(tmp_path_factory.mktemp("one")) as one, live_daemon(tmp_path_factory.mktemp("two")) as two:
        yield from _set_up(one, two)


def _set_up(one: Live, two: Live) -> Iterator[tuple[Live, Live]]:
    ok = lambda *args: run(one, *args)  # noqa: E731
    for args in (
        ("group", "add", "phd", "--weight", "2.5"),
        ("group", "set-weight", "faculty", "4"),
        ("group", "set-quota", "phd", "--tokens-per-day", "2M", "--tokens-per-month", "30M"),
        ("group", "set-quota", "student", "--requests-per-minute", "60"),
        ("user", "add", "ann", "--group", "phd"),
        ("user", "add", "ben", "--group", "student", "--weight", "1.5"),
        ("user", "set-quota", "ben", "--tokens-per-day", "500k", "--requests-per-minute", "20"),
        ("user", "add", "webui", "--group", "staff", "--proxy", "--proxy-group", "student"),
        ("user", "set-proxy", "webui", "--person-from", "user-field"),
        ("user", "add", "prof@lab.edu", "--group", "faculty", "--person-of", "webui"),
        (
            "backend",
            "add",
            "ws1",
            one.fake.url,
            "--engine",
            "ollama",
            "--parallel",
            "4",
            "--max-loaded",
            "3",
            "--gpus",
            "0,1",
            "--priority",
            "5",
        ),
        ("backend", "add", "ws2", "http://127.0.0.1:9", "--engine", "vllm", "--max-concurrent", "6"),
        ("backend", "add", "ws3", "http://127.0.0.1:7", "--engine", "llamacpp", "--priority", "-10"),
        ("backend", "drain", "ws3"),
    ):
        result = ok(*args)
        assert result.exit_code == 0, (args, result)
    yield one, two


def pool(daemon: Live) -> dict[str, Any]:
    """What `mr export` says of a daemon's pool, without the backends' ids (the store's, not a setting)."""
    data = tomllib.loads(run(daemon, "export").stdout)
    for kind in ("groups", "users", "backends"):
        data.setdefault(kind, [])
    for row in data["backends"]:
        row.pop("id")
    return data


def test_export_then_import_into_a_fresh_daemon_reproduces_every_setting(
    pair: tuple[Live, Live], tmp_path: Path
) -> None:
    one, two = pair
    file = tmp_path / "lab.toml"
    assert run(one, "export", "-o", str(file)).exit_code == 0
    exported = tomllib.loads(file.read_text())
    ws1 = next(b for b in exported["backends"] if b["name"] == "ws1")
    assert (ws1["parallel"], ws1["max_loaded"], ws1["max_concurrent"], ws1["gpus"]) == (4, 3, 12, [0, 1])
    assert any(u.get("person_from") == "user-field" for u in exported["users"])
    dry = run(two, "import", "--dry-run", str(file))
    assert dry.exit_code == 0, dry
    assert pool(two)["backends"] == []  # a dry run changes nothing
    result = run(two, "import", str(file))
    assert result.exit_code == 0, result
    assert "imported 5 groups, 4 users and 3 backends" in result.stdout
    assert pool(two) == pool(one)
    users = {u["name"]: u for u in run(two, "user", "list", "--json").json()}
    assert users["prof@lab.edu"]["person_of"] == "webui" and users["webui"]["proxy_for"] == "student"
    backends = {b["name"]: b for b in run(two, "backend", "list", "--json").json()}
    assert backends["ws3"]["status"] == "drained" and backends["ws1"]["parallel"] == 4
    # The same file again changes nothing, and says so.
    again = run(two, "import", "--dry-run", str(file))
    assert again.exit_code == 0 and "nothing would change" in again.stdout, again


def test_dry_run_lists_each_change_the_import_would_make(pair: tuple[Live, Live], tmp_path: Path) -> None:
    one, _ = pair
    data = tomllib.loads(run(one, "export").stdout)
    for row in data["users"]:
        if row["name"] == "ben":
            del row["tokens_per_day"]  # a quota removed
    for row in data["backends"]:
        if row["name"] == "ws2":
            row["max_concurrent"] = 8
    data["groups"].append({"name": "visitors", "scheduler_weight": 0.5})
    file = tmp_path / "edited.toml"
    import tomli_w

    file.write_text(tomli_w.dumps(data))
    before = pool(one)
    dry = run(one, "import", "--dry-run", str(file))
    assert dry.exit_code == 0, dry
    lines = dry.stdout.splitlines()
    assert lines[0] == f"would import 6 groups, 4 users and 3 backends from {file}; 3 changes:", dry.stdout
    assert sorted(lines[1:]) == [
        "  backend ws2: max_concurrent 6 → 8",
        "  group visitors: new (scheduler_weight 0.5)",
        "  user ben: tokens_per_day 500000 → not set",
    ], dry.stdout
    as_json = run(one, "import", "--dry-run", "--json", str(file)).json()
    assert {"kind": "backend", "name": "ws2", "field": "max_concurrent", "before": 6, "after": 8} in as_json["changes"]
    assert pool(one) == before  # nothing was changed


async def test_an_import_that_moves_a_backend_sends_its_requests_to_the_new_url(daemon: Daemon) -> None:
    """The registry kept the old server's client for a backend whose URL an import changed, until a restart."""
    async with FakeOllama(models=["m"]) as old, FakeOllama(models=["m"]) as new:
        await daemon.backend("ws", old.url, "ollama")
        key = await daemon.user("ann")
        doc = {"backends": [{"name": "ws", "url": new.url, "engine": "ollama"}]}
        answer = await daemon.admin("POST", "/admin/import", doc)
        assert answer["changes"] == [
            {"kind": "backend", "name": "ws", "field": "url", "before": old.url, "after": new.url}
        ]
        await until(lambda: daemon.registry.by_name("ws").probe is not None, "the moved backend was never probed")
        resp = await daemon.client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert resp.status == 200, await resp.text()
        assert (old.requests, new.requests) == (0, 1)


def test_an_exported_file_takes_entries_appended_by_hand(pair: tuple[Live, Live], tmp_path: Path) -> None:
    """Groups were written as one inline array, so a `[[groups]]` block added below was not valid TOML."""
    one, _ = pair
    file = tmp_path / "lab.toml"
    assert run(one, "export", "-o", str(file)).exit_code == 0
    with file.open("a") as out:
        out.write(
            '\n[[groups]]\nname = "visitors"\nscheduler_weight = 0.5\n\n[[users]]\nname = "vic"\ngroup = "visitors"\n'
        )
    dry = run(one, "import", "--dry-run", str(file))
    assert dry.exit_code == 0, dry
    assert "  group visitors: new (scheduler_weight 0.5)" in dry.stdout.splitlines(), dry.stdout
    assert "  user vic: new (group visitors)" in dry.stdout.splitlines(), dry.stdout
