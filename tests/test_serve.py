"""`mr serve` as a person runs it: a real process, the CLI over its socket, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from .fakes import FakeOpenAI

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
        f'[server]\nport = {port}\nsocket = "{tmp_path / "mr.sock"}"\nstate_dir = "{tmp_path / "state"}"\nshutdown_grace_seconds = 10\n[backends]\npoll_interval = 0.5\n'
    )
    log = open(tmp_path / "serve.log", "w")
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
            # A 1 s generation is in flight when SIGTERM arrives: it must still complete.
            request = asyncio.create_task(
                session.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    json={"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20},
                    headers={"Authorization": f"Bearer {key}"},
                )
            )
            for _ in range(100):
                if fake.in_flight:
                    break
                await asyncio.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
            resp = await request
            data = await resp.json()
            assert resp.status == 200 and data["usage"]["completion_tokens"] == 20
    assert await asyncio.to_thread(proc.wait, 15) == 0
    log = (tmp / "serve.log").read_text()
    assert "shutting down" in log and "stopped" in log
    assert key not in log  # keys are never logged
    assert not (tmp / "mr.sock").exists()


async def amr(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``mr`` from a thread, so the fake backends in this event loop keep answering."""
    return await asyncio.to_thread(mr, config, *args)


def test_cli_exits_3_when_no_daemon_answers(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(f'[server]\nsocket = "{tmp_path / "none.sock"}"\n')
    r = mr(config, "status")
    assert r.returncode == 3
    assert "mr serve" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_second_daemon_on_the_same_socket_is_refused(served):
    _, config, _, _ = served
    r = subprocess.run(
        [*MR, "serve", "--config", str(config), "--no-discover", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1 and "already listening" in r.stderr
