"""Model aliases in the admin API: ``GET /admin/models/aliases``, ``PUT`` and ``DELETE .../{name}``.

An alias takes effect at once: every backend's models are keyed again (``model_key``), so a vLLM
server listing ``meta-llama/Llama-3.1-8B-Instruct`` joins the pool of ``llama3.1:8b``, and each
request goes to a backend under the name that backend lists.
"""

from __future__ import annotations

import json

from aiohttp import web

from ...backends import set_aliases
from ...store import InvalidValue
from ..edge.services import SERVICES

__all__ = ["apply_aliases", "setup_alias_routes"]


def apply_aliases(app: web.Application) -> None:
    """Make the stored aliases the pool's: key every backend's models again and tell the core."""
    set_aliases(app[SERVICES].store.list_aliases())
    registry = app[SERVICES].registry
    for entry in registry.entries.values():
        entry.adapter.respell()
    registry.republish_all()
    app[SERVICES].dispatcher.pump()


def _rows(app: web.Application) -> list[dict[str, str]]:
    return [{"name": name, "target": target} for name, target in app[SERVICES].store.list_aliases().items()]


async def list_aliases(request: web.Request) -> web.Response:
    return web.json_response(_rows(request.app))


async def set_alias(request: web.Request) -> web.Response:
    try:
        data = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidValue("the request body is not valid JSON") from None
    if not isinstance(data, dict) or set(data) != {"target"}:
        raise InvalidValue('the request body must be {"target": MODEL}: the model the alias names')
    name, target = request.app[SERVICES].store.set_alias(request.match_info["name"], data["target"])
    apply_aliases(request.app)
    return web.json_response({"name": name, "target": target})


async def remove_alias(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    request.app[SERVICES].store.remove_alias(name)
    apply_aliases(request.app)
    return web.json_response({"removed": name})


def setup_alias_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/admin/models/aliases", list_aliases)
    r.add_put("/admin/models/aliases/{name:.+}", set_alias)
    r.add_delete("/admin/models/aliases/{name:.+}", remove_alias)
