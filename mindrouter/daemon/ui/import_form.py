"""The admin page that loads a pool from a file, as ``mr import`` does: paste what ``mr export`` wrote, see each
change it would make, then import it, all of it or nothing.

The file goes through the admin API's own import (``admin/transfer.py``), which checks every entry before it
writes anything, so the page and ``mr import`` refuse a file with the same sentence.
"""

from __future__ import annotations

import tomllib

from aiohttp import web

from ...store import StoreError, describe
from ..admin.transfer import apply_import
from .people_forms import field
from .render import admin_page, page
from .sessions import Session

__all__ = ["setup_import_form"]


@admin_page
async def import_page(request: web.Request, session: Session) -> web.StreamResponse:
    """GET: the form. POST: ``preview`` lists the changes and changes nothing; ``import`` makes them."""
    if request.method == "GET":
        return page(request, "import.html", session, text="", changes=None, done=False)
    form = await request.post()
    text = field(form, "file")
    done = field(form, "do") == "import"
    try:
        data = tomllib.loads(text)
        answer = await apply_import(request.app, data, dry_run=not done)
    except tomllib.TOMLDecodeError as exc:
        session.flash = ("error", f"that is not valid TOML ({exc}); paste a file written by `mr export`")
        return page(request, "import.html", session, 400, text=text, changes=None, done=False)
    except (StoreError, ValueError) as exc:
        session.flash = ("error", str(exc))
        return page(request, "import.html", session, 400, text=text, changes=None, done=False)
    changes = [describe(c) for c in answer.get("changes") or []]
    counts = ", ".join(f"{answer.get(k, 0)} {k}" for k in ("groups", "users", "backends"))
    verb = "imported" if done else "would import"
    session.flash = ("ok", f"{verb} {counts}; {len(changes) or 'no'} change{'s' if len(changes) != 1 else ''}")
    return page(request, "import.html", session, text="" if done else text, changes=changes, done=done)


def setup_import_form(app: web.Application) -> None:
    app.router.add_get("/ui/admin/import", import_page)
    app.router.add_post("/ui/admin/import", import_page)
