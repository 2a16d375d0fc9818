"""``mr backend``: the inference servers (Ollama, vLLM, llama.cpp, OpenAI-compatible) in the pool."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from .. import names
from ..errors import UsageError
from ..formats import fmt_duration, fmt_list, fmt_num, fmt_pct, fmt_speeds
from ..reported import shown
from ..store import describe_field
from . import _validate
from ._app import ConfigOption, JsonOption, complete_from, get_app
from ._client import quote_name
from ._output import Column, console, fit_hints, print_changed, print_json, print_table, status_text, table

__all__ = ["COLUMNS", "backend_app", "register"]

backend_app = typer.Typer(name="backend", help="Manage the inference servers in the pool.", no_args_is_help=True)


def _load(row: dict[str, Any]) -> str:
    return f"{fmt_num(row.get('in_flight'))}/{fmt_num(row.get('max_concurrent'))}"


def _status(row: dict[str, Any]) -> Text:
    """The status word, and a silent GPU agent; an unhealthy backend's error goes under the table (``_errors``)."""
    text = status_text(row.get("status"))
    if row.get("node_error") and row.get("status") != "unhealthy":
        text.append(" (GPU agent down)", style="yellow")
    return text


def _errors(rows: list[dict[str, Any]]) -> list[str]:
    """Each unhealthy backend's whole probe error, for under the table: in the status column it would be cut."""
    return [
        f"{shown(str(r.get('name')))} is unhealthy: {shown(str(r['error']))}"
        for r in rows
        if r.get("error") and r.get("status") == "unhealthy"
    ]


#: A narrow terminal hides the id first and the URL last: the URL says which server it is.
COLUMNS = [
    Column("id", "id", justify="right", style="dim", drop=1),
    Column("name", "backend", style="bold"),
    Column("engine", "engine", drop=5),
    Column("status", "status", getter=lambda r: r, fmt=_status),
    Column("in_flight", "in flight", getter=lambda r: r, fmt=_load, justify="right"),
    Column("loaded_models", "loaded", fmt=fmt_list),
    Column(
        "models",
        "models",
        fmt=lambda v: fmt_num(len(v)) if isinstance(v, list) else fmt_list(v),
        justify="right",
        drop=6,
    ),
    Column("latency_ema", "latency", fmt=fmt_duration, justify="right", drop=4),
    Column("tokens_per_second", "stream tok/s", fmt=lambda v: fmt_num(v, 1), justify="right", drop=3),
    Column("model_speeds", "tok/s by model", fmt=fmt_speeds, drop=2),
    Column("utilization", "gpu", fmt=fmt_pct, justify="right", drop=7),
    Column("url", "url", style="dim", drop=8),
]

BackendName = Annotated[
    str,
    typer.Argument(
        metavar="NAME", help="The backend's name.", autocompletion=complete_from("/admin/backends"), show_default=False
    ),
]


@backend_app.command("list")
def list_backends(ctx: typer.Context, json: JsonOption = False, config: ConfigOption = None) -> None:
    """List backends with health, requests in flight of their maximum, loaded models, latency and tokens/s.

    Example: mr backend list --json
    """
    rows = get_app(ctx, config).client.get("/admin/backends")
    if json:
        print_json(rows)
        return
    empty = "no backends; add one with `mr backend add NAME URL --engine ollama`"
    print_table(table(rows, COLUMNS, empty=empty), **fit_hints(COLUMNS), notes=_errors(rows))


