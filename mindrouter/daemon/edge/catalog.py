"""Routes that need no GPU: model lists, model facts and server facts, in both dialects.

They read the registry's probes and never touch the scheduler, so they answer
at once however busy the backends are. A model is listed once under
:func:`~mindrouter.backends.base.model_key` (``llama3.2`` and
``llama3.2:latest`` are one model), in the spelling most of its backends use.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from ... import __version__
from ...backends import model_key
from ...errors import RequestError
from ..edge.services import SERVICES
from ..pollers.entry import Entry
from .errorbodies import dialect_of, error_response

__all__ = ["OLLAMA_VERSION", "PoolModel", "pool_models", "setup_catalog_routes"]

OLLAMA_VERSION = "0.12.0"
"""What /api/version says: an Ollama release whose API mindrouter serves, so clients enable what it offers."""
_NO_DETAILS = {
    "parent_model": "",
    "format": "",
    "family": "",
    "families": None,
    "parameter_size": "",
    "quantization_level": "",
}
_MANAGEMENT = ("pull", "push", "create", "delete", "copy")


@dataclass(slots=True)
class PoolModel:
    """One model across the pool: the backends that serve it and how each spells it."""

    key: str
    on: list[tuple[Entry, str]] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The spelling most backends use; on a tie the one with a tag (``name:latest``)."""
        counts = Counter(spelling for _, spelling in self.on)
        return max(counts, key=lambda s: (counts[s], ":" in s, s))

    def loaded_on(self) -> list[tuple[Entry, str]]:
        return [(e, s) for e, s in self.on if e.probe is not None and s in e.probe.loaded_models]

    def details(self) -> dict[str, Any]:
        """The first backend's own entry for the model that has one with Ollama's fields."""
        found = [e.probe.details.get(s, {}) for e, s in self.on if e.probe is not None]
        return next((d for d in found if "digest" in d), found[0] if found else {})

    def capabilities(self) -> list[str]:
        caps = {c for e, s in self.on if e.probe is not None for c in e.probe.capabilities.get(s, ())}
        return sorted(caps or {"completion"})


def pool_models(app: web.Application) -> dict[str, PoolModel]:
    """Every model a backend that is not disabled has reported, by model key."""
    models: dict[str, PoolModel] = {}
    for entry in app[SERVICES].registry.entries.values():
        if entry.probe is None or entry.row.state == "disabled":
            continue
        for spelling in entry.probe.models:
            key = model_key(spelling)
            models.setdefault(key, PoolModel(key)).on.append((entry, spelling))
    return dict(sorted(models.items()))


def _find(app: web.Application, name: Any, dialect: str) -> PoolModel:
    model = pool_models(app).get(model_key(name)) if isinstance(name, str) and name else None
    if model is None:
        what = "`GET /v1/models`" if dialect == "openai" else "`GET /api/tags` (`ollama list`)"
        raise RequestError(
            f"model {name!r} is not served by any backend; {what} lists the models you can use",
            status=404,
            type="not_found_error",
            code="model_not_found",
        )
    return model


def _timestamp(value: Any) -> str:
    """An Ollama timestamp from a backend's (Ollama string or OpenAI epoch seconds), or now."""
    if isinstance(value, str) and value:
        return value
    when = datetime.fromtimestamp(value, UTC) if isinstance(value, int) and value > 0 else datetime.now(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(value: Any) -> int:
    """OpenAI's ``created`` (epoch seconds) from a backend's, or now."""
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, str):
        try:
            return int(datetime.fromisoformat(value.replace("Z", "+00:00")[:26]).timestamp())
        except ValueError:
            pass
    return int(datetime.now(UTC).timestamp())


def _tagged(name: str) -> str:
    """Ollama spells every model ``name:tag``, and its clients (Open WebUI) look models up so."""
    return name if ":" in name else f"{name}:latest"


def _ollama_entry(model: PoolModel) -> dict[str, Any]:
    d = model.details()
    name = _tagged(model.name)
    return {
        "name": name,
        "model": name,
        "modified_at": _timestamp(d.get("modified_at", d.get("created"))),
        "size": d.get("size") if isinstance(d.get("size"), int) else 0,
        "digest": d.get("digest") or hashlib.sha256(name.encode()).hexdigest(),
        "details": d.get("details") if isinstance(d.get("details"), dict) else dict(_NO_DETAILS),
    }


def _openai_entry(model: PoolModel) -> dict[str, Any]:
    d = model.details()
    return {
        "id": model.name,
        "object": "model",
        "created": _epoch(d.get("created", d.get("modified_at"))),
        "owned_by": "mindrouter",
    }


def _authenticate(request: web.Request) -> None:
    """The catalog answers the daemon's users only.

    Raises:
        RequestError: 401 when the caller's key is missing or unknown.
    """
    request.app[SERVICES].auth.caller(request.headers.get("Authorization"))


async def handle_openai_models(request: web.Request) -> web.Response:
    _authenticate(request)
    data = [_openai_entry(m) for m in pool_models(request.app).values()]
    return web.json_response({"object": "list", "data": data})


