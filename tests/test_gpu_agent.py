"""`mr agent` over HTTP with a fake NVML, the client the daemon uses, and stale nodes."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web
from typer.testing import CliRunner

import mindrouter.gpu.agent as agent_mod
import mindrouter.gpu.probe as probe_mod
from mindrouter.cli import app as cli_app
from mindrouter.errors import MindRouterError, UsageError
from mindrouter.gpu import GpuProbe, GpuReading, NodeReadings
from mindrouter.gpu.agent import AGENT_STATE, create_agent_app, run_agent
from mindrouter.gpu.client import AgentClient, AgentError, agent_base_url, fetch_agent

from .fake_nvml import GIB, NVML_ERROR_LIBRARY_NOT_FOUND, FakeNvml, gpu
from .harness import until

KEY = "s3cret-agent-key"


@pytest.fixture(autouse=True)
def fresh_once_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_mod, "_explained", set())


def two_gpus() -> FakeNvml:
    return FakeNvml([gpu(0, used=10 * GIB), gpu(1, name="NVIDIA RTX 4090", total=24 * GIB, used=2 * GIB)])


def agent(fake: FakeNvml, **kw: object) -> web.Application:
    kw.setdefault("poll_interval", 3600.0)
    return create_agent_app(GpuProbe(fake, process_name=lambda pid: None), **kw)  # type: ignore[arg-type]


async def test_gpus_without_a_key(aiohttp_client) -> None:
    fake = two_gpus()
    client = await aiohttp_client(agent(fake))
    resp = await client.get("/gpus")
    assert resp.status == 200
    rows = await resp.json()
    assert [r["index"] for r in rows] == [0, 1]
    assert rows[1]["name"] == "NVIDIA RTX 4090" and rows[1]["memory_free"] == 22 * GIB
    assert float(resp.headers["X-Reading-Age"]) >= 0
    health = await (await client.get("/health")).json()
    assert health["status"] == "ok" and health["gpus"] == 2 and health["nvml"] == "ok"


async def test_key_is_required_when_set(aiohttp_client) -> None:
    client = await aiohttp_client(agent(two_gpus(), key=KEY))
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        for path in ("/gpus", "/health"):
            resp = await client.get(path, headers=headers)
            assert resp.status == 401, (path, headers)
            assert "Bearer" in resp.headers["WWW-Authenticate"]
            assert "key" in (await resp.json())["error"]
    resp = await client.get("/gpus", headers={"Authorization": f"Bearer {KEY}"})
    assert resp.status == 200 and len(await resp.json()) == 2


async def test_polls_in_the_background_not_per_request(aiohttp_client) -> None:
    fake = two_gpus()
    client = await aiohttp_client(agent(fake))
    for _ in range(5):
        assert (await client.get("/gpus")).status == 200
    assert fake.calls["nvmlDeviceGetCount"] == 1  # the startup read only

    fast = two_gpus()
    app = agent(fast, poll_interval=0.01)
    client = await aiohttp_client(app)
    fast.gpus[0].used = 30 * GIB
    await until(lambda: app[AGENT_STATE].polls >= 3, "the agent should poll in the background")
    rows = await (await client.get("/gpus")).json()
    assert rows[0]["memory_used"] == 30 * GIB
    await client.close()
    assert fast.initialized == 0  # NVML shut down at cleanup


async def test_agent_without_gpus(aiohttp_client) -> None:
    client = await aiohttp_client(agent(FakeNvml(init_error=NVML_ERROR_LIBRARY_NOT_FOUND)))
    assert await (await client.get("/gpus")).json() == []
    health = await (await client.get("/health")).json()
    assert health["gpus"] == 0 and health["nvml"] == "NVML Shared Library Not Found"


async def test_fetch_agent_with_and_without_its_key(aiohttp_client) -> None:
    fake = two_gpus()
    client = await aiohttp_client(agent(fake, key=KEY))
    url = str(client.make_url("/"))
    readings = await fetch_agent(client.session, url, KEY)
    assert all(isinstance(r, GpuReading) for r in readings)
    assert readings == GpuProbe(two_gpus(), process_name=lambda pid: None).read()
    with pytest.raises(AgentError, match="refused the key"):
        await fetch_agent(client.session, url, "wrong")
    with pytest.raises(AgentError, match="refused the key"):
        await fetch_agent(client.session, url)


async def test_fetch_agent_failures(aiohttp_client) -> None:
    async def not_readings(request: web.Request) -> web.Response:
        return web.json_response({"gpus": "many"})

    async def not_json(request: web.Request) -> web.Response:
        return web.Response(text="<html>")

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response([])

    other = web.Application()
    other.router.add_get("/a/gpus", not_readings)
    other.router.add_get("/b/gpus", not_json)
    other.router.add_get("/c/gpus", slow)
    client = await aiohttp_client(other)
    with pytest.raises(AgentError, match="not GPU readings"):
        await fetch_agent(client.session, str(client.make_url("/a")))
    with pytest.raises(AgentError, match="not GPU readings"):
        await fetch_agent(client.session, str(client.make_url("/b")))
    with pytest.raises(AgentError, match="HTTP 404"):
        await fetch_agent(client.session, str(client.make_url("/nothing")))
    with pytest.raises(AgentError, match="did not answer within"):
        await fetch_agent(client.session, str(client.make_url("/c")), timeout=0.05)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(AgentError, match="cannot reach GPU agent"):
        await fetch_agent(client.session, f"127.0.0.1:{port}")


async def test_agent_client_marks_a_silent_node_stale(aiohttp_client) -> None:
    client = await aiohttp_client(agent(two_gpus(), key=KEY))
    node_client = AgentClient(client.session, str(client.make_url("/")), KEY, poll_interval=5, timeout=1)
    assert node_client.node.stale(0.0)  # never answered yet
    assert await node_client.poll(now=100.0)
    assert len(node_client.node.current(101.0)) == 2
    node_client.key = "rotated"
    assert not await node_client.poll(now=105.0)
    assert node_client.node.failures == 1 and "refused" in node_client.node.last_error
    assert len(node_client.node.current(110.0)) == 2  # one missed poll: still current
    assert node_client.node.current(116.0) == []  # silent > 3 intervals: stale, readings unknown


def test_node_readings_stale_logic() -> None:
    node = NodeReadings("http://lab-2:8485", poll_interval=10, stale_after=3)
    assert node.stale(0) and node.current(0) == [] and node.age(0) is None
    node.record([GpuReading(index=0)], now=50)
    assert not node.stale(80) and node.current(80) == [GpuReading(index=0)]
    assert node.stale(80.5)
    node.record_failure("timeout", now=60)
    node.record_failure("timeout", now=70)
    assert node.failures == 2 and node.last_error == "timeout" and not node.stale(75)
    snap = node.snapshot(90)
    assert snap == {
        "node": "http://lab-2:8485",
        "stale": True,
        "gpus": [GpuReading(index=0).to_dict()],
        "age_seconds": 40,
        "error": "timeout",
    }
    node.record([], now=95)
    assert node.failures == 0 and node.last_error is None and not node.stale(95)
    with pytest.raises(ValueError):
        NodeReadings("x", poll_interval=0)
    with pytest.raises(ValueError):
        NodeReadings("x", poll_interval=1, stale_after=0)


def test_agent_base_url() -> None:
    assert agent_base_url("lab-2:8485") == "http://lab-2:8485"
    assert agent_base_url("https://lab-2:8485/ ") == "https://lab-2:8485"


def test_mr_agent_command(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    seen: list[tuple] = []
    monkeypatch.setattr(agent_mod, "run_agent", lambda *a, **kw: seen.append((a, kw)))
    env = {"MR_CONFIG": str(tmp_path / "none.toml")}
    result = CliRunner().invoke(cli_app, ["agent", "--port", "9999", "--key", "k", "--interval", "2"], env=env)
    assert result.exit_code == 0, result.output
    assert seen == [(("127.0.0.1", 9999, "k"), {"poll_interval": 2.0})]
    (tmp_path / "mr.toml").write_text("[server]\ngpu_poll_interval = 7.5\n")
    result = CliRunner().invoke(cli_app, ["agent", "--config", str(tmp_path / "mr.toml")], env={"MR_AGENT_KEY": "e"})
    assert result.exit_code == 0, result.output
    assert seen[-1] == (("127.0.0.1", 8485, "e"), {"poll_interval": 7.5})
    result = CliRunner().invoke(cli_app, ["--config", str(tmp_path / "mr.toml"), "agent"], env=env)
    assert result.exit_code == 0, result.output
    assert seen[-1] == (("127.0.0.1", 8485, None), {"poll_interval": 7.5})
    result = CliRunner().invoke(cli_app, ["agent", "--key", " "], env=env)
    assert isinstance(result.exception, UsageError)
    result = CliRunner().invoke(cli_app, ["agent", "--interval", "0"], env=env)
    assert isinstance(result.exception, UsageError)
    result = CliRunner().invoke(cli_app, ["agent", "--port", "0"], env=env)
    assert result.exit_code == 2


def test_run_agent_on_a_busy_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(MindRouterError, match=f"cannot listen on 127.0.0.1:{port}"):
            run_agent("127.0.0.1", port, probe=GpuProbe(FakeNvml([])))
