"""``mr group``: the groups whose weights set each person's share (student 1, faculty 3, ...)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from ..formats import fmt_count, fmt_num
from . import _validate
from ._app import ConfigOption, JsonOption, complete_from, get_app
from ._client import quote_name
from ._output import Column, print_changed, print_rows
from .usage import ClearOption, RequestsPerMinute, TokensPerDay, TokensPerMonth, quota_text, set_quota

__all__ = ["COLUMNS", "group_app", "register"]

group_app = typer.Typer(name="group", help="Manage groups and their fair-share weights.", no_args_is_help=True)

COLUMNS = [
    Column("name", "group", style="bold"),
    Column("scheduler_weight", "weight", fmt=fmt_num, justify="right"),
    Column("users", "users", fmt=fmt_count, justify="right"),
    Column("quotas", "quota (used/limit)", fmt=quota_text, short="quota"),
]

GroupName = Annotated[
    str,
    typer.Argument(
        metavar="NAME", help="The group's name.", autocompletion=complete_from("/admin/groups"), show_default=False
    ),
]


@group_app.command("list")
def list_groups(ctx: typer.Context, json: JsonOption = False, config: ConfigOption = None) -> None:
    """List the groups with their weights and member counts.

    Example: mr group list --json
    """
    rows = get_app(ctx, config).client.get("/admin/groups")
    print_rows(rows, COLUMNS, as_json=json, empty="no groups; add one with `mr group add NAME --weight W`")


@group_app.command("add")
def add(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The new group's name.", show_default=False)],
    weight: Annotated[
        str,
        typer.Option(
            "--weight",
            "-w",
            metavar="W",
            help="Fair-share weight, a number greater than 0; "
            "a group of weight 3 gets three times the share of weight 1.",
        ),
    ] = "1",
    json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Add a group.

    Example: mr group add phd --weight 2
    """
    body = {"name": _validate.name(name, "group"), "weight": _validate.weight(weight)}
    row = get_app(ctx, config).client.post("/admin/groups", body)
    print_changed(
        row,
        json,
        f"added group [bold]{escape(name)}[/] with weight {fmt_num(row.get('scheduler_weight', body['weight']))}",
    )


@group_app.command("set-weight", context_settings={"ignore_unknown_options": True})  # so "-1" reaches the weight check
def set_weight(
    ctx: typer.Context,
    name: GroupName,
    weight: Annotated[
        str, typer.Argument(metavar="W", help="The new weight, a number greater than 0.", show_default=False)
    ],
    json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Change a group's weight; it applies to the next scheduling decision.

    A weight set here takes precedence over the SCHEDULER_WEIGHT_<GROUP> fallbacks.

    Example: mr group set-weight faculty 3
    """
    value = _validate.weight(weight)
    row = get_app(ctx, config).client.put(f"/admin/groups/{quote_name(name)}", {"weight": value})
    print_changed(
        row, json, f"group [bold]{escape(name)}[/] now has weight {fmt_num(row.get('scheduler_weight', value))}"
    )


@group_app.command("set-quota")
def set_group_quota(
    ctx: typer.Context,
    name: GroupName,
    tokens_per_day: TokensPerDay = None,
    tokens_per_month: TokensPerMonth = None,
    requests_per_minute: RequestsPerMinute = None,
    clear: ClearOption = False,
    json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Limit what a group's members may use together; past it, their requests are refused with 429.

    Limits not given stay as they are; each member's own quota applies as well.

    Example: mr group set-quota student --tokens-per-month 50M
    """
    limits = {
        "tokens_per_day": tokens_per_day,
        "tokens_per_month": tokens_per_month,
        "requests_per_minute": requests_per_minute,
    }
    set_quota(ctx, "group", name, limits, clear, json, config)


@group_app.command("rm")
def remove(ctx: typer.Context, name: GroupName, json: JsonOption = False, config: ConfigOption = None) -> None:
    """Remove a group (the daemon refuses while users are still in it).

    Example: mr group rm visitors
    """
    answer = get_app(ctx, config).client.delete(f"/admin/groups/{quote_name(name)}")
    print_changed(answer or {"removed": name}, json, f"removed group [bold]{escape(name)}[/]")


def register(app: typer.Typer) -> None:
    app.add_typer(group_app, name="group")
