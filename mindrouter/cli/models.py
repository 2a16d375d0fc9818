"""``mr models``: every model the pool can serve, which backends have it and where it is loaded; ``mr model
alias``: one model served under different names by different engines."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from ..formats import fmt_list
from ._app import ConfigOption, JsonOption, get_app
from ._client import quote_name
from ._output import Column, print_changed, print_rows

__all__ = ["COLUMNS", "model_app", "register"]

model_app = typer.Typer(
    name="model", help="Name one model that engines serve under different names.", no_args_is_help=True
)
ALIAS_COLUMNS = [Column("name", "alias", style="bold"), Column("target", "model")]
AliasName = Annotated[str, typer.Argument(metavar="NAME", help="The other name, as a client or engine says it.")]

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


@model_app.command("alias")
def alias(
    ctx: typer.Context,
    name: AliasName,
    target: Annotated[str, typer.Argument(metavar="TARGET", help="The model it is another name of.")],
    json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Make NAME another name of the model TARGET, so the backends serving either form one pool.

    A vLLM server names a model by its Hugging Face id, Ollama by its tag: with the alias, a
    request for either name may go to any of them, each asked under the name it lists.

    Example: mr model alias meta-llama/Llama-3.1-8B-Instruct llama3.1:8b
    """
    row = get_app(ctx, config).client.put(f"/admin/models/aliases/{quote_name(name)}", {"target": target})
    print_changed(row, json, f"[bold]{escape(row['name'])}[/] is now another name of [bold]{escape(row['target'])}[/]")


@model_app.command("unalias")
def unalias(ctx: typer.Context, name: AliasName, json: JsonOption = False, config: ConfigOption = None) -> None:
    """Make NAME a model of its own again.

    Example: mr model unalias meta-llama/Llama-3.1-8B-Instruct
    """
    answer = get_app(ctx, config).client.delete(f"/admin/models/aliases/{quote_name(name)}")
    print_changed(answer or {"removed": name}, json, f"removed the alias [bold]{escape(name)}[/]")


@model_app.command("aliases")
def aliases(ctx: typer.Context, json: JsonOption = False, config: ConfigOption = None) -> None:
    """List the model aliases and the model each names.

    Example: mr model aliases --json
    """
    rows = get_app(ctx, config).client.get("/admin/models/aliases")
    print_rows(rows, ALIAS_COLUMNS, as_json=json, empty="no model aliases; add one with `mr model alias NAME TARGET`")


def register(app: typer.Typer) -> None:
    app.command("models")(models)
    app.add_typer(model_app, name="model")
