"""Shared fixtures: a real daemon app on 127.0.0.1 with fake backends (tests/fakes.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import settings as hypothesis_settings

from mindrouter.config import BackendSettings, Config, ServerSettings
from mindrouter.daemon.edge.app import create_app, make_runner
from mindrouter.daemon.process.appkeys import REGISTRY, SCHEDULER
from mindrouter.scheduler import SchedulerSettings

from .fake_nvml import FakeNvml
from .fakes import fake_llamacpp, fake_ollama, fake_openai, fake_vllm  # noqa: F401 (fixtures)

hypothesis_settings.register_profile("mindrouter", max_examples=300)
hypothesis_settings.register_profile("fuzz", max_examples=1500)
hypothesis_settings.load_profile("mindrouter")
"""The HTTP fuzz tests (tests/test_bad_input.py) take their example count from the profile: 300 in the
default run, 1,500 with ``--hypothesis-profile=fuzz`` (CI runs that file so); tests that name a count keep it."""

ADMIN_KEY = "test-admin-key"
SEED_RECORD_KEYS = (
    "request_id",
    "selected_backend_id",
    "candidate_backends",
    "scores",
    "user_deficit",
    "user_weight",
    "user_group",
    "user_recent_usage",
)
"""The decision record's keys that DESIGN section 7 says may never be removed or renamed."""


@dataclasses.dataclass
class Daemon:
    """A running daemon and helpers to drive its admin API over TCP (with the admin key)."""

    client: Any
    app: Any
    config: Config

    @property
    def url(self) -> str:
        return str(self.client.make_url("")).rstrip("/")

    @property
    def scheduler(self) -> Any:
        return self.app[SCHEDULER]

    @property
    def registry(self) -> Any:
        return self.app[REGISTRY]

    async def admin(self, method: str, path: str, json: Any = None, status: int | None = None) -> Any:
        resp = await self.client.request(method, path, json=json, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        data = await resp.json()
        if status is not None:
            assert resp.status == status, (resp.status, data)
        elif resp.status >= 400:
            raise AssertionError(f"{method} {path} -> {resp.status} {data}")
        return data

    async def user(self, name: str, group: str = "student", weight: float | None = None) -> str:
        """Create a user and return a new key for it."""
        body: dict[str, Any] = {"name": name, "group": group}
        if weight is not None:
            body["weight"] = weight
        await self.admin("POST", "/admin/users", body)
        return (await self.admin("POST", f"/admin/users/{name}/keys"))["key"]

    async def backend(self, name: str, url: str, engine: str, max_concurrent: int = 4, **kw: Any) -> dict[str, Any]:
        return await self.admin(
            "POST",
            "/admin/backends",
            {"name": name, "url": url, "engine": engine, "max_concurrent": max_concurrent, **kw},
        )


def daemon_config(tmp_path: Path, **scheduler: Any) -> Config:
    return Config(
        server=ServerSettings(
            state_dir=str(tmp_path / "state"),
            socket=str(tmp_path / "mr.sock"),
            admin_key=ADMIN_KEY,
            discover=False,
            gpu_poll_interval=0.2,
        ),
        scheduler=SchedulerSettings(**scheduler),
        backends=BackendSettings(poll_interval=0.2, circuit_cooldown=0.3, connect_timeout=1.0, circuit_failures=3),
    )


class ServeServer(TestServer):
    """The app served as ``mr serve`` serves it: with the runner ``make_runner`` sets up."""

    def __init__(self, app: web.Application, config: Config) -> None:
        super().__init__(app)
        self.config = config

    async def _make_runner(self, **kwargs: Any) -> web.AppRunner:
        return make_runner(self.app, self.config)


@dataclasses.dataclass
class ServedDaemon:
    """A daemon served on a TCP port as ``mr serve`` serves it, with backend "gpu" and user "ann" (key ``key``)."""

    app: web.Application
    server: TestServer
    key: str

    @property
    def port(self) -> int:
        return self.server.port or 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.asynccontextmanager
async def serve_daemon(
    tmp_path: Path,
    fake_url: str,
    engine: str,
    *,
    max_concurrent: int = 1,
    scheduler: dict[str, Any] | None = None,
    adapters: Any = None,
    **server: Any,
) -> AsyncIterator[ServedDaemon]:
    """Serve a daemon whose one backend (``max_concurrent`` slots) is ``fake_url``; ``server`` overrides settings."""
    config = daemon_config(tmp_path, **(scheduler or {}))
    config = dataclasses.replace(config, server=dataclasses.replace(config.server, **server))
    app = await create_app(config, nvml=FakeNvml(init_error=FakeNvml.NVML_ERROR_LIBRARY_NOT_FOUND), adapters=adapters)
    served = ServeServer(app, config)
    await served.start_server()
    try:
        async with TestClient(served) as client:
            admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
            backend = {"name": "gpu", "url": fake_url, "engine": engine, "max_concurrent": max_concurrent}
            for path, body in (("/admin/backends", backend), ("/admin/users", {"name": "ann", "group": "student"})):
                async with client.post(path, json=body, headers=admin) as r:
                    assert r.status < 300, await r.text()
            async with client.post("/admin/users/ann/keys", json={}, headers=admin) as r:
                key = (await r.json())["key"]
            yield ServedDaemon(app, served, key)
    finally:
        await served.close()


async def until(predicate: Callable[[], object], what: str = "the condition never held", timeout: float = 10.0) -> None:
    """Wait until ``predicate()`` (or what it returns, awaited) is true; fail with ``what`` after ``timeout`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        assert loop.time() < deadline, what
        await asyncio.sleep(0.02)


@pytest.fixture
def nvml() -> FakeNvml:
    """No NVIDIA driver, unless a test swaps in GPUs."""
    return FakeNvml(init_error=FakeNvml.NVML_ERROR_LIBRARY_NOT_FOUND)


@pytest.fixture
async def daemon(tmp_path: Path, aiohttp_client: Any, nvml: FakeNvml) -> AsyncIterator[Daemon]:
    config = daemon_config(tmp_path)
    app = await create_app(config, nvml=nvml)
    client = await aiohttp_client(ServeServer(app, config))
    yield Daemon(client, app, config)