MaxConcurrentOption = Annotated[
    str | None,
    typer.Option(
        "--max-concurrent",
        "-c",
        metavar="N",
        help="Requests the whole server may serve at once (at least 1).",
        show_default=False,
    ),
]
GpusOption = Annotated[
    str | None,
    typer.Option(
        "--gpus",
        metavar="0,1",
        help="Indexes of the GPUs it runs on, so their utilization and free memory count.",
        show_default=False,
    ),
]
NodeOption = Annotated[
    str | None,
    typer.Option(
        "--node",
        metavar="URL",
        help="The `mr agent` URL of the machine it runs on, when that is not this one.",
        show_default=False,
    ),
]
PriorityOption = Annotated[
    str | None,
    typer.Option(
        "--priority",
        "-p",
        metavar="P",
        help="Points added to its score; negative makes it a fallback.",
        show_default=False,
    ),
]
ParallelOption = Annotated[
    str | None,
    typer.Option(
        "--parallel",
        metavar="N",
        help="Requests each loaded model serves at once (Ollama's OLLAMA_NUM_PARALLEL).",
        show_default=False,
    ),
]
MaxLoadedOption = Annotated[
    str | None,
    typer.Option(
        "--max-loaded",
        metavar="N",
        help="Models it keeps loaded at once (Ollama's OLLAMA_MAX_LOADED_MODELS).",
        show_default=False,
    ),
]


