"""``mr models``: every model the pool can serve, which backends have it and where it is loaded."""

from __future__ import annotations

import typer

from ..formats import fmt_list
from ._app import ConfigOption, JsonOption, get_app
from ._output import Column, print_rows

__all__ = ["COLUMNS", "register"]

COLUMNS = [
    Column("model", "model", style="bold"),
    Column("backends", "backends", fmt=fmt_list),
    Column("loaded_on", "loaded on", fmt=fmt_list, style="green"),
]


def models(ctx: typer.Context, json: JsonOption = False, config: ConfigOption = None) -> None:
    """List the models across all backends and where each is loaded in GPU memory now.

    A request for a loaded model starts without the load delay, so the
    scheduler prefers those backends.

    Example: mr models --json
    """
    rows = get_app(ctx, config).client.get("/admin/models")
    rows = sorted(rows, key=lambda r: str(r.get("model", "")))
    print_rows(rows, COLUMNS, as_json=json, empty="no models; check `mr backend list` for unhealthy backends")


def register(app: typer.Typer) -> None:
    app.command("models")(models)
