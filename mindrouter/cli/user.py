"""``mr user``: people, the group each belongs to, an optional weight of their own, and API keys."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from ..errors import UsageError
from ..formats import fmt_count, fmt_num, fmt_tokens
from . import _validate
from ._app import ConfigOption, JsonOption, UserName, complete_from, get_app
from ._client import quote_name
from ._output import Column, print_changed, print_rows
from .usage import ClearOption, RequestsPerMinute, TokensPerDay, TokensPerMonth, quota_text, set_quota
from .user_keys import key, keys

__all__ = ["COLUMNS", "register", "user_app"]

user_app = typer.Typer(name="user", help="Manage users, their groups, weights and API keys.", no_args_is_help=True)


def _override(value: Any) -> str:
    return "-" if value is None else fmt_num(value)


COLUMNS = [
    Column("name", "user", style="bold"),
    Column("group", "group"),
    Column("weight", "weight", fmt=fmt_num, justify="right"),
    Column("weight_override", "own weight", fmt=_override, justify="right"),
    Column("keys", "keys", fmt=fmt_count, justify="right", drop=1),
    Column("queued", "queued", fmt=fmt_num, justify="right", drop=4),
    Column("running", "running", fmt=fmt_num, justify="right", drop=3),
    Column("recent_tokens", "recent tokens", fmt=fmt_tokens, justify="right", drop=5),
    Column("quotas", "quota (used/limit)", fmt=quota_text, short="quota"),
    Column("proxy_for", "proxy", getter=lambda row: row, fmt=lambda row: _proxy_text(row), drop=2),
]


def _proxy_text(row: Any) -> str:
    """A proxy's people group (and "user field" when it reads their names there); a person's proxy; else "-"."""
    if row.get("proxy_for") is not None:
        source = " (user field)" if row.get("person_from") == "user-field" else ""
        return f"for {row['proxy_for']}{source}"
    if row.get("person_of") is not None:
        return f"of {row['person_of']}"
    return "-"


GroupOption = Annotated[
    str | None,
    typer.Option(
        "--group",
        "-g",
        metavar="G",
        help="The group the user belongs to (its weight applies unless the user has one).",
        autocompletion=complete_from("/admin/groups"),
        show_default=False,
    ),
]


ProxyGroupOption = Annotated[
    str | None,
    typer.Option(
        "--proxy-group",
        metavar="G",
        help="The group for the people a proxy names (implies --proxy). Defaults to the proxy's own group.",
        autocompletion=complete_from("/admin/groups"),
        show_default=False,
    ),
]
PersonFromOption = Annotated[
    str | None,
    typer.Option(
        "--person-from",
        metavar="header|user-field",
        help="Where a proxy's requests name their person: forwarding headers such as X-OpenWebUI-User-Email "
        '(header, the default) or OpenAI\'s "user" body field (user-field); the other names nobody.',
        show_default=False,
    ),
]


def _weight_note(row: dict[str, Any]) -> str:
    if row.get("weight_override") is None:
        return f"weight {fmt_num(row.get('weight'))} from group {escape(str(row.get('group')))}"
    return f"own weight {fmt_num(row.get('weight_override'))}"


@user_app.command("list")
def list_users(ctx: typer.Context, json: JsonOption = False, config: ConfigOption = None) -> None:
    """List users with their group, effective weight, key count and recent usage.

    "own weight" is a per-user override; "-" means the group's weight applies. "proxy" shows, for a
    proxy, the group its people go in; for a person, the proxy it came through. With --json, a
    proxy has "person_from" and a person "person_of" and "identity" (what its proxy forwards).

    Example: mr user list --json
    """
    rows = get_app(ctx, config).client.get("/admin/users")
    print_rows(rows, COLUMNS, as_json=json, empty="no users; add one with `mr user add NAME --group G`")


@user_app.command("add")
def add(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The new user's name.", show_default=False)],
    group: GroupOption = None,
    weight: Annotated[
        str | None,
        typer.Option(
            "--weight",
            "-w",
            metavar="W",
            help="A weight of the user's own instead of the group's, greater than 0.",
            show_default=False,
        ),
    ] = None,
    proxy: Annotated[
        bool,
        typer.Option(
            "--proxy",
            help="A front end (such as Open WebUI) whose requests may name the person they are for; "
            "each person then gets a fair share of their own (see docs/clients.md).",
        ),
    ] = False,
    proxy_group: ProxyGroupOption = None,
    person_from: PersonFromOption = None,
    person_of: Annotated[
        str | None,
        typer.Option(
            "--person-of",
            metavar="PROXY",
            help="Make a proxy's person before their first request: NAME is what the proxy forwards "
            "(an e-mail address for Open WebUI), so they start in --group.",
            show_default=False,
        ),
    ] = None,
    json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Add a user to a group; create a key for them with `mr user key NAME`.

    Example: mr user add alice --group faculty
    """
    if group is None:
        raise UsageError("--group is required; name the user's group, such as --group student (see `mr group list`)")
    if person_of is not None:
        if weight is not None or proxy or proxy_group is not None or person_from is not None:
            raise UsageError("--person-of takes only --group; give a weight afterwards with `mr user set-weight`")
        person = {"name": name, "group": group, "person_of": _validate.name(person_of, "proxy")}
        row = get_app(ctx, config).client.post("/admin/users", person)
        print_changed(
            row,
            json,
            f"added [bold]{escape(str(row.get('name')))}[/], {escape(person_of)}'s person, to group {escape(group)}",
        )
        return
    body: dict[str, Any] = {"name": _validate.name(name, "user"), "group": group}
    if weight is not None:
        body["weight"] = _validate.weight(weight)
    if proxy or proxy_group is not None or person_from is not None:
        body.update(proxy=True, proxy_group=proxy_group)
    if person_from is not None:
        body["person_from"] = _validate.person_from(person_from)
    row = get_app(ctx, config).client.post("/admin/users", body)
    print_changed(
        row,
        json,
        f"added user [bold]{escape(name)}[/] to group {escape(group)} ({_weight_note(row)}); "
        f"create a key with `mr user key {escape(name)}`",
    )