async def handle_openai_model(request: web.Request) -> web.Response:
    _authenticate(request)
    return web.json_response(_openai_entry(_find(request.app, request.match_info["model"], "openai")))


async def handle_ollama_tags(request: web.Request) -> web.Response:
    _authenticate(request)
    return web.json_response({"models": [_ollama_entry(m) for m in pool_models(request.app).values()]})


async def handle_ollama_ps(request: web.Request) -> web.Response:
    _authenticate(request)
    forever = _timestamp(int((datetime.now(UTC) + timedelta(days=3650)).timestamp()))
    out = []
    for model in pool_models(request.app).values():
        loaded = model.loaded_on()
        if not loaded:
            continue
        entry = _ollama_entry(model)
        found = [e.probe.details.get(s, {}) for e, s in loaded if e.probe is not None]
        vram = sum(e.probe.loaded_vram.get(s, 0) for e, s in loaded if e.probe is not None)
        expires = [d["expires_at"] for d in found if isinstance(d.get("expires_at"), str)]
        entry.update(
            size=max(entry["size"], vram),
            size_vram=vram,
            expires_at=max(expires) if expires else forever,  # OpenAI-family engines keep their model loaded
            backends=sorted(e.row.name for e, _ in loaded),
        )
        out.append(entry)
    return web.json_response({"models": out})


async def handle_ollama_show(request: web.Request) -> web.Response:
    """Ask an Ollama backend that has the model, and add what mindrouter knows; otherwise say what it knows."""
    _authenticate(request)
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise RequestError('send a JSON object such as {"model": "llama3.2"}')
    model = _find(request.app, body.get("model") or body.get("name"), "ollama")
    info: dict[str, Any] = {}
    for entry, spelling in model.on:
        if entry.adapter.family == "ollama":
            reply = await entry.adapter.get("/api/show", method="POST", json_body={**body, "model": spelling})
            shown = reply.json() if reply.ok else None
            if isinstance(shown, dict):
                info = shown
                break
    d = model.details()
    info.setdefault("modelfile", "")
    info.setdefault("parameters", "")
    info.setdefault("template", "")
    info.setdefault("details", _ollama_entry(model)["details"])
    info.setdefault("modified_at", _ollama_entry(model)["modified_at"])
    model_info = info.setdefault("model_info", {})
    context = d.get("max_model_len")
    if isinstance(context, int) and not any(k.endswith(".context_length") for k in model_info):
        model_info.setdefault("general.architecture", "unknown")
        model_info[f"{model_info['general.architecture']}.context_length"] = context
        if "num_ctx" not in info["parameters"]:  # Continue reads the context length from here
            info["parameters"] = f"{info['parameters']}\nnum_ctx {context}".strip()
    info["capabilities"] = sorted(set(info.get("capabilities") or ()) | set(model.capabilities()))
    info["backends"] = sorted(e.row.name for e, _ in model.on)
    return web.json_response(info)


async def handle_ollama_version(request: web.Request) -> web.Response:
    _authenticate(request)
    return web.json_response({"version": OLLAMA_VERSION, "mindrouter": __version__})


_ROOT_PAGE = (
    '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>mindrouter</title></head><body>'
    "<p>Ollama is running: this is mindrouter, an OpenAI- and Ollama-compatible endpoint shared fairly.</p>"
    '<p>Your share, queue and usage, and for admins the pool: <a href="/ui/">the web UI</a>.</p></body></html>'
)


async def handle_root(request: web.Request) -> web.Response:
    """What Ollama answers on /, which health checks and the ``ollama`` CLI probe for; a browser (which asks
    for HTML) gets the same sentence with a link to the web UI."""
    if "text/html" in request.headers.get("Accept", ""):
        return web.Response(text=_ROOT_PAGE, content_type="text/html")
    return web.Response(text="Ollama is running")


async def handle_management(request: web.Request) -> web.Response:
    _authenticate(request)
    raise RequestError(
        f"{request.method} {request.path} is not offered: mindrouter does not manage models; pull, create, copy "
        "and delete them on the backend servers (for example `ollama pull NAME` on the GPU host), and "
        "`ollama list` here shows what the pool serves",
        status=403,
        type="permission_error",
        code="model_management_unsupported",
    )


def _guard(handler: Any) -> Any:
    """Turn a RequestError from a no-GPU handler into the dialect's error body."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except RequestError as exc:
            return error_response(exc, dialect_of(request.path))

    return wrapped


def setup_catalog_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/", handle_root)  # GET also answers HEAD
    r.add_get("/v1/models", _guard(handle_openai_models))
    r.add_get("/v1/models/{model:.+}", _guard(handle_openai_model))
    r.add_get("/api/tags", _guard(handle_ollama_tags))
    r.add_get("/api/ps", _guard(handle_ollama_ps))
    r.add_post("/api/show", _guard(handle_ollama_show))
    r.add_get("/api/version", _guard(handle_ollama_version))
    for action in _MANAGEMENT:
        r.add_route("DELETE" if action == "delete" else "POST", f"/api/{action}", _guard(handle_management))
    r.add_route("*", "/api/blobs/{digest}", _guard(handle_management))
