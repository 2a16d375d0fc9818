"""``mr decisions``: the scheduler's routing decisions, newest last, or live with ``--follow``.

``--json`` prints one record per line (not an array) so the same consumer can
read a finished listing and an endless ``--follow`` stream.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import typer
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from ..errors import DaemonUnreachable
from ..explain import backend_label
from ..formats import fmt_duration, fmt_num, fmt_time
from . import _validate
from ._app import ConfigOption, complete_from, get_app
from ._output import Column, console, fit_hints, print_json_lines, print_table, table

__all__ = ["COLUMNS", "decision_line", "register"]


def _score(record: Mapping[str, Any]) -> Any:
    scores = record.get("scores") or {}
    return scores.get(str(record.get("selected_backend_id")))


def _priority(record: Mapping[str, Any]) -> Any:
    terms = record.get("priority")
    return terms.get("priority") if isinstance(terms, Mapping) else None


def _user(record: Mapping[str, Any]) -> str:
    user = str(record.get("user") or record.get("user_id") or "n/a")
    group = record.get("user_group")
    return f"{user} ({group})" if group else user


#: Each outcome as `mr decisions` shows it, with its colour.
OUTCOME_STYLES = {
    "ok": "green",
    "client_gone": "yellow",
    "backend_failed": "red",
    "timeout": "red",
    "rejected": "magenta",
    "error": "bold red",
}


def _outcome(record: Mapping[str, Any]) -> Text:
    outcome = str(record.get("outcome") or "n/a")
    return Text(outcome, style=OUTCOME_STYLES.get(outcome, "dim"))


COLUMNS = [
    Column("wall_time", "time", fmt=fmt_time, drop=5),
    Column("request_id", "request", style="bold"),
    Column("user", "user", getter=_user),
    Column("model", "model"),
    Column("selected_backend", "backend", getter=backend_label, style="cyan"),
    Column("queue_wait", "waited", fmt=fmt_duration, justify="right", drop=4),
    Column("priority", "priority", getter=_priority, fmt=lambda v: fmt_num(v, 1), justify="right", drop=3),
    Column("scores", "score", getter=_score, fmt=lambda v: fmt_num(v, 1), justify="right", drop=2),
    Column("candidate_backends", "candidates", fmt=lambda v: fmt_num(len(v or [])), justify="right", drop=1),
    Column("outcome", "outcome", getter=_outcome),
]


def decision_line(record: Mapping[str, Any], width: int = 200) -> RenderableType:
    """One decision for ``--follow``, where a table cannot grow: on one line of ``width`` when it fits, its
    columns aligned where there is room and its priority and score left out where there is not; else its
    values wrapped between them (never inside one) under the time."""
    parts = [
        (f"{record.get('request_id', 'n/a')!s}", "bold", 12),
        (_user(record), "", 16),
        (f"{record.get('model', 'n/a')!s}", "", 12),
        (f"→ {backend_label(record)}", "cyan", 10),
    ]
    tail = [(_outcome(record), f"waited {fmt_duration(record.get('queue_wait'))}")]
    extra = f"priority {fmt_num(_priority(record), 1)}  score {fmt_num(_score(record), 1)}"
    when = fmt_time(record.get("wall_time"))

    def body(padded: bool, with_extra: bool) -> Text:
        text = Text()
        for value, style, pad in parts:
            text.append(value.ljust(pad) if padded else value, style=style)
            text.append(" ")
        outcome, waited = tail[0]
        text.append(outcome)
        text.append(f" {waited}")
        if with_extra:
            text.append(f"  {extra}", style="dim")
        return text

    for padded, with_extra in ((True, True), (True, False), (False, False)):
        line = body(padded, with_extra)
        if len(when) + 2 + line.cell_len <= width:
            return Text.assemble((when, "dim"), "  ", line)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column()
    grid.add_row(when, body(False, False))
    return grid


def _key(record: Mapping[str, Any]) -> tuple[Any, Any]:
    return record.get("request_id"), record.get("attempt")


def decisions(
    ctx: typer.Context,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing decisions as they happen, until Ctrl-C.")
    ] = False,
    limit: Annotated[
        str | None,
        typer.Option(
            "--limit",
            "-n",
            metavar="N",
            help="How many recent decisions to show first (default 20, or 10 with --follow).",
            show_default=False,
        ),
    ] = None,
    user: Annotated[
        str | None,
        typer.Option(
            "--user",
            "-u",
            metavar="U",
            help="Only this user's requests.",
            autocompletion=complete_from("/admin/users"),
            show_default=False,
        ),
    ] = None,
    json: Annotated[bool, typer.Option("--json", help="Print one JSON record per line.")] = False,
    config: ConfigOption = None,
) -> None:
    """Show recent routing decisions: who, which model, which backend won, how long it waited.

    Explain one of them in full with `mr why REQUEST_ID`.

    Example: mr decisions --follow --user alice
    """
    count = _validate.limit(limit) or (10 if follow else 20)
    client = get_app(ctx, config).client
    recent: list[dict[str, Any]] = client.get("/admin/decisions", limit=count, user=user)
    if not follow:
        if json:
            print_json_lines(recent)
        else:
            empty = "no decisions yet" + (f" for {user}" if user else "")
            print_table(table(recent, COLUMNS, empty=empty), **fit_hints(COLUMNS))
        return
    seen = {_key(r) for r in recent}
    out = console()
    try:
        _show(recent, json, out)
        stream = client.stream("/admin/decisions/stream", user=user)
        for record in stream:
            if _key(record) in seen:
                seen.discard(_key(record))
                continue
            _show([record], json, out)
    except KeyboardInterrupt:
        return
    raise DaemonUnreachable(
        f"the daemon at {client.socket_path} closed the decision stream; is `mr serve` still running?"
    )


def _show(records: Iterable[Mapping[str, Any]], as_json: bool, out: Any) -> None:
    if as_json:
        print_json_lines(records)
        return
    for record in records:
        out.print(decision_line(record, out.width))
        out.file.flush()


def register(app: typer.Typer) -> None:
    app.command("decisions")(decisions)
