"""Routes that need no GPU: model lists and server facts, in both dialects.

They read the registry's probes and never touch the scheduler, so they answer
at once however busy the backends are.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .. import __version__
from ..errors import RequestError
from .keys import AUTH, REGISTRY
from .responses import dialect_of, error_response

__all__ = ["setup_catalog_routes"]


def _all_models(app: web.Application) -> dict[str, list[Any]]:
    models: dict[str, list[Any]] = {}
    registry = app[REGISTRY]
    for entry in registry.entries.values():
        if entry.probe is None or entry.row.state == "disabled":
            continue
        for model in entry.probe.models:
            models.setdefault(model, []).append(entry)
    return models


async def handle_openai_models(request: web.Request) -> web.Response:
    request.app[AUTH].caller(request.headers.get("Authorization"))
    data = [
        {"id": m, "object": "model", "created": 0, "owned_by": "mindrouter"} for m in sorted(_all_models(request.app))
    ]
    return web.json_response({"object": "list", "data": data})


async def handle_ollama_tags(request: web.Request) -> web.Response:
    request.app[AUTH].caller(request.headers.get("Authorization"))
    out = []
    for model, entries in sorted(_all_models(request.app).items()):
        size = next((e.probe.model_sizes.get(model) for e in entries if e.probe.model_sizes.get(model)), 0)
        out.append(
            {
                "name": model,
                "model": model,
                "modified_at": "1970-01-01T00:00:00Z",
                "size": size or 0,
                "digest": "",
                "details": {},
            }
        )
    return web.json_response({"models": out})


async def handle_ollama_ps(request: web.Request) -> web.Response:
    request.app[AUTH].caller(request.headers.get("Authorization"))
    out = []
    for entry in request.app[REGISTRY].entries.values():
        probe = entry.probe
        if probe is None:
            continue
        for model in sorted(probe.loaded_models):
            vram = probe.loaded_vram.get(model, 0)
            out.append(
                {
                    "name": model,
                    "model": model,
                    "size": vram,
                    "size_vram": vram,
                    "digest": "",
                    "details": {},
                    "expires_at": "0001-01-01T00:00:00Z",
                    "backend": entry.row.name,
                }
            )
    return web.json_response({"models": out})


async def handle_ollama_version(request: web.Request) -> web.Response:
    return web.json_response({"version": __version__})


def _guard(handler: Any) -> Any:
    """Turn a RequestError from a no-GPU handler into the dialect's error body."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except RequestError as exc:
            return error_response(exc, dialect_of(request.path))

    return wrapped


def setup_catalog_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", _guard(handle_openai_models))
    app.router.add_get("/api/tags", _guard(handle_ollama_tags))
    app.router.add_get("/api/ps", _guard(handle_ollama_ps))
    app.router.add_get("/api/version", handle_ollama_version)
