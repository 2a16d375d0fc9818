"""The admin pages' forms for backends: add one, change its settings in place, drain (asking first when it is
the last backend of a model), enable, and remove after a confirmation.

Each goes through the admin API's own function (``daemon/admin/api.py``, ``daemon/admin/backend_edits.py``),
so a form and ``mr backend`` validate alike and fail with the same sentence.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from aiohttp import web

from ...names import ENGINES
from ...store import StoreError
from ..admin import api
from ..admin.backend_edits import SETTABLE, change_backend, models_left_without
from ..admin.watch import backend_names
from ..edge.services import SERVICES
from .people_forms import confirm, field
from .render import action, admin_page, page, redirect
from .sessions import Session

__all__ = ["setup_backend_forms"]

_WHOLE = ("max_concurrent", "parallel", "max_loaded")


def _value(key: str, raw: str) -> Any:
    """A form's text as the admin API's JSON would carry it; what cannot be read goes on as text, to be refused."""
    if key in _WHOLE:
        return int(raw) if raw.isdigit() else raw
    if key == "gpus":
        parts = [p.strip() for p in raw.split(",")]
        return [int(p) if p.isdigit() else p for p in parts]
    if key == "priority":
        try:
            return float(raw)
        except ValueError:
            return raw
    return raw


def _settings(form: Any, *, clear: bool) -> dict[str, Any]:
    """The settings a form gives; a blank one is left out, or (``clear``, editing) cleared where it can be."""
    out: dict[str, Any] = {}
    for key in SETTABLE:
        raw = field(form, key)
        if raw:
            out[key] = _value(key, raw)
        elif clear and key in ("parallel", "max_loaded", "gpus", "node"):
            out[key] = None
    return out


def _rows(request: web.Request) -> list[dict[str, Any]]:
    registry = request.app[SERVICES].registry
    return [registry.row_dict(e) for e in registry.entries.values()]


@admin_page
async def backends(request: web.Request, session: Session) -> web.StreamResponse:
    return page(request, "backends.html", session, backends=_rows(request), engines=ENGINES)


@admin_page
@action("/ui/admin/backends")
async def add_backend(request: web.Request, session: Session) -> str:
    form = await request.post()
    data = {"name": field(form, "name"), "url": field(form, "url"), "engine": field(form, "engine")}
    data.update(_settings(form, clear=False))
    row = await api.create_backend(request.app, data)
    return f"backend {row['name']} added ({row['status']})"


@admin_page
async def backend(request: web.Request, session: Session) -> web.StreamResponse:
    name = request.match_info["name"]
    found = next((r for r in _rows(request) if r["name"].lower() == name.lower()), None)
    if found is None:
        return page(request, "error.html", session, 404, message=f"There is no backend {name!r}.")
    return page(request, "backend.html", session, b=found)


@admin_page
@action("/ui/admin/backends/{name}")
async def set_backend(request: web.Request, session: Session) -> str:
    name = request.match_info["name"]
    row = await change_backend(request.app, name, _settings(await request.post(), clear=True))
    return f"backend {row['name']} saved: max_concurrent {row['max_concurrent']}"


@admin_page
async def drain(request: web.Request, session: Session) -> web.StreamResponse:
    """Drain; for the last backend of a model, first a page naming the models that would have none."""
    name = request.match_info["name"]
    try:
        left = models_left_without(request.app, name)
        if left and field(await request.post(), "force") != "yes":
            them = "it" if len(left) == 1 else "them"
            question = (
                f"Draining {name} leaves {', '.join(left)} without a backend: every new request for {them} "
                f"fails until a backend serves {them} again. Drain anyway?"
            )
            return confirm(request, session, question, "Drain anyway", "/ui/admin/backends", force="yes")
        row = api.set_backend_state(request.app, name, "draining")
        session.flash = ("ok", f"backend {name} is {row['status']}")
    except StoreError as exc:
        session.flash = ("error", str(exc))
    return redirect("/ui/admin/backends")


@admin_page
@action("/ui/admin/backends")
async def enable(request: web.Request, session: Session) -> str:
    row = api.set_backend_state(request.app, request.match_info["name"], "enabled")
    return f"backend {row['name']} is {row['status']}"


@admin_page
async def remove_backend(request: web.Request, session: Session) -> web.StreamResponse:
    name = request.match_info["name"]
    back = f"/ui/admin/backends/{quote(name, safe='')}"
    if request.method == "GET":
        left = models_left_without(request.app, name) if name in backend_names(request.app).values() else []
        warn = f" {', '.join(left)} would have no backend left." if left else ""
        question = f"Remove backend {name}? Its usage history stays.{warn}"
        return confirm(request, session, question, "Remove backend", back)
    try:
        await api.delete_backend(request.app, name)
    except StoreError as exc:
        session.flash = ("error", str(exc))
        return redirect(back)
    session.flash = ("ok", f"backend {name} removed")
    return redirect("/ui/admin/backends")


def setup_backend_forms(app: web.Application) -> None:
    r = app.router
    r.add_get("/ui/admin/backends", backends)
    r.add_post("/ui/admin/backends", add_backend)
    r.add_get("/ui/admin/backends/{name}", backend)
    r.add_post("/ui/admin/backends/{name}", set_backend)
    r.add_post("/ui/admin/backends/{name}/drain", drain)
    r.add_post("/ui/admin/backends/{name}/enable", enable)
    r.add_get("/ui/admin/backends/{name}/remove", remove_backend)
    r.add_post("/ui/admin/backends/{name}/remove", remove_backend)
