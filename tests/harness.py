"""The one way a test gets a daemon: ``daemon(...)``; and the one way it waits: ``until(...)``.

    async with daemon(tmp_path, scheduler={"queue_timeout": 0.5}) as d:
        await d.backend("b1", InProcess(models=("llama3",), held=True), max_concurrent=1)
        key = await d.user("ann")
        resp = await d.client.post("/v1/chat/completions", json=..., headers={"Authorization": f"Bearer {key}"})

The daemon is the real app (``create_app``) served on 127.0.0.1 by the runner ``mr serve``
uses (``make_runner``), with no GPU driver, and its admin API driven with the admin key.
Backends are in-process (tests/inprocess.py) by default: a row added with an ``InProcess``
answers from it, without a socket, so a loaded machine changes no outcome. A row added
with a URL gets the engine's real adapter over HTTP: use that, with a fake server on
127.0.0.1 (tests/fakes/), where the wire is the subject (conformance, framing,
smuggling, client libraries, connections that fail or lie).

- ``scheduler``, ``server``, ``backends``: overrides of those config sections (or pass a whole ``config``);
- ``inprocess``: in-process backends the state already names (a daemon restarted on the same ``tmp_path``);
- ``nvml``: a GPU driver stand-in (tests/fake_nvml.py);
- ``unix=True``: also serve the admin socket at ``[server] socket``, for ``mr`` commands.

``daemon_in_thread(...)`` runs the same daemon on an event loop of its own, for clients that
block (the CLI, raw sockets). The fixtures in conftest.py wrap it: ``daemon`` is
``daemon(tmp_path)``; ``await new_daemon(**kw)`` starts one with settings, stopped with the
test (call it again on the same state to restart). Moving an older test onto it:

- ``serve_daemon(tmp_path, url, engine, scheduler=S, **server)``: ``daemon(tmp_path, scheduler=S,
  server=server)``, then ``d.backend("gpu", url, engine, max_concurrent=1)`` and
  ``d.key = await d.user("ann")`` (``url`` an ``InProcess`` unless the wire is the subject);
- ``create_app`` + ``aiohttp_client(ServeServer(...))``: ``await new_daemon(scheduler=..., server=...,
  backends=...)``.

Every wait in a test is bounded: ``until`` for conditions, ``asyncio.timeout`` for awaits,
and pytest-timeout for the test as a whole (pyproject.toml).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from mindrouter.backends import Adapter
from mindrouter.config import BackendSettings, Config, ServerSettings
from mindrouter.daemon.edge.services import SERVICES
from mindrouter.daemon.process.app import create_app
from mindrouter.daemon.process.serve import make_runner
from mindrouter.scheduler import SchedulerSettings

from .fake_nvml import FakeNvml
from .inprocess import InProcess

ADMIN_KEY = "test-admin-key"
T = TypeVar("T")


def daemon_config(tmp_path: Path, **scheduler: Any) -> Config:
    """The test daemon's settings: state under ``tmp_path``, quick polls and breaker, ``scheduler`` overrides."""
    return Config(
        server=ServerSettings(
            state_dir=str(tmp_path / "state"),
            socket=str(tmp_path / "mr.sock"),
            admin_key=ADMIN_KEY,
            discover=False,
            gpu_poll_interval=0.2,
        ),
        scheduler=SchedulerSettings(**scheduler),
        # connect_timeout: a probe may take twice this; 1 s let a probe of a fake on a busy machine time out.
        backends=BackendSettings(poll_interval=0.2, circuit_cooldown=0.3, connect_timeout=5.0, circuit_failures=3),
    )


def _configured(
    tmp_path: Path,
    scheduler: Mapping[str, Any] | None,
    server: Mapping[str, Any] | None,
    backends: Mapping[str, Any] | None,
) -> Config:
    config = daemon_config(tmp_path, **(scheduler or {}))
    return dataclasses.replace(
        config,
        server=dataclasses.replace(config.server, **(server or {})),
        backends=dataclasses.replace(config.backends, **(backends or {})),
    )


class ServeServer(TestServer):
    """The app served as ``mr serve`` serves it: with the runner ``make_runner`` sets up."""

    def __init__(self, app: web.Application, config: Config) -> None:
        super().__init__(app, host="127.0.0.1")
        self.config = config

    async def _make_runner(self, **kwargs: Any) -> web.AppRunner:
        return make_runner(self.app, self.config)