@user_app.command("set-weight", context_settings={"ignore_unknown_options": True})  # so "-1" reaches the weight check
def set_weight(
    ctx: typer.Context,
    name: UserName,
    weight: Annotated[
        str | None, typer.Argument(metavar="[W]", help="The user's own weight, greater than 0.", show_default=False)
    ] = None,
    clear: Annotated[
        bool, typer.Option("--clear", help="Remove the user's own weight, so the group's applies again.")
    ] = False,
    json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Give a user a weight of their own, or with --clear go back to the group's.

    Example: mr user set-weight alice 5
    """
    if clear and weight is not None:
        raise UsageError("give either a weight or --clear, not both")
    if not clear and weight is None:
        raise UsageError(
            "give the user's new weight, such as `mr user set-weight alice 2`, or --clear to use the group's"
        )
    value = None if clear else _validate.weight(weight)
    row = get_app(ctx, config).client.put(f"/admin/users/{quote_name(name)}", {"weight": value})
    print_changed(row, json, f"user [bold]{escape(name)}[/] now has {_weight_note(row)}")


@user_app.command("set-group")
def set_group(
    ctx: typer.Context,
    name: UserName,
    group: Annotated[
        str,
        typer.Argument(
            metavar="G", help="The user's new group.", autocompletion=complete_from("/admin/groups"), show_default=False
        ),
    ],
    json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Move a user to another group; their recent usage goes with them.

    Example: mr user set-group bob staff
    """
    row = get_app(ctx, config).client.put(f"/admin/users/{quote_name(name)}", {"group": group})
    print_changed(
        row,
        json,
        f"user [bold]{escape(name)}[/] is now in group {escape(str(row.get('group', group)))} ({_weight_note(row)})",
    )


@user_app.command("set-proxy")
def set_proxy(
    ctx: typer.Context,
    name: UserName,
    state: Annotated[
        str | None,
        typer.Argument(
            metavar="[on|off]",
            help="on: the user's requests may name a person (implied by --proxy-group and --person-from).",
            show_default=False,
        ),
    ] = None,
    proxy_group: ProxyGroupOption = None,
    person_from: PersonFromOption = None,
    json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Make a user a proxy for the people behind a front end, or an ordinary user again.

    A proxy's request that names a person (Open WebUI's X-OpenWebUI-User-Email, X-Forwarded-User,
    or with --person-from user-field OpenAI's "user" field) is queued, charged and recorded as
    that person, one of the proxy's own, created on first sight in the proxy group. A name that
    is another user's, and a request without one, are charged to the proxy. Settings not given
    stay as they are.

    Example: mr user set-proxy webui --proxy-group student --person-from header
    """
    if state is None and proxy_group is None and person_from is None:
        raise UsageError(f"say `on` or `off`, or give --proxy-group or --person-from: mr user set-proxy {name} on")
    if state not in (None, "on", "off"):
        raise UsageError(f"say `on` or `off`, not {state!r}: mr user set-proxy {name} on")
    if state == "off" and (proxy_group is not None or person_from is not None):
        raise UsageError("--proxy-group and --person-from go with `on`")
    body: dict[str, Any] = {"proxy": state != "off"}
    if proxy_group is not None:
        body["proxy_group"] = proxy_group
    if person_from is not None:
        body["person_from"] = _validate.person_from(person_from)
    row = get_app(ctx, config).client.put(f"/admin/users/{quote_name(name)}", body)
    if row.get("proxy_for"):
        source = "OpenAI's user field" if row.get("person_from") == "user-field" else "forwarding headers"
        note = f"is a proxy: the people its {source} name go in group {escape(str(row['proxy_for']))}"
    else:
        note = "is no longer a proxy"
    print_changed(row, json, f"user [bold]{escape(name)}[/] {note}")


user_app.command("keys")(keys)


@user_app.command("set-quota")
def set_user_quota(
    ctx: typer.Context,
    name: UserName,
    tokens_per_day: TokensPerDay = None,
    tokens_per_month: TokensPerMonth = None,
    requests_per_minute: RequestsPerMinute = None,
    clear: ClearOption = False,
    json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Limit what one user may use; past it, requests are refused with 429 until the period resets.

    Limits not given stay as they are; the group's quota applies as well.

    Example: mr user set-quota alice --tokens-per-day 2M
    """
    limits = {
        "tokens_per_day": tokens_per_day,
        "tokens_per_month": tokens_per_month,
        "requests_per_minute": requests_per_minute,
    }
    set_quota(ctx, "user", name, limits, clear, json, config)


user_app.command("key")(key)


@user_app.command("rm")
def remove(ctx: typer.Context, name: UserName, json: JsonOption = False, config: ConfigOption = None) -> None:
    """Remove a user and revoke all their keys.

    Example: mr user rm bob
    """
    answer = get_app(ctx, config).client.delete(f"/admin/users/{quote_name(name)}")
    print_changed(answer or {"removed": name}, json, f"removed user [bold]{escape(name)}[/] and revoked their keys")


def register(app: typer.Typer) -> None:
    app.add_typer(user_app, name="user")
