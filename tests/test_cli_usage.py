"""`mr usage` and `mr user|group set-quota` against a real running daemon."""

from __future__ import annotations

import csv
import io

import aiohttp
import pytest

from .test_cli_daemon import ThreadDaemon, live, run  # noqa: F401 (the fixture)


def test_usage_and_quotas_from_the_command_line(live: ThreadDaemon) -> None:  # noqa: F811
    assert run(live, "user", "add", "ann", "--group", "student").exit_code == 0
    assert run(live, "user", "add", "ben", "--group", "staff").exit_code == 0
    r = run(live, "user", "set-quota", "ann", "--tokens-per-day", "2M", "--requests-per-minute", "100", "--json")
    assert r.exit_code == 0, r
    assert (r.json()["tokens_per_day"], r.json()["requests_per_minute"]) == (2_000_000, 100)
    r = run(live, "group", "set-quota", "student", "--tokens-per-month", "1.5k")
    assert r.exit_code == 0 and "month 1.5k" in r.stdout, r
    keys = {name: run(live, "user", "key", name, "--json").json()["key"] for name in ("ann", "ben")}
    assert run(live, "backend", "add", "ws9", live.fake.url, "--engine", "ollama").exit_code == 0

    async def chat(key: str, model: str, tokens: int) -> None:
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                f"http://127.0.0.1:{live.port}/v1/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": "a b c"}], "max_tokens": tokens},
                headers={"Authorization": f"Bearer {key}"},
            ) as resp,
        ):
            assert resp.status == 200

    live.call(chat(keys["ann"], "llama3", 3))
    live.call(chat(keys["ann"], "mistral", 1))
    live.call(chat(keys["ben"], "llama3", 5))

    rows = run(live, "usage", "--by", "user,model", "--since", "1h", "--json").json()
    mine = [r for r in rows if r["user"] in ("ann", "ben")]
    assert [(r["user"], r["model"], r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in mine] == [
        ("ben", "llama3", 1, 3, 5),
        ("ann", "llama3", 1, 3, 3),
        ("ann", "mistral", 1, 3, 1),
    ]
    keys = {"user", "model", "requests", "prompt_tokens", "completion_tokens", "gpu_seconds", "service_units"}
    assert set(mine[0]) == keys
    # Service units apart from tokens: prompt tokens cost 1, answer tokens 2 by default.
    assert [r["service_units"] for r in mine] == [3 + 2 * 5, 3 + 2 * 3, 3 + 2 * 1]
    out = run(live, "usage", "--by", "group,day", "--csv").stdout
    table = list(csv.reader(io.StringIO(out)))
    assert table[0] == [
        "group",
        "day",
        "requests",
        "prompt_tokens",
        "completion_tokens",
        "gpu_seconds",
        "service_units",
    ]
    assert [table[1 + [r[0] for r in table[1:]].index("student")][i] for i in (0, 2)] == ["student", "2"]
    people = run(live, "usage", "--by", "user")
    assert people.exit_code == 0 and "total" in people.stdout and "ann" in people.stdout
    assert "UTC" in people.stdout and "quotas" in people.stdout and "user ann" in people.stdout
    users = run(live, "user", "list")
    assert "10/2.0M day" in users.stdout.replace(" ", "") or "10/2.0Mday" in users.stdout.replace(" ", "")
    assert "ann" in run(live, "share").stdout
    assert run(live, "user", "set-quota", "ann", "--clear", "--json").json()["tokens_per_day"] is None


@pytest.mark.parametrize(
    "args, words",
    [
        (("usage", "--by", "colour"), "--by 'colour' is not known"),
        (("usage", "--since", "last week"), "give an age such as 7d"),
        (("user", "set-quota", "ann"), "give at least one limit"),
        (("user", "set-quota", "ann", "--tokens-per-day", "lots"), "is not a count"),
        (("user", "set-quota", "ann", "--tokens-per-day", "1", "--clear"), "not both"),
    ],
)
def test_usage_and_quota_refusals(live: ThreadDaemon, args, words) -> None:  # noqa: F811
    run(live, "user", "add", "ann", "--group", "student")
    r = run(live, *args)
    assert r.exit_code in (1, 2) and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r


def test_quotas_travel_through_export_and_import(live: ThreadDaemon, tmp_path) -> None:  # noqa: F811
    run(live, "user", "add", "cyd", "--group", "student")
    assert run(live, "user", "set-quota", "cyd", "--tokens-per-day", "3M").exit_code == 0
    assert run(live, "group", "set-quota", "faculty", "--requests-per-minute", "600").exit_code == 0
    exported = run(live, "export").stdout
    assert "tokens_per_day = 3000000" in exported and "requests_per_minute = 600" in exported
    assert run(live, "user", "set-quota", "cyd", "--clear").exit_code == 0
    assert run(live, "group", "set-quota", "faculty", "--clear").exit_code == 0
    file = tmp_path / "pool.toml"
    file.write_text(exported)
    assert run(live, "import", str(file)).exit_code == 0
    users = {u["name"]: u for u in run(live, "user", "list", "--json").json()}
    groups = {g["name"]: g for g in run(live, "group", "list", "--json").json()}
    assert users["cyd"]["tokens_per_day"] == 3_000_000 and groups["faculty"]["requests_per_minute"] == 600
    file.write_text('[[users]]\nname = "cyd"\ngroup = "student"\ntokens_per_day = "lots"\n')
    bad = run(live, "import", str(file))
    assert bad.exit_code == 2 and "tokens_per_day 'lots' is not a count" in bad.stderr


def test_usage_prints_times_in_the_zone_it_names(tmp_path, monkeypatch) -> None:
    """The daemon in Tokyo, the CLI in New York: the report's times are the server's, as its title says."""
    import os
    import subprocess

    from .test_serve import MR, free_port, start_serve

    config = tmp_path / "config.toml"
    config.write_text(
        f'[server]\nport = {free_port()}\nsocket = "{tmp_path / "mr.sock"}"\nstate_dir = "{tmp_path / "state"}"\n'
    )
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    proc, _ = start_serve(config, tmp_path / "serve.log", tmp_path / "mr.sock")
    try:
        env = {**os.environ, "TZ": "America/New_York"}
        args = ["usage", "--since", "2026-11-01T08:00", "--until", "2026-11-02"]
        r = subprocess.run([*MR, "--config", str(config), *args], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "usage from 2026-11-01 08:00 to 2026-11-02 00:00 (server time, JST, UTC+09:00)" in r.stdout, r.stdout
    finally:
        proc.terminate()
        proc.wait(15)
