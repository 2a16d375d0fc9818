"""``mr export`` and ``mr import`` on the daemon's side (and the web UI's Import page): the pool as data, and a
file's groups, users and backends applied all at once or not at all, the running registry and scheduler
brought in line with it.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..edge.services import SERVICES
from .aliases import apply_aliases
from .api import json_body, sync_users

__all__ = ["apply_import", "setup_transfer_routes"]


async def export_state(request: web.Request) -> web.Response:
    return web.json_response(request.app[SERVICES].store.export())


async def import_dry_run(request: web.Request) -> web.Response:
    """What an import would change, and nothing changed (a route of its own: a daemon without it answers 404)."""
    return web.json_response(await apply_import(request.app, await json_body(request), dry_run=True))


async def import_state(request: web.Request) -> web.Response:
    return web.json_response(await apply_import(request.app, await json_body(request)))


async def apply_import(app: web.Application, data: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    """Import groups, users and backends (the admin API and the web UI), all or nothing; what changed (with
    ``dry_run``: what would, and nothing changes)."""
    if dry_run:
        return dict(app[SERVICES].store.import_(data, dry_run=True))
    answer = app[SERVICES].store.import_(data)
    await app[SERVICES].registry.sync(app[SERVICES].store.list_backends())
    sync_users(app)
    apply_aliases(app)
    return dict(answer)


def setup_transfer_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/admin/export", export_state)
    r.add_post("/admin/import", import_state)
    r.add_post("/admin/import/dry-run", import_dry_run)
