"""``mr status``: is the daemon up, and what does the pool look like right now."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from ..formats import fmt_duration, fmt_num, fmt_tokens
from ._app import ConfigOption, JsonOption, get_app
from ._output import print_json, print_table

__all__ = ["register", "status_rows"]


def status_rows(data: dict[str, Any]) -> list[tuple[str, str]]:
    """The status as (label, value) pairs, in the order people read them."""
    listen = data.get("listen")
    if isinstance(listen, (list, tuple)):
        listen = ", ".join(map(str, listen))
    return [
        ("version", str(data.get("version", "n/a"))),
        ("uptime", fmt_duration(data.get("uptime_seconds"))),
        ("listening on", str(listen or "n/a")),
        ("admin socket", str(data.get("socket") or "n/a")),
        ("backends", f"{fmt_num(data.get('backends_healthy'))} healthy of {fmt_num(data.get('backends'))}"),
        *(
            [("GPU agents down", ", ".join(map(str, data["nodes_unreachable"])))]
            if data.get("nodes_unreachable")
            else []
        ),
        ("users", fmt_num(data.get("users"))),
        ("queued", fmt_num(data.get("queue_total"))),
        ("running", fmt_num(data.get("running"))),
        ("requests", f"{fmt_num(data.get('requests_total'))} ({fmt_num(data.get('requests_per_second'), 1)}/s)"),
        ("tokens", f"{fmt_tokens(data.get('tokens_total'))} ({fmt_num(data.get('tokens_per_second'), 1)}/s)"),
    ]


def status(ctx: typer.Context, json: JsonOption = False, config: ConfigOption = None) -> None:
    """Show whether the daemon runs, its version, backends, queue and throughput.

    Exits 3 when the daemon cannot be reached, so scripts can use it as a health check.

    Example: mr status --json
    """
    data = get_app(ctx, config).client.get("/admin/status")
    if json:
        print_json(data)
        return
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for label, value in status_rows(data):
        grid.add_row(label, value)
    print_table(grid)


def register(app: typer.Typer) -> None:
    app.command("status")(status)
