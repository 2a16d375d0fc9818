"""Templates and the answers every page shares: HTML with strict security headers, redirects, the access checks.

Jinja2 and the templates load when the first page is rendered, not when the
daemon starts: a router that nobody opens ``/ui/`` on never holds them
(about 4 MB of the fixed memory issue 20's memory target counts).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from aiohttp import web

from ...formats import fmt_duration
from ...localtime import iso_local
from ...names import hash_key
from ...store import StoreError
from ..edge.services import SERVICES
from .sessions import Session, Sessions, same

if TYPE_CHECKING:
    import jinja2
    from markupsafe import Markup

__all__ = ["ADMIN_GROUP", "SESSIONS", "action", "admin_page", "page", "person_page", "redirect"]

ADMIN_GROUP = "admin"
"""Members of this group who log in with their own key get the admin pages."""

SESSIONS = web.AppKey("ui_sessions", Sessions)


@functools.cache
def templates() -> jinja2.Environment:
    """The pages' templates, made on first use."""
    import jinja2  # here, not at the top: the daemon starts without it

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("mindrouter.daemon.ui", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = lambda at: iso_local(at)[:16].replace("T", " ")
    env.filters["duration"] = fmt_duration
    env.filters["sentence"] = sentence
    return env


def sentence(text: object) -> Markup:
    """A sentence for a person, escaped, its `mr ...` commands in ``<code>`` (the CLI's sentences are Markdown-ish;
    the UI printed their backticks)."""
    from markupsafe import Markup, escape

    return Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", str(escape(str(text)))))


HEADERS = {
    # Our own stylesheet only, no script at all (live pages use a meta refresh), no framing, no referrer elsewhere.
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

Handler = Callable[[web.Request, Session], Awaitable[web.StreamResponse]]


def page(
    request: web.Request, template: str, session: Session | None, status: int = 200, **context: Any
) -> web.Response:
    flash = session.flash if session else None
    if session:
        session.flash = None
    updated = time.strftime("%H:%M:%S")
    html = (
        templates()
        .get_template(template)
        .render(session=session, path=request.path, flash=flash, updated=updated, **context)
    )
    return web.Response(text=html, status=status, content_type="text/html", headers=HEADERS)


def redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={**HEADERS, "Location": location})


def _checked(admin: bool) -> Callable[[Handler], Callable[[web.Request], Awaitable[web.StreamResponse]]]:
    def wrap(handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        @functools.wraps(handler)
        async def checked(request: web.Request) -> web.StreamResponse:
            session = request.app[SESSIONS].get(request)
            if session is None or not _still_valid(request, session):
                return redirect("/ui/login")
            if admin and not session.admin:
                return page(
                    request, "error.html", session, 403, message="This page is for admins; log in with an admin key."
                )
            if request.method == "POST":
                token = (await request.post()).get("csrf")
                if not (isinstance(token, str) and same(token, session.csrf)):
                    message = "The form expired; reload the page and try again."
                    return page(request, "error.html", session, 403, message=message)
            return await handler(request, session)

        return checked

    return wrap


person_page = _checked(admin=False)
admin_page = _checked(admin=True)


def action(back: str) -> Callable[[Callable[[web.Request, Session], Awaitable[str]]], Handler]:
    """An admin form's POST: run it, then show its outcome (or the admin API's error sentence) on the page ``back``.

    ``back`` is a path with the route's ``{name}`` in it, such as ``/ui/admin/users/{name}``.
    """

    def wrap(handler: Callable[[web.Request, Session], Awaitable[str]]) -> Handler:
        @functools.wraps(handler)
        async def run(request: web.Request, session: Session) -> web.StreamResponse:
            try:
                session.flash = ("ok", await handler(request, session))
            except (StoreError, ValueError) as exc:  # the store's and validators' errors: one sentence to act on
                session.flash = ("error", str(exc))
            return redirect(back.format(name=quote(request.match_info.get("name", ""), safe="")))

        return run

    return wrap


def _still_valid(request: web.Request, session: Session) -> bool:
    """The session's key is still the admin key or a live key of its user (revoked keys end their sessions)."""
    if session.user is None:
        admin_key = request.app[SERVICES].config.server.admin_key
        return bool(admin_key) and same(hash_key(admin_key), session.key_hash)
    found = request.app[SERVICES].store.key_owner(session.key_hash)
    if found is None or found[1].name != session.user:
        return False
    session.admin = found[1].group == ADMIN_GROUP  # moving someone out of the admin group ends their admin pages
    return True
