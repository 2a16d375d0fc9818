"""Logging in with an API key, logging out, and a person's own page (``/ui/me``).

Anyone logs in with their API key and sees only their own share, queue and
usage (the same figures as ``GET /v1/me``). A member of the admin group, or
whoever holds ``[server] admin_key``, also gets the admin pages.
"""

from __future__ import annotations

import secrets
from typing import Any

from aiohttp import web

from ...names import hash_key
from ..admin.watch import backend_names
from ..edge.accounting import me_dict
from ..edge.auth import Caller
from ..edge.services import SERVICES
from .render import ADMIN_GROUP, SESSIONS, page, person_page, redirect
from .sessions import LOGIN_COOKIE, Session, same, set_cookie

__all__ = ["setup_login_routes"]

LOGIN_FAILED = "That key is not valid; ask an admin for a new one (`mr user key NAME`)."


async def index(request: web.Request) -> web.StreamResponse:
    session = request.app[SESSIONS].get(request)
    if session is None:
        return redirect("/ui/login")
    return redirect("/ui/me" if session.user else "/ui/admin/top")


async def login_form(request: web.Request, *, error: str | None = None, status: int = 200) -> web.Response:
    token = secrets.token_urlsafe(24)
    response = page(request, "login.html", None, status, login_csrf=token, error=error)
    set_cookie(response, request, LOGIN_COOKIE, token, 3600)
    return response


async def login(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    key, csrf = form.get("key"), form.get("csrf")
    if not (isinstance(csrf, str) and same(csrf, request.cookies.get(LOGIN_COOKIE, ""))):
        return await login_form(request, error="The form expired; try again.", status=403)
    key = key.strip() if isinstance(key, str) else ""
    guesses = request.app[SERVICES].auth.guesses
    refusal = guesses.refusal(request.remote)
    if refusal is not None:
        response = await login_form(request, error=refusal.message, status=429)
        response.headers["Retry-After"] = f"{refusal.retry_after:.0f}"
        return response
    user, admin = None, False
    admin_key = request.app[SERVICES].config.server.admin_key
    if key and admin_key and same(key, admin_key):
        admin = True
    else:
        found = request.app[SERVICES].store.key_owner(hash_key(key)) if key else None
        if found is None:
            guesses.wrong(request.remote)
            return await login_form(request, error=LOGIN_FAILED, status=401)
        user, admin = found[1].name, found[1].group == ADMIN_GROUP
    response = redirect("/ui/me" if user else "/ui/admin/top")
    request.app[SESSIONS].open(response, request, user, admin, hash_key(key))
    response.del_cookie(LOGIN_COOKIE, path="/ui/")
    return response


@person_page
async def logout(request: web.Request, session: Session) -> web.StreamResponse:
    response = redirect("/ui/login")
    request.app[SESSIONS].close(request, response)
    return response


@person_page
async def me(request: web.Request, session: Session) -> web.StreamResponse:
    if session.user is None:
        return redirect("/ui/admin/top")
    app = request.app
    user = app[SERVICES].store.get_user(session.user)
    caller = Caller(user.id, user.name, user.group, user.weight_override, user.group_weight)
    return page(
        request,
        "me.html",
        session,
        me=await me_dict(app, caller),
        weight=user.weight,
        jobs=_jobs(app, user.id),
        names=backend_names(app),
        refresh=True,
    )


def _jobs(app: web.Application, user_id: int) -> list[dict[str, Any]]:
    """This person's requests now: running (where) and queued (their place among their own, the queue's length)."""
    scheduler, registry = app[SERVICES].scheduler, app[SERVICES].registry
    now = app[SERVICES].dispatcher.clock()
    rows = []
    for job, backend_id in scheduler.running_jobs():
        if job.user_id == user_id:
            entry = registry.entries.get(backend_id) if isinstance(backend_id, int) else None
            where = entry.row.name if entry else f"#{backend_id}"
            rows.append(
                {"id": job.id, "model": job.model, "state": f"running on {where}", "since": now - job.submitted_at}
            )
    for job in scheduler.queued_jobs():
        if job.user_id == user_id:
            place = scheduler.queue_position(job.id)
            state = "queued" if place is None else f"queued: {place[0]} of yours next, {place[1]} waiting in all"
            rows.append({"id": job.id, "model": job.model, "state": state, "since": now - job.submitted_at})
    return rows


def setup_login_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/ui", index)
    r.add_get("/ui/", index)
    r.add_get("/ui/login", login_form)
    r.add_post("/ui/login", login)
    r.add_post("/ui/logout", logout)
    r.add_get("/ui/me", me)
