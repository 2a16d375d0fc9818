"""Printing: rows are dicts; ``--json`` prints them as they are, people get a rich table.

Data goes to stdout, hints to stderr. rich already honours ``NO_COLOR`` and
drops colour when stdout is not a terminal; when it is not a terminal and
``COLUMNS`` is unset we also widen the page, so a piped table is not wrapped
at 80 columns in the middle of a URL.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from ..formats import NA, finite
from ..reported import shown
from ._fit import fitted

__all__ = [
    "Column",
    "bar",
    "console",
    "err_console",
    "print_json",
    "print_json_lines",
    "print_rows",
    "print_table",
    "safe_cell",
    "status_text",
    "table",
]

_PIPE_WIDTH = 200


def console(stderr: bool = False) -> Console:
    """A console for the current stdout (or stderr), made per call so tests can swap streams."""
    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not stream.isatty() and not os.environ.get("COLUMNS"):
        width = _PIPE_WIDTH
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


def err_console() -> Console:
    return console(stderr=True)


def print_json(data: Any) -> None:
    """Print ``data`` as indented JSON on stdout (``--json``)."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")


def print_json_lines(records: Iterable[Mapping[str, Any]]) -> None:
    """Print one compact JSON object per line and flush each (``mr decisions --json``)."""
    for record in records:
        sys.stdout.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        sys.stdout.flush()


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a table: which key of the row, its header and how to show the value."""

    key: str
    header: str
    short: str | None = None
    """A shorter header for a narrow terminal, explained in a legend under the table."""
    drop: int = 0
    """Order in which a narrow terminal hides the column: 1 first, then 2...; 0 never."""
    fmt: Callable[[Any], str | Text] | None = None
    """Turns the raw value into text; defaults to ``str`` with ``None`` as "n/a"."""
    justify: JustifyMethod = "left"
    style: str | None = None
    min_width: int | None = None
    max_width: int | None = None
    getter: Callable[[Mapping[str, Any]], Any] | None = None
    """Reads the value from the whole row (for columns made of several keys)."""

    def cell(self, row: Mapping[str, Any]) -> str | Text:
        value = self.getter(row) if self.getter else row.get(self.key)
        if self.fmt is not None:
            return self.fmt(value)
        return NA if value is None else str(value)


def safe_cell(value: str | Text) -> Text:
    """A cell that shows what a backend or client named as it is: no rich markup read from it, and escape
    sequences and newlines escaped (``reported.shown``), so a model named ``ESC[2J`` cannot clear the screen."""
    if isinstance(value, Text):
        plain = value.plain
        return value if plain.isprintable() else Text(shown(plain, 10_000), style=value.style)
    return Text(shown(value, 10_000))


def titled_table(title: str | Text | None) -> Table:
    """An empty table in the CLI's one style: bold title on the left, a rule under the header, no edge."""
    return Table(
        title=title,
        box=box.SIMPLE_HEAD,
        show_edge=False,
        title_justify="left",
        title_style="bold",
        header_style="bold",
        pad_edge=False,
    )


def table(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], *, title: str | None = None, empty: str | None = None
) -> Table:
    """A rich table of ``rows``; ``empty`` is shown as its only row when there are none."""
    t = titled_table(title)
    for col in columns:
        t.add_column(
            col.header,
            justify=col.justify,
            style=col.style,
            min_width=col.min_width,
            max_width=col.max_width,
            overflow="fold",
        )
    for row in rows:
        t.add_row(*(safe_cell(col.cell(row)) for col in columns))
    if not rows and empty:
        t.add_row(Text(empty, style="dim"), *([""] * (len(columns) - 1)))
    return t


def print_rows(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[Column],
    *,
    as_json: bool,
    title: str | None = None,
    empty: str | None = None,
) -> None:
    """The list commands' output: a JSON array of the rows, or their table fitted to the terminal."""
    if as_json:
        print_json(list(rows))
        return
    print_table(table(rows, columns, title=title, empty=empty), **fit_hints(columns))


def fit_hints(columns: Sequence[Column]) -> dict[str, Any]:
    """``print_table``'s ``short`` and ``drop`` from the columns' own hints."""
    return {
        "short": {c.header: c.short for c in columns if c.short},
        "drop": [c.header for c in sorted((c for c in columns if c.drop), key=lambda c: c.drop)],
    }


def print_table(
    t: Table, *, short: Mapping[str, str] | None = None, drop: Sequence[str] = (), notes: Sequence[str] = ()
) -> None:
    """Print ``t`` fitted to the terminal (``fit``), then its legend and ``notes`` (such as long errors);
    when even its fewest columns cannot show each value whole, each row as a block of lines instead."""
    out = console()
    shown_as, lines = fitted(t, out, short=short, drop=drop)
    out.print(shown_as)
    for line in [*lines, *notes]:
        out.print(Text(line, style="dim"))


def bar(fraction: Any, width: int = 10) -> Text:
    """A horizontal bar for a fraction 0..1, coloured green/yellow/red; "n/a" when unknown."""
    number = finite(fraction)
    if number is None:
        return Text(NA, style="dim")
    number = min(1.0, max(0.0, number))
    filled = round(number * width)
    style = "green" if number < 0.6 else "yellow" if number < 0.85 else "red"
    text = Text("█" * filled, style=style)
    text.append("░" * (width - filled), style="dim")
    text.append(f" {number * 100:3.0f}%")
    return text


def status_text(status: Any) -> Text:
    """A backend status word in its colour."""
    styles = {"healthy": "green", "unhealthy": "red", "draining": "yellow", "drained": "dim"}
    word = str(status or "unknown")
    return Text(word, style=styles.get(word, ""))


def print_changed(row: Mapping[str, Any], as_json: bool, message: str) -> None:
    """After a change: the resulting row under --json, else one sentence for people."""
    if as_json:
        print_json(row)
    else:
        console().print(message)


def factor_text(value: Any) -> Text:
    """A deprioritization factor, highlighted when it is below 1."""
    number = finite(value)
    if number is None:
        return Text("n/a", style="dim")
    return Text(f"{number:.2f}", style="yellow" if number < 1 else "")
