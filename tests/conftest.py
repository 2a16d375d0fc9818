"""Shared fixtures: the ``daemon`` fixture and ``until`` (both from tests/harness.py), fakes, GPUs, profiles."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

from .fake_nvml import FakeNvml
from .fakes import fake_llamacpp, fake_ollama, fake_openai, fake_vllm  # noqa: F401 (fixtures)
from .harness import ADMIN_KEY, Daemon, ServeServer, daemon_config, until
from .harness import daemon as start_daemon
from .pg import PgCluster
from .pg import pg_cluster as start_pg_cluster

__all__ = ["ADMIN_KEY", "SEED_RECORD_KEYS", "Daemon", "ServeServer", "ServedDaemon", "daemon_config", "until"]

hypothesis_settings.register_profile("mindrouter", max_examples=300)
hypothesis_settings.register_profile("fuzz", max_examples=1500)
hypothesis_settings.load_profile("mindrouter")
"""The HTTP fuzz tests (tests/test_bad_input.py) take their example count from the profile: 300 in the
default run, 1,500 with ``--hypothesis-profile=fuzz`` (CI runs that file so); tests that name a count keep it."""

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

SUITE_TIMEOUTS = {"postgres": 120, "soak": 600, "real": 900, "shares": 180, "timing": 180, "browser": 180}
"""Seconds a test of each marked suite may take (pyproject's ``timeout`` is for the default run's tests)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("timeout") is None:
            limits = [SUITE_TIMEOUTS[m.name] for m in item.iter_markers() if m.name in SUITE_TIMEOUTS]
            if limits:
                item.add_marker(pytest.mark.timeout(max(limits)))


ServedDaemon = Daemon
"""What ``serve_daemon`` yields (the harness's Daemon, with ``key`` set)."""


@contextlib.asynccontextmanager
async def serve_daemon(
    tmp_path: Path,
    fake_url: str,
    engine: str,
    *,
    max_concurrent: int = 1,
    scheduler: dict[str, Any] | None = None,
    **server: Any,
) -> AsyncIterator[Daemon]:
    """A daemon whose one backend "gpu" (``max_concurrent`` slots) is ``fake_url``, with user "ann" (key ``key``).

    Kept for tests written against it; new tests use ``harness.daemon`` and its helpers directly."""
    async with start_daemon(tmp_path, scheduler=scheduler, server=server) as d:
        await d.backend("gpu", fake_url, engine, max_concurrent=max_concurrent)
        d.key = await d.user("ann")
        yield d


@pytest.fixture
def nvml() -> FakeNvml:
    """No NVIDIA driver, unless a test swaps in GPUs."""
    return FakeNvml(init_error=FakeNvml.NVML_ERROR_LIBRARY_NOT_FOUND)


@pytest.fixture
async def daemon(tmp_path: Path, nvml: FakeNvml) -> AsyncIterator[Daemon]:
    """``harness.daemon(tmp_path, nvml=nvml)``: a daemon with no backend and no user yet."""
    async with start_daemon(tmp_path, nvml=nvml) as d:
        yield d


@pytest.fixture
async def new_daemon(tmp_path: Path, nvml: FakeNvml) -> AsyncIterator[Callable[..., Awaitable[Daemon]]]:
    """``await new_daemon(**kw)``: ``harness.daemon(tmp_path, nvml=nvml, **kw)``, stopped when the test ends.

    Each call starts a daemon on the same state (``tmp_path``) unless ``tmp_path=`` says otherwise:
    close one (``await d.client.close()``) and start another to restart it."""
    async with contextlib.AsyncExitStack() as running:

        async def start(**kw: Any) -> Daemon:
            kw.setdefault("nvml", nvml)
            return await running.enter_async_context(start_daemon(kw.pop("tmp_path", tmp_path), **kw))

        yield start


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """One throwaway PostgreSQL for the session's ``postgres`` tests (tests/pg.py); skips without one."""
    with start_pg_cluster() as cluster:
        yield cluster


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> str:
    """The url of a fresh, empty database on the session's PostgreSQL."""
    return pg_cluster.new_database()
