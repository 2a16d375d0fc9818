"""The admin pages' forms for people: groups (add, weigh, set quotas, remove), users (add, a proxy's person
too, move, weigh, make a proxy, set quotas, remove) and their keys (create with a label, revoke after a
confirmation).

Every change goes through the admin API's own function (``daemon/admin/api.py``,
``daemon/edge/accounting.py``), so a form and ``mr`` validate alike and fail with
the same sentence. A new key is shown by a redirect after the POST (the session holds it
for that one page), so reloading the page shows no key and makes none.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from aiohttp import web

from ...store import QUOTA_FIELDS, NotFound, StoreError
from ..admin import api
from ..admin.watch import quota_rows
from ..edge.accounting import change_quota
from ..edge.services import SERVICES
from .render import action, admin_page, page, redirect
from .sessions import Session

__all__ = ["confirm", "field", "setup_people_forms"]


def field(form: Any, name: str) -> str:
    value = form.get(name, "")
    return value.strip() if isinstance(value, str) else ""


def _quota_value(raw: str) -> int | str | None:
    """A form's quota: blank removes it, a whole number sets it; anything else goes to the store, which refuses it."""
    if not raw:
        return None
    return int(raw) if raw.isdigit() else raw


def _quotas(form: Any) -> dict[str, Any]:
    return {f: _quota_value(field(form, f)) for f in QUOTA_FIELDS}


def confirm(
    request: web.Request, session: Session, question: str, button: str, back: str, **hidden: str
) -> web.Response:
    """A page that asks before a change that cannot be undone; its form posts to this same path."""
    context: dict[str, Any] = {"question": question, "button": button, "back": back, "hidden": hidden}
    return page(request, "confirm.html", session, action=request.path, **context)


def _name(request: web.Request) -> str:
    return request.match_info["name"]


# -- groups ------------------------------------------------------------------------------------


@admin_page
@action("/ui/admin/groups")
async def add_group(request: web.Request, session: Session) -> str:
    form = await request.post()
    group = api.create_group(request.app, {"name": field(form, "name"), "weight": field(form, "weight")})
    return f"group {group.name} added with weight {group.scheduler_weight:g}"


@admin_page
@action("/ui/admin/groups")
async def set_group_weight(request: web.Request, session: Session) -> str:
    group = api.change_group_weight(request.app, _name(request), field(await request.post(), "weight"))
    return f"group {group.name} now weighs {group.scheduler_weight:g}"


@admin_page
async def group(request: web.Request, session: Session) -> web.StreamResponse:
    store = request.app[SERVICES].store
    try:
        row = next(g for g in store.list_groups() if g.name.lower() == _name(request).lower())
    except StopIteration:
        return page(request, "error.html", session, 404, message=f"There is no group {_name(request)!r}.")
    members = store.list_users(row.name)
    quotas = quota_rows(request.app, "group", row.name)
    return page(request, "group.html", session, group=row, members=members, quotas=quotas, quota_fields=QUOTA_FIELDS)


@admin_page
@action("/ui/admin/groups/{name}")
async def set_group_quota(request: web.Request, session: Session) -> str:
    change_quota(request.app, "group", _name(request), _quotas(await request.post()))
    return f"quotas of group {_name(request)} saved"


@admin_page
async def remove_group(request: web.Request, session: Session) -> web.StreamResponse:
    name = _name(request)
    if request.method == "GET":
        return confirm(request, session, f"Remove group {name}?", "Remove group", f"/ui/admin/groups/{quote(name)}")
    try:
        api.delete_group(request.app, name)
    except StoreError as exc:
        session.flash = ("error", str(exc))
        return redirect(f"/ui/admin/groups/{quote(name, safe='')}")
    session.flash = ("ok", f"group {name} removed")
    return redirect("/ui/admin/groups")


# -- users -------------------------------------------------------------------------------------


@admin_page
async def users(request: web.Request, session: Session) -> web.StreamResponse:
    store = request.app[SERVICES].store
    return page(
        request,
        "users.html",
        session,
        users=store.list_users(),
        keys=store.key_counts(),
        groups=store.list_groups(),
    )


@admin_page
async def add_user(request: web.Request, session: Session) -> web.StreamResponse:
    form = await request.post()
    data: dict[str, Any] = {"name": field(form, "name"), "group": field(form, "group")}
    if field(form, "weight"):
        data["weight"] = field(form, "weight")
    if field(form, "proxy"):
        data["proxy"] = True
    if field(form, "person_of"):
        data["person_of"] = field(form, "person_of")
    try:
        user = api.create_user(request.app, data)
    except (StoreError, ValueError) as exc:
        session.flash = ("error", str(exc))
        return redirect("/ui/admin/users")
    session.flash = ("ok", f"user {user.name} added to group {user.group}; create a key for them below")
    return redirect(f"/ui/admin/users/{quote(user.name, safe='')}")