@backend_app.command("add")
def add(
    ctx: typer.Context,
    name: Annotated[
        str,
        typer.Argument(metavar="NAME", help="A short name for the backend, such as ws3-ollama.", show_default=False),
    ],
    url: Annotated[
        str,
        typer.Argument(metavar="URL", help="The server's base URL, such as http://ws3.lab:11434.", show_default=False),
    ],
    engine: Annotated[
        str | None,
        typer.Option(
            "--engine",
            "-e",
            metavar="ENGINE",
            help=f"Which server runs there: {', '.join(names.ENGINES)}.",
            show_default=False,
        ),
    ] = None,
    max_concurrent: MaxConcurrentOption = None,
    gpus: GpusOption = None,
    node: NodeOption = None,
    priority: PriorityOption = None,
    parallel: ParallelOption = None,
    max_loaded: MaxLoadedOption = None,
    json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Add a backend; the daemon probes it once and lists its models before answering.

    --max-concurrent defaults to the daemon's default (4), or with --parallel to parallel x
    max-loaded (3 models when not given), so every loaded model can use its slots; set it lower
    to cap the whole server. Change any of these later with `mr backend set`.

    Example: mr backend add ws3 http://ws3.lab:11434 --engine ollama --gpus 0 --node http://ws3.lab:8485
    """
    body: dict[str, Any] = {
        "name": _validate.name(name, "backend"),
        "url": _validate.url(url),
        "engine": _validate.engine(engine),
    }
    per_model = _validate.slots(parallel, "--parallel")
    loaded = _validate.slots(max_loaded, "--max-loaded")
    cap = _validate.max_concurrent(max_concurrent)
    if per_model is not None and cap is None:
        cap = per_model * (loaded or 3)
    optional = {
        "max_concurrent": cap,
        "gpus": _validate.gpus(gpus),
        "node": None if node is None else _validate.url(node, "--node"),
        "priority": _validate.priority(priority),
        "parallel": per_model,
        "max_loaded": loaded,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    row = get_app(ctx, config).client.post("/admin/backends", body)
    if json:
        print_json(row)
        return
    models = row.get("models") or []
    state = row.get("status", "unknown")
    note = f"{len(models)} model{'s' if len(models) != 1 else ''}" if models else "no models yet"
    console().print(
        f"added backend [bold]{escape(name)}[/] ({escape(body['engine'])}, {escape(body['url'])}): {state}, {note}"
    )
    if state == "unhealthy" and row.get("error"):
        console(stderr=True).print(
            f"[yellow]warning:[/] {escape(name)} did not answer its first probe: {escape(shown(row['error']))}"
        )
    _warn_node(row)


def _warn_node(row: dict[str, Any]) -> None:
    if row.get("node_error"):
        console(stderr=True).print(f"[yellow]warning:[/] {escape(shown(row['node_error']))}")


def _or_none(value: str | None, check: Callable[[str], Any]) -> Any:
    """An option that ``none`` clears: JSON null for ``none``, else the checked value (``_UNSET`` when not given)."""
    if value is None:
        return _UNSET
    return None if value.strip().lower() == "none" else check(value)


_UNSET: Any = object()


@backend_app.command("set")
def set_(
    ctx: typer.Context,
    name: BackendName,
    max_concurrent: MaxConcurrentOption = None,
    parallel: ParallelOption = None,
    max_loaded: MaxLoadedOption = None,
    gpus: GpusOption = None,
    node: NodeOption = None,
    priority: PriorityOption = None,
    json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Change a backend's settings in place: it keeps its name, id and usage history, and requests in flight finish.

    Settings not given stay as they are (--max-concurrent too, when --parallel changes);
    `none` clears --parallel, --max-loaded, --gpus or --node. To point it at another server,
    add that one and remove this one.

    Example: mr backend set ws3 --parallel 4 --max-concurrent 12
    """
    settings = {
        "parallel": _or_none(parallel, lambda v: _validate.slots(v, "--parallel")),
        "max_loaded": _or_none(max_loaded, lambda v: _validate.slots(v, "--max-loaded")),
        "max_concurrent": _UNSET if max_concurrent is None else _validate.max_concurrent(max_concurrent),
        "gpus": _or_none(gpus, lambda v: _validate.gpus(v) or []),
        "node": _or_none(node, lambda v: _validate.url(v, "--node")),
        "priority": _UNSET if priority is None else _validate.priority(priority),
    }
    body = {k: v for k, v in settings.items() if v is not _UNSET}
    if not body:
        raise UsageError(
            "give at least one setting to change, such as --max-concurrent 8 (`mr backend set --help` lists them)"
        )
    client = get_app(ctx, config).client
    path = f"/admin/backends/{quote_name(name)}"
    before: dict[str, Any] = next((b for b in client.get("/admin/backends") if b.get("name") == name), {})
    row = client.put(path, body)
    if json:
        print_json(row)
        return
    changed = [describe_field(k, before.get(k), row.get(k)) for k in body if before.get(k) != row.get(k)]
    what = ", ".join(changed) if changed else "nothing to change, it has those settings already"
    console().print(Text(f"changed {name}: {what}"))
    _warn_node(row)


@backend_app.command("drain")
def drain(
    ctx: typer.Context,
    name: BackendName,
    force: Annotated[bool, typer.Option("--force", help="Drain it even if it is the last backend of a model.")] = False,
    json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Stop sending new requests to a backend; those in flight finish.

    Refused while it is the only backend that takes requests for a model, naming the models:
    every new request for them would fail until it is enabled again (--force drains it anyway).

    Example: mr backend drain ws3
    """
    row = get_app(ctx, config).client.post(
        f"/admin/backends/{quote_name(name)}/drain", {"force": True} if force else None
    )
    message = f"draining [bold]{escape(name)}[/]: no new requests; {fmt_num(row.get('in_flight'))} still in flight"
    left = row.get("models_left_without") or []
    if left:
        them = "has" if len(left) == 1 else "have"
        message += (
            f"; {escape(', '.join(map(str, left)))} now {them} no backend, and requests for "
            f"{'it' if len(left) == 1 else 'them'} are refused until `mr backend enable {escape(name)}`"
        )
    print_changed(row, json, message)


@backend_app.command("enable")
def enable(ctx: typer.Context, name: BackendName, json: JsonOption = False, config: ConfigOption = None) -> None:
    """Send requests to a draining or drained backend again.

    Example: mr backend enable ws3
    """
    row = get_app(ctx, config).client.post(f"/admin/backends/{quote_name(name)}/enable")
    print_changed(row, json, f"enabled [bold]{escape(name)}[/] ({row.get('status', 'unknown')})")


@backend_app.command("rm")
def remove(ctx: typer.Context, name: BackendName, json: JsonOption = False, config: ConfigOption = None) -> None:
    """Remove a backend from the pool (drain it first to let requests finish).

    Example: mr backend rm ws3
    """
    answer = get_app(ctx, config).client.delete(f"/admin/backends/{quote_name(name)}")
    print_changed(answer or {"removed": name}, json, f"removed backend [bold]{escape(name)}[/]")


def register(app: typer.Typer) -> None:
    app.add_typer(backend_app, name="backend")
