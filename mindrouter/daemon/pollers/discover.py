"""First start: find inference servers already running on this machine."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp

from ...store import Store

__all__ = ["CANDIDATES", "discover_local_backends"]

log = logging.getLogger(__name__)

#: (name, url, engine, path that answers when such a server is there)
CANDIDATES = (
    ("local-ollama", "http://127.0.0.1:11434", "ollama", "/api/tags"),
    ("local-8000", "http://127.0.0.1:8000", "openai", "/v1/models"),
    ("local-8080", "http://127.0.0.1:8080", "openai", "/v1/models"),
)


async def _answers(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=1.5), allow_redirects=False) as response:
            return response.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False


async def discover_local_backends(
    session: aiohttp.ClientSession, store: Store, candidates: tuple[tuple[str, str, str, str], ...] = CANDIDATES
) -> list[Any]:
    """Add each candidate that answers and is not in the pool already; returns the rows added."""
    fresh = [c for c in candidates if store.backend_at(c[1]) is None]
    found = await asyncio.gather(*(_answers(session, url + path) for _, url, _, path in fresh))
    rows = []
    for (name, url, engine, _), ok in zip(fresh, found, strict=False):
        if ok and store.backend_at(url) is None:  # one server, one backend (names.same_server)
            rows.append(store.add_backend(name, url, engine))
    if not rows:
        log.info(
            "no backend configured and none found on this machine; "
            "add one with `mr backend add NAME URL --engine ollama`"
        )
    return rows