@admin_page
async def user(request: web.Request, session: Session) -> web.StreamResponse:
    app = request.app
    store = app[SERVICES].store
    app[SERVICES].auth.flush()  # the keys' last-used times, as `mr user keys` shows them
    try:
        row = store.get_user(_name(request))
    except NotFound as exc:
        return page(request, "error.html", session, 404, message=str(exc))
    new_key = None
    if session.new_key is not None and session.new_key[0] == row.name:
        new_key, session.new_key = session.new_key[1], None
    return page(
        request,
        "user.html",
        session,
        user=row,
        groups=store.list_groups(),
        keys=store.list_keys(row.name),
        quotas=quota_rows(app, "user", row.id),
        quota_fields=QUOTA_FIELDS,
        new_key=new_key,
    )


@admin_page
@action("/ui/admin/users/{name}")
async def set_user(request: web.Request, session: Session) -> str:
    form = await request.post()
    weight = field(form, "weight_override")
    changes: dict[str, Any] = {"group": field(form, "group"), "weight": weight or None}
    row = api.change_user(request.app, _name(request), changes)
    return f"user {row.name} is in group {row.group} with weight {row.weight:g}"


@admin_page
@action("/ui/admin/users/{name}")
async def set_proxy(request: web.Request, session: Session) -> str:
    """``mr user set-proxy``: a proxy (with its people's group and where its requests name them), or not."""
    form = await request.post()
    changes: dict[str, Any] = {"proxy": bool(field(form, "proxy"))}
    if changes["proxy"]:
        changes["proxy_group"] = field(form, "proxy_group") or None
        changes["person_from"] = field(form, "person_from") or "header"
    row = api.change_user(request.app, _name(request), changes)
    if row.proxy:
        return f"user {row.name} is a proxy: the people its requests name go in group {row.forwards_to}"
    return f"user {row.name} is no longer a proxy"


@admin_page
@action("/ui/admin/users/{name}")
async def set_user_quota(request: web.Request, session: Session) -> str:
    change_quota(request.app, "user", _name(request), _quotas(await request.post()))
    return f"quotas of {_name(request)} saved"


@admin_page
async def remove_user(request: web.Request, session: Session) -> web.StreamResponse:
    name = _name(request)
    back = f"/ui/admin/users/{quote(name, safe='')}"
    if request.method == "GET":
        question = f"Remove user {name}? Their keys stop working at once; their usage history stays."
        return confirm(request, session, question, "Remove user", back)
    try:
        api.delete_user(request.app, name)
    except StoreError as exc:
        session.flash = ("error", str(exc))
        return redirect(back)
    session.flash = ("ok", f"user {name} removed and their keys revoked")
    return redirect("/ui/admin/users")


# -- keys --------------------------------------------------------------------------------------


@admin_page
async def create_key(request: web.Request, session: Session) -> web.StreamResponse:
    """Make a key, then redirect to the user's page, which shows it once."""
    name = _name(request)
    try:
        key = api.new_key(request.app, name, field(await request.post(), "label"))
    except NotFound as exc:
        return page(request, "error.html", session, 404, message=str(exc))
    except (StoreError, ValueError) as exc:
        session.flash = ("error", str(exc))
    else:
        session.new_key = (request.app[SERVICES].store.get_user(name).name, key)
    return redirect(f"/ui/admin/users/{quote(name, safe='')}")


@admin_page
async def revoke_key(request: web.Request, session: Session) -> web.StreamResponse:
    name, key_id = _name(request), request.match_info["key_id"]
    back = f"/ui/admin/users/{quote(name, safe='')}"
    if request.method == "GET":
        found = (
            [k for k in request.app[SERVICES].store.list_keys(name) if str(k.id) == key_id] if key_id.isdigit() else []
        )
        label = f" ({found[0].label})" if found and found[0].label else ""
        starts = f", starting {found[0].prefix}…" if found else ""
        question = f"Revoke key {key_id}{label}{starts} of {name}? Whoever uses it is refused from then on."
        return confirm(request, session, question, "Revoke key", back)
    try:
        revoked = api.revoke_user_key(request.app, name, key_id)
    except (StoreError, ValueError) as exc:
        session.flash = ("error", str(exc))
    else:
        session.flash = ("ok", f"key {revoked} of {name} revoked")
    return redirect(back)


def setup_people_forms(app: web.Application) -> None:
    r = app.router
    r.add_post("/ui/admin/groups", add_group)
    r.add_get("/ui/admin/groups/{name}", group)
    r.add_post("/ui/admin/groups/{name}/weight", set_group_weight)
    r.add_post("/ui/admin/groups/{name}/quota", set_group_quota)
    r.add_get("/ui/admin/groups/{name}/remove", remove_group)
    r.add_post("/ui/admin/groups/{name}/remove", remove_group)
    r.add_get("/ui/admin/users", users)
    r.add_post("/ui/admin/users", add_user)
    r.add_get("/ui/admin/users/{name}", user)
    r.add_post("/ui/admin/users/{name}", set_user)
    r.add_post("/ui/admin/users/{name}/quota", set_user_quota)
    r.add_post("/ui/admin/users/{name}/proxy", set_proxy)
    r.add_get("/ui/admin/users/{name}/remove", remove_user)
    r.add_post("/ui/admin/users/{name}/remove", remove_user)
    r.add_post("/ui/admin/users/{name}/keys", create_key)
    r.add_get("/ui/admin/users/{name}/keys/{key_id}/revoke", revoke_key)
    r.add_post("/ui/admin/users/{name}/keys/{key_id}/revoke", revoke_key)
