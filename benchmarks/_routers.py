"""The baselines of bench_pool.py: round-robin, least-busy and cache-aware proxies, small and in-process.

What a lab gets from a generic load balancer in front of its Ollamas: each
proxy learns which workstation has which model (``/api/tags``, once), then
sends every request, bytes unchanged, to one of those: the next in turn
(round-robin, per model), or the one with the fewest requests in flight from
this proxy (least-busy, ties broken by a seeded coin, as LiteLLM's
least-busy strategy does). Neither knows VRAM, loads or speeds.

cache-aware is SGLang's router (``sgl-router --policy cache_aware``): per
worker, the prefixes it was sent (SGLang's approximate radix tree, here a
chat's messages hashed in a chain as mindrouter hashes them,
``scheduler/prefix.py``, bounded least recently used first). Where the load
is unbalanced (most in flight - least > ``BALANCE_ABS`` and most > least x
``BALANCE_REL``) it sends to the least busy; else to the worker holding the
largest part of the prompt if that part is over ``CACHE_THRESHOLD``, else to
the worker whose tree is smallest (the most room). SGLang's defaults.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Mapping

import aiohttp
from aiohttp import web

from mindrouter.scheduler import Prefix, message_chain

POLICIES = ("round-robin", "least-busy", "cache-aware")
CACHE_THRESHOLD = 0.3
BALANCE_ABS, BALANCE_REL = 32, 1.5
TREE_BLOCKS = 1 << 16
"""Blocks each worker's tree keeps (SGLang bounds its tree by characters; evicts least recently used)."""


def known(models: Mapping[str, object], model: str) -> str | None:
    """The name ``models`` knows ``model`` by: as asked, or with Ollama's implied ``:latest``."""
    return next((name for name in (model, f"{model}:latest") if name in models), None)


class Picker:
    """Which backend gets the next request for a model."""

    def __init__(self, policy: str, models: dict[str, list[str]], seed: int = 0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
        self.policy, self.models = policy, models
        self.in_flight = {url: 0 for urls in models.values() for url in urls}
        self._turns: dict[str, Iterator[str]] = {m: itertools.cycle(urls) for m, urls in models.items()}
        self._rng = random.Random(seed)
        self.trees: dict[str, OrderedDict[int, None]] = {url: OrderedDict() for url in self.in_flight}

    def pick(self, model: str, prefix: Prefix = ()) -> str | None:
        name = known(self.models, model)
        if name is None or not self.models[name]:
            return None
        urls = self.models[name]
        if self.policy == "round-robin":
            return next(self._turns[name])
        loads = [self.in_flight[u] for u in urls]
        least, most = min(loads), max(loads)
        if self.policy == "cache-aware" and prefix:
            balanced = not (most - least > BALANCE_ABS and most > least * BALANCE_REL)
            url = self._cached(urls, prefix) if balanced else None
            if url is None and balanced:
                url = min(urls, key=lambda u: len(self.trees[u]))
            if url is not None:
                self._insert(url, prefix)
                return url
        url = self._rng.choice([u for u in urls if self.in_flight[u] == least])
        if prefix:
            self._insert(url, prefix)
        return url

    def _cached(self, urls: list[str], prefix: Prefix) -> str | None:
        """The worker holding the largest part of ``prefix``, if over ``CACHE_THRESHOLD`` of it."""
        best, rate = None, CACHE_THRESHOLD
        for url in urls:
            tree = self.trees[url]
            held = next((tokens for h, tokens in reversed(prefix) if h in tree), 0)
            if held / prefix[-1][1] > rate:
                best, rate = url, held / prefix[-1][1]
        return best

    def _insert(self, url: str, prefix: Prefix) -> None:
        tree = self.trees[url]
        for h, _ in reversed(prefix):  # the first block last: the most recent, so a prefix outlives its tails
            tree[h] = None
            tree.move_to_end(h)
        while len(tree) > TREE_BLOCKS:
            tree.popitem(last=False)


async def learn_models(
    session: aiohttp.ClientSession, backends: list[str], aliases: Mapping[str, str] | None = None
) -> dict[str, dict[str, str]]:
    """Model name -> {backend: the name its ``/api/tags`` lists the model under}.

    ``aliases`` maps another name to the model's (a vLLM server's Hugging Face id to Ollama's tag), as a
    LiteLLM ``model_list`` or ``mr model alias`` says that both are one model."""
    models: dict[str, dict[str, str]] = {}
    for url in backends:
        async with session.get(f"{url}/api/tags") as r:
            for entry in (await r.json())["models"]:
                name = entry["name"]
                models.setdefault((aliases or {}).get(name, name), {})[url] = name
    return models


def create_router(policy: str, models: dict[str, dict[str, str]], seed: int = 0) -> web.Application:
    """The proxy app: every POST path goes to the picked backend's same path, the body unchanged but for
    the model's name where that backend lists the model under another."""
    picker = Picker(policy, {m: list(urls) for m, urls in models.items()}, seed)
    session_key = web.AppKey("session", aiohttp.ClientSession)

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        app[session_key] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        yield
        await app[session_key].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        parsed = json.loads(body)
        messages = parsed.get("messages")
        url = picker.pick(str(parsed.get("model", "")), message_chain(messages) if isinstance(messages, list) else ())
        if url is None:
            return web.json_response({"error": {"message": "unknown model", "type": "not_found_error"}}, status=404)
        name = known(models, str(parsed["model"]))
        if name is not None and models[name][url] != name:  # this backend lists the model under another name
            parsed["model"] = models[name][url]
            body = json.dumps(parsed).encode()
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
