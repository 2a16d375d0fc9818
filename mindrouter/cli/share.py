"""``mr share``: the fair-share picture, like Slurm's ``sshare``.

Each group, then its users indented under it: the weight, its target share of
the pools it has demand in (``scheduler/targets.py``; none while idle), its
actual share of them in the fairness window, and the scheduler terms that act on its priority: its deficit
and its deprioritization factor (below 1 for heavy recent use). Burst credits
are the same per unit of weight for everyone, so they are not shown.
"""

from __future__ import annotations

from typing import Any

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from ..formats import fmt_duration, fmt_num, fmt_pct, fmt_tokens
from ._app import ConfigOption, JsonOption, get_app
from ._output import factor_text, print_json, print_table
from .usage import quota_text

__all__ = ["register", "share_rows", "share_table"]

HEADERS = [
    "group / user",
    "weight",
    "target",
    "recent tokens",
    "actual",
    "recent units",
    "unit share",
    "deficit",
    "factor",
    "queued",
    "running",
    "quota (used/limit)",
]


def share_rows(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(kind, row) pairs in display order: each group followed by its users, heaviest first."""
    users = list(data.get("users") or [])
    groups = list(data.get("groups") or [])
    known = {g.get("name") for g in groups}
    out: list[tuple[str, dict[str, Any]]] = []
    for group in sorted(groups, key=lambda g: (-float(g.get("weight") or 0), str(g.get("name")))):
        out.append(("group", group))
        members = [u for u in users if u.get("group") == group.get("name")]
        out.extend(
            ("user", u)
            for u in sorted(members, key=lambda u: (-float(u.get("recent_tokens") or 0), str(u.get("name"))))
        )
    out.extend(("user", u) for u in users if u.get("group") not in known)
    return out


def share_table(data: dict[str, Any]) -> Table:
    t = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        header_style="bold",
        pad_edge=False,
        title=f"fair share over the last {fmt_duration(data.get('window_seconds'))} "
        f"({fmt_tokens(data.get('global_recent_tokens'))} tokens, "
        f"{fmt_tokens(data.get('global_recent_units'))} service units)"
        + ("; group shares: a group's weight is split among its active users" if data.get("shares") == "group" else ""),
        title_justify="left",
        title_style="bold",
    )
    for i, header in enumerate(HEADERS):
        t.add_column(header, justify="left" if i == 0 else "right")
    for kind, row in share_rows(data):
        if kind == "group":
            t.add_row(
                Text(str(row.get("name")), style="bold"),
                fmt_num(row.get("weight")),
                fmt_pct(row.get("target_share"), 1),
                fmt_tokens(row.get("recent_tokens")),
                fmt_pct(row.get("actual_share"), 1),
                fmt_tokens(row.get("recent_units")),
                fmt_pct(row.get("unit_share"), 1),
                "",
                "",
                "",
                "",
                quota_text(row.get("quotas")),
            )
        else:
            t.add_row(
                f"  {row.get('name')}",
                fmt_num(row.get("weight")),
                fmt_pct(row.get("target_share"), 1),
                fmt_tokens(row.get("recent_tokens")),
                fmt_pct(row.get("actual_share"), 1),
                fmt_tokens(row.get("recent_units")),
                fmt_pct(row.get("unit_share"), 1),
                fmt_num(row.get("deficit"), 0),
                factor_text(row.get("factor")),
                fmt_num(row.get("queued")),
                fmt_num(row.get("running")),
                quota_text(row.get("quotas")),
            )
    if not data.get("groups") and not data.get("users"):
        t.add_row(Text("no groups or users yet", style="dim"), *[""] * (len(HEADERS) - 1))
    return t


def pool_table(data: dict[str, Any]) -> Table | None:
    """Each pool of backends with the people who have a target in it; None where every target is of one pool."""
    pools: dict[tuple[str, ...], list[tuple[str, dict[str, Any]]]] = {}
    for user in data.get("users") or []:
        for seat in user.get("pools") or []:
            if seat.get("target_share") is not None:
                names = tuple(seat.get("names") or seat.get("backends") or ())
                pools.setdefault(names, []).append((str(user.get("name")), seat))
    if len(pools) < 2:
        return None
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, header_style="bold", pad_edge=False)
    t.title, t.title_justify, t.title_style = "per pool of backends (each divided among its people)", "left", "bold"
    for header in ("pool", "user", "target", "actual"):
        t.add_column(header, justify="left" if header in ("pool", "user") else "right")
    for names, seats in sorted(pools.items()):
        for i, (name, seat) in enumerate(sorted(seats, key=lambda s: -float(s[1].get("target_share") or 0))):
            t.add_row(
                ", ".join(names) if i == 0 else "",
                name,
                fmt_pct(seat.get("target_share"), 1),
                fmt_pct(seat.get("actual_share"), 1),
            )
    return t


def share(ctx: typer.Context, json: JsonOption = False, config: ConfigOption = None) -> None:
    """Show fair share per group and user, like Slurm's sshare.

    target is what the weights entitle one to among the people with demand in
    the same pools of backends (none while idle); actual is what one used of
    those pools over the fairness window. A factor below 1 means deprioritized for
    heavy recent use; deficit is service units owed next to the most-owed waiting
    user. Service units weigh prompt and answer tokens by [scheduler]
    prompt_token_cost and completion_token_cost; fair share counts them, quotas
    count tokens.
    With [scheduler] shares = "group", a group's weight is its share and its
    users split it.

    Example: mr share --json
    """
    data = get_app(ctx, config).client.get("/admin/share")
    if json:
        print_json(data)
        return
    print_table(
        share_table(data),
        short={"quota (used/limit)": "quota"},
        drop=["queued", "running", "quota (used/limit)", "recent tokens"],
    )
    pools = pool_table(data)
    if pools is not None:
        print_table(pools)


def register(app: typer.Typer) -> None:
    app.command("share")(share)
