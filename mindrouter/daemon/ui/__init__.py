"""The web UI under ``/ui/`` (docs/web.md): people see their own share, queue and usage; admins manage the pool.

Pages are rendered on the server with Jinja2 from the same snapshots and
functions as the admin API; the only assets are one stylesheet shipped in the
package, so it works offline and needs no build step.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from ..edge.services import SERVICES
from .admin import setup_admin_pages
from .login import setup_login_routes
from .render import SESSIONS
from .sessions import Sessions

__all__ = ["setup_ui"]


def setup_ui(app: web.Application) -> None:
    app[SESSIONS] = Sessions(app[SERVICES].store)
    setup_login_routes(app)
    setup_admin_pages(app)
    app.router.add_static("/ui/static/", Path(__file__).parent / "static", append_version=False)
