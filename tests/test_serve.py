"""`mr serve` as a person runs it: a real process, the CLI over its socket, SIGTERM."""

from __future__ import annotations

import asyncio
import grp
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from .fakes import FakeOpenAI
from .harness import until

MR = [sys.executable, "-m", "mindrouter.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(tmp_path: Path):
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(
        f'[server]\nport = {port}\nsocket = "{tmp_path / "mr.sock"}"\nstate_dir = "{tmp_path / "state"}"\n'
        "shutdown_grace_seconds = 10\n[backends]\npoll_interval = 0.5\n"
    )
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 - open while the daemon runs
    proc = subprocess.Popen([*MR, "serve", "--config", str(config), "--no-discover"], stderr=log, stdout=log)
    deadline = time.monotonic() + 20
    while not (tmp_path / "mr.sock").exists():
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        assert time.monotonic() < deadline, "mr serve did not start"
        time.sleep(0.05)
    yield proc, config, port, tmp_path
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    log.close()


def mr(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MR, "--config", str(config), *args], capture_output=True, text=True, timeout=30)


async def test_cli_manages_a_running_daemon_and_sigterm_lets_requests_finish(served):
    proc, config, port, tmp = served
    assert oct((tmp / "mr.sock").stat().st_mode & 0o777) == "0o600"
    async with FakeOpenAI(flavor="vllm", models=["llama3"], tokens_per_second=20, completion_tokens=20) as fake:
        r = await amr(config, "backend", "add", "gpu1", fake.url, "--engine", "vllm", "--max-concurrent", "2")
        assert r.returncode == 0, r.stderr
        assert (await amr(config, "user", "add", "ann", "--group", "faculty")).returncode == 0
        r = await amr(config, "user", "key", "ann", "--json")
        key = json.loads(r.stdout)["key"]
        status = json.loads((await amr(config, "status", "--json")).stdout)
        assert status["backends"] == 1 and status["queue_total"] == 0 and status["version"]
        backends = json.loads((await amr(config, "backend", "list", "--json")).stdout)
        assert backends[0]["status"] == "healthy" and backends[0]["models"] == ["llama3"]

        async with aiohttp.ClientSession() as session:
            # A 1 s generation is in flight when SIGTERM arrives (held at the fake's gate till then): it must
            # still complete.
            fake.max_concurrent = 0
            request = asyncio.create_task(
                session.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    json={"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20},
                    headers={"Authorization": f"Bearer {key}"},
                )
            )
            await until(lambda: fake.in_flight == 1, "the request should reach the backend")
            proc.send_signal(signal.SIGTERM)
            fake.open_gate()
            resp = await request
            data = await resp.json()
            assert resp.status == 200 and data["usage"]["completion_tokens"] == 20
    assert await asyncio.to_thread(proc.wait, 15) == 0
    log = (tmp / "serve.log").read_text()
    assert "shutting down" in log and "stopped" in log
    assert key not in log  # keys are never logged
    assert not (tmp / "mr.sock").exists()


async def test_sigterm_ends_what_waits_and_lets_the_running_stream_finish(served):
    """The running stream finishes, the queued requests are told why, the daemon exits."""
    proc, config, port, tmp = served
    # The fake holds the running stream at its gate until the daemon is told to stop: however slow the
    # machine, the other two are still waiting then.
    fake = FakeOpenAI(flavor="vllm", models=["m"], tokens_per_second=10, completion_tokens=20, max_concurrent=0)
    async with fake:
        key = await pool_of_one(config, fake.url, "--max-concurrent", "1")
        url, headers = f"http://127.0.0.1:{port}/v1/chat/completions", {"Authorization": f"Bearer {key}"}
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

        async def ask(session: aiohttp.ClientSession, stream: bool) -> tuple[int, str]:
            async with session.post(url, json={**body, "stream": stream}, headers=headers) as resp:
                return resp.status, await resp.text()

        async with aiohttp.ClientSession() as session:
            running = asyncio.create_task(ask(session, True))  # 2 s of tokens, once the gate opens
            await until(lambda: fake.in_flight, "the running stream did not reach the backend")
            queued = [asyncio.create_task(ask(session, stream)) for stream in (True, False)]

            async def both_queued() -> bool:
                return json.loads((await amr(config, "status", "--json")).stdout)["queue_total"] == 2

            await until(both_queued, "both requests should wait in the queue", timeout=30)  # `mr` each time
            began = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            fake.open_gate()
            (stream_status, stream_text), (plain_status, plain_text) = await asyncio.gather(*queued)
            status, text = await running
        assert stream_status == 200 and "shutting down" in stream_text and stream_text.rstrip().endswith("[DONE]")
        assert plain_status == 503 and "shutting down" in json.loads(plain_text)["error"]["message"]
        assert status == 200 and text.count('"content"') == 20 and text.rstrip().endswith("data: [DONE]")
    assert await asyncio.to_thread(proc.wait, 15) == 0
    assert time.monotonic() - began < 10  # within the grace (10 s here)
    assert "Traceback" not in (tmp / "serve.log").read_text()


