"""The baselines of bench_pool.py: round-robin and least-busy proxies, small and in-process.

What a lab gets from a generic load balancer in front of its Ollamas: each
proxy learns which workstation has which model (``/api/tags``, once), then
sends every request, bytes unchanged, to one of those: the next in turn
(round-robin, per model), or the one with the fewest requests in flight from
this proxy (least-busy, ties broken by a seeded coin, as LiteLLM's
least-busy strategy does). Neither knows VRAM, loads or speeds.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import AsyncIterator, Iterator

import aiohttp
from aiohttp import web

POLICIES = ("round-robin", "least-busy")


class Picker:
    """Which backend gets the next request for a model."""

    def __init__(self, policy: str, models: dict[str, list[str]], seed: int = 0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
        self.policy, self.models = policy, models
        self.in_flight = {url: 0 for urls in models.values() for url in urls}
        self._turns: dict[str, Iterator[str]] = {m: itertools.cycle(urls) for m, urls in models.items()}
        self._rng = random.Random(seed)

    def pick(self, model: str) -> str | None:
        urls = self.models.get(model) or self.models.get(f"{model}:latest")
        if not urls:
            return None
        if self.policy == "round-robin":
            return next(self._turns[model if model in self.models else f"{model}:latest"])
        least = min(self.in_flight[u] for u in urls)
        return self._rng.choice([u for u in urls if self.in_flight[u] == least])


async def learn_models(session: aiohttp.ClientSession, backends: list[str]) -> dict[str, list[str]]:
    """Model name -> the backends whose ``/api/tags`` lists it."""
    models: dict[str, list[str]] = {}
    for url in backends:
        async with session.get(f"{url}/api/tags") as r:
            for entry in (await r.json())["models"]:
                models.setdefault(entry["name"], []).append(url)
    return models


def create_router(policy: str, models: dict[str, list[str]], seed: int = 0) -> web.Application:
    """The proxy app: every POST path goes, body unchanged, to the picked backend's same path."""
    picker = Picker(policy, models, seed)
    session_key = web.AppKey("session", aiohttp.ClientSession)

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        app[session_key] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        yield
        await app[session_key].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        url = picker.pick(str(json.loads(body).get("model", "")))
        if url is None:
            return web.json_response({"error": {"message": "unknown model", "type": "not_found_error"}}, status=404)
        picker.in_flight[url] += 1
        try:
            async with request.app[session_key].post(
                url + request.path, data=body, headers={"Content-Type": "application/json"}
            ) as up:
                resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.content_type})
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except ConnectionResetError:  # the client left
            return web.Response(status=499)
        finally:
            picker.in_flight[url] -= 1

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.cleanup_ctx.append(session_ctx)
    app.router.add_post("/{path:.*}", forward)
    return app