class Adapters:
    """The daemon's adapter factory: in-process backends by their URL, the engine's adapter for the rest."""

    def __init__(self, inprocess: Iterable[InProcess] = ()) -> None:
        self.inprocess = {b.url: b for b in inprocess}
        self.engine: Callable[[Any], Adapter] | None = None
        """The registry's own factory (set once the app exists): HTTP to a real or fake server."""

    def __call__(self, row: Any) -> Adapter:
        backend = self.inprocess.get(Adapter.normalize_url(row.url))
        if backend is not None:
            return backend(row)
        assert self.engine is not None, "the daemon is not built yet"
        return self.engine(row)


@dataclasses.dataclass
class Daemon:
    """A running daemon and helpers to drive its admin API over TCP (with the admin key)."""

    client: TestClient
    app: web.Application
    config: Config
    adapters: Adapters = dataclasses.field(default_factory=Adapters)
    key: str = ""
    """A user's key, where a helper made one (``serve_daemon``: user "ann")."""

    @property
    def server(self) -> TestServer:
        return self.client.server

    @property
    def port(self) -> int:
        return self.client.server.port or 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def scheduler(self) -> Any:
        return self.app[SERVICES].scheduler

    @property
    def registry(self) -> Any:
        return self.app[SERVICES].registry

    @property
    def store(self) -> Any:
        return self.app[SERVICES].store

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
        return str((await self.admin("POST", f"/admin/users/{name}/keys"))["key"])

    async def backend(
        self, name: str, url: str | InProcess, engine: str = "vllm", max_concurrent: int = 4, **kw: Any
    ) -> dict[str, Any]:
        """Add a backend row: an in-process backend, or the server at ``url`` (spoken to as ``engine``).

        Returns once the daemon has probed it: the admin API waits a little for that, a busy machine longer."""
        if isinstance(url, InProcess):
            self.adapters.inprocess[url.url] = url
            url, engine = url.url, "vllm"
        body = {"name": name, "url": url, "engine": engine, "max_concurrent": max_concurrent, **kw}
        row = dict(await self.admin("POST", "/admin/backends", body))
        entry = self.registry.entries[row["id"]]
        await until(entry.probed.is_set, f"backend {name} should be probed")
        return row


@contextlib.asynccontextmanager
async def daemon(
    tmp_path: Path,
    *,
    config: Config | None = None,
    scheduler: Mapping[str, Any] | None = None,
    server: Mapping[str, Any] | None = None,
    backends: Mapping[str, Any] | None = None,
    inprocess: Iterable[InProcess] = (),
    nvml: Any = None,
    unix: bool = False,
) -> AsyncIterator[Daemon]:
    """A daemon on 127.0.0.1 with its state under ``tmp_path`` (see the module's docstring)."""
    config = config or _configured(tmp_path, scheduler, server, backends)
    adapters = Adapters(inprocess)
    nvml = nvml if nvml is not None else FakeNvml(init_error=FakeNvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    app = await create_app(config, nvml=nvml, adapters=adapters)
    adapters.engine = app[SERVICES].registry._engine_adapter
    async with TestClient(ServeServer(app, config)) as client:
        if unix:
            await web.UnixSite(client.server.runner, str(config.server.socket_path)).start()
        yield Daemon(client, app, config, adapters)


@dataclasses.dataclass
class ThreadDaemon:
    """A daemon run by an event loop in a thread of its own, for clients that block."""

    daemon: Daemon
    loop: asyncio.AbstractEventLoop

    @property
    def url(self) -> str:
        return self.daemon.url

    @property
    def port(self) -> int:
        return self.daemon.port

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run ``coro`` on the daemon's loop and return what it returns (within ``timeout`` s)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


@contextlib.contextmanager
def daemon_in_thread(
    tmp_path: Path, *, setup: Callable[[Daemon], Coroutine[Any, Any, Any]] | None = None, **kw: Any
) -> Iterator[ThreadDaemon]:
    """``daemon(tmp_path, **kw)`` on its own loop in a thread; ``setup(d)`` runs there first."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="daemon", daemon=True)
    thread.start()
    running = daemon(tmp_path, **kw)

    def call(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(30)

    try:
        d = call(running.__aenter__())
        try:
            if setup is not None:
                call(setup(d))
            yield ThreadDaemon(d, loop)
        finally:
            call(running.__aexit__(None, None, None))
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


async def until(
    predicate: Callable[[], object], what: str = "the condition never held", timeout: float = 10.0
) -> float:
    """Wait until ``predicate()`` (or what it returns, awaited) is true; fail with ``what`` after ``timeout`` s.

    Returns the seconds it took."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return loop.time() - began
        assert loop.time() - began < timeout, f"{what} (waited {timeout:g} s)"
        await asyncio.sleep(0.02)