async def pool_of_one(config: Path, url: str, *backend: str) -> str:
    """Backend gpu1 (vLLM at ``url``, with ``backend``'s options) and user ann (staff); returns ann's key."""
    r = await amr(config, "backend", "add", "gpu1", url, "--engine", "vllm", *backend)
    assert r.returncode == 0, r.stderr
    assert (await amr(config, "user", "add", "ann", "--group", "staff")).returncode == 0
    return json.loads((await amr(config, "user", "key", "ann", "--json")).stdout)["key"]


async def amr(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``mr`` from a thread, so the fake backends in this event loop keep answering."""
    return await asyncio.to_thread(mr, config, *args)


def test_cli_exits_3_when_no_daemon_answers(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(f'[server]\nsocket = "{tmp_path / "none.sock"}"\n')
    r = mr(config, "status")
    assert r.returncode == 3
    assert "mr serve" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # It says which socket it tried, where that came from, and how to point at another.
    assert f"{tmp_path / 'none.sock'} ([server] socket from {config})" in r.stderr
    assert "--config FILE or MR_CONFIG" in r.stderr


def test_a_second_daemon_on_the_same_socket_is_refused(served):
    _, config, _, _ = served
    r = subprocess.run(
        [*MR, "serve", "--config", str(config), "--no-discover", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1 and "another mr serve" in r.stderr


def start_serve(config: Path, log: Path, socket_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], float]:
    """`mr serve` in a new process; returns it and the seconds until its socket answered."""
    began = time.monotonic()
    out = open(log, "a")  # noqa: SIM115 - the process writes to it until it ends
    proc = subprocess.Popen([*MR, "serve", "--config", str(config), "--no-discover", *args], stderr=out, stdout=out)
    out.close()
    while True:
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() - began < 30, "mr serve did not start"
        if socket_path.exists() and mr(config, "status").returncode == 0:
            return proc, time.monotonic() - began
        time.sleep(0.05)


def test_a_second_daemon_on_the_same_state_is_refused_before_it_touches_anything(served):
    """Other port, other socket, same state_dir: refused at once, naming the daemon that has it."""
    proc, config, _, tmp = served
    other = tmp / "other.toml"
    other.write_text(config.read_text().replace(str(tmp / "mr.sock"), str(tmp / "other.sock")))
    began = time.monotonic()
    r = subprocess.run(
        [*MR, "serve", "--config", str(other), "--port", str(free_port())], capture_output=True, text=True, timeout=30
    )
    took = time.monotonic() - began
    assert r.returncode == 1, r.stderr
    assert f"another mr serve (pid {proc.pid}, http://127.0.0.1:" in r.stderr and str(tmp / "state") in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1  # one sentence: no usage restored, no backend probed
    assert not (tmp / "other.sock").exists()
    print(f"second daemon refused in {took:.2f} s (process start included)")
    assert took < 15


async def test_sigkill_under_load_loses_no_record_and_the_restart_answers_within_seconds(served):
    proc, config, port, tmp = served
    async with FakeOpenAI(flavor="vllm", models=["llama3"], tokens_per_second=100, completion_tokens=10) as fake:
        assert (await amr(config, "backend", "add", "gpu1", fake.url, "--engine", "vllm")).returncode == 0
        assert (await amr(config, "group", "add", "lab", "--weight", "2.5")).returncode == 0
        keys = {}
        for name in ("ann", "bob", "cid"):
            assert (await amr(config, "user", "add", name, "--group", "lab")).returncode == 0
            keys[name] = json.loads((await amr(config, "user", "key", name, "--json")).stdout)["key"]
        done: list[float] = []

        async def one(session: aiohttp.ClientSession, key: str) -> None:
            body = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
            headers = {"Authorization": f"Bearer {key}"}
            try:
                async with session.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=headers
                ) as r:
                    if r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 10:
                        done.append(time.monotonic())
            except aiohttp.ClientError:
                pass  # killed mid-request

        async with aiohttp.ClientSession() as session:
            load = [asyncio.create_task(one(session, keys[n])) for _ in range(40) for n in keys]
            await until(lambda: len(done) >= 30, "30 answers before the kill", timeout=30)
            killed_at = time.monotonic()
            proc.kill()
            await asyncio.gather(*load)
        await asyncio.to_thread(proc.wait, 10)
        settled = sum(1 for t in done if t < killed_at - 0.5)  # answered well before the kill

        again, took = await asyncio.to_thread(start_serve, config, tmp / "serve.log", tmp / "mr.sock")
        try:
            users = json.loads((await amr(config, "user", "list", "--json")).stdout)
            assert sorted(u["name"] for u in users) == ["ann", "bob", "cid"] and {u["weight"] for u in users} == {2.5}
            backends = json.loads((await amr(config, "backend", "list", "--json")).stdout)
            assert [b["name"] for b in backends] == ["gpu1"]
            async with aiohttp.ClientSession() as session:
                for key in keys.values():
                    async with session.post(
                        f"http://127.0.0.1:{port}/v1/chat/completions",
                        json={"model": "llama3", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
                        headers={"Authorization": f"Bearer {key}"},
                    ) as r:
                        assert r.status == 200
        finally:
            again.terminate()
            await asyncio.to_thread(again.wait, 15)
    modes = {f.name: oct(f.stat().st_mode & 0o777) for f in (tmp / "state").iterdir()}
    assert set(modes.values()) == {"0o600"} and "mindrouter.db" in modes and "mr.lock" in modes, modes
    assert oct((tmp / "state").stat().st_mode & 0o777) == "0o700"
    with sqlite3.connect(tmp / "state" / "mindrouter.db") as db:
        rows = db.execute("SELECT count(*) FROM usage").fetchone()[0]
    assert rows >= settled + 3, (rows, settled)
    print(
        f"SIGKILL after {len(done)} answers ({settled} > 0.5 s before): "
        f"{rows - 3} usage rows kept; restart {took:.2f} s"
    )
    assert took < 15


@pytest.mark.parametrize(
    ("setup", "says"),
    [
        ({"state/mindrouter.db": b"\x00garbage" * 600}, "the state database"),
        ({"state/mindrouter.db": b"SQLite format 3\x00" + b"\xff" * 4000}, "the state database"),
        ({"config.toml": b"[server\nport = "}, "is not valid TOML"),
        ({"config.toml": b"[server]\nport = 'x'\n"}, "[server] port must be a whole number"),
        ({"config.toml": b"\xff\xfe[server]"}, "cannot read config file"),
        ({"config.toml": None}, "does not exist; create it with `mr config init`"),
        ({"state": b"a file where the folder goes"}, "cannot use the state folder"),
    ],
)
def test_a_corrupt_or_missing_config_or_state_file_is_one_sentence(tmp_path, setup, says):
    config = tmp_path / "config.toml"
    config.write_text(
        f'[server]\nport = {free_port()}\nsocket = "{tmp_path / "s.sock"}"\nstate_dir = "{tmp_path / "state"}"\n'
    )
    (tmp_path / "state").mkdir()
    for name, data in setup.items():
        target = tmp_path / name
        if target.is_dir():
            target.rmdir()
        if data is None:
            target.unlink()
        else:
            target.write_bytes(data)
    r = subprocess.run(
        [*MR, "serve", "--config", str(config), "--no-discover"], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 1 and says in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


def test_the_cli_finds_a_default_socket_without_xdg_runtime_dir(tmp_path):
    """`mr serve` started in a login session (XDG_RUNTIME_DIR set), `mr status` from sudo or cron (unset)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_") and k != "MR_CONFIG"}
    env["HOME"] = str(tmp_path / "home")
    (tmp_path / "xdg").mkdir(mode=0o700)
    config = tmp_path / "port.toml"  # only the port: socket and state at their defaults
    config.write_text(f"[server]\nport = {free_port()}\n")
    with open(tmp_path / "serve.log", "w") as log:
        proc = subprocess.Popen(
            [*MR, "serve", "--config", str(config), "--no-discover"],
            env={**env, "XDG_RUNTIME_DIR": str(tmp_path / "xdg")},
            stderr=log,
            stdout=log,
        )
    try:
        socket_path = tmp_path / "xdg" / "mindrouter" / "mr.sock"
        deadline = time.monotonic() + 20
        while not socket_path.exists():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.05)
        r = subprocess.run([*MR, "--config", str(config), "status", "--json"], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["socket"] == str(socket_path)
    finally:
        proc.terminate()
        proc.wait(15)


def test_the_admin_socket_can_be_shared_with_a_group(tmp_path):
    group = grp.getgrgid(os.getgid()).gr_name
    config = tmp_path / "config.toml"
    base = f'[server]\nport = {free_port()}\nsocket = "{tmp_path / "s.sock"}"\nstate_dir = "{tmp_path / "state"}"\n'
    config.write_text(base + 'socket_group = "no-such-group-here"\n')
    r = subprocess.run([*MR, "serve", "--config", str(config)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "socket_group 'no-such-group-here' is not a group" in r.stderr, r.stderr
    assert not (tmp_path / "state").exists()  # refused before anything started
    config.write_text(base + f'socket_group = "{group}"\n')
    proc, _ = start_serve(config, tmp_path / "serve.log", tmp_path / "s.sock")
    try:
        info = (tmp_path / "s.sock").stat()
        assert oct(info.st_mode & 0o777) == "0o660" and info.st_gid == os.getgid()
    finally:
        proc.terminate()
        proc.wait(15)
