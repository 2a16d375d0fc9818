"""Fitting a rich table to the terminal with every value whole (issue 21).

rich narrows the widest columns first when a table is too wide, below their longest word, and
splits it (``facul``/``ty``, a URL over five lines); ``fit`` measures each column's longest word,
takes short headers, hides the columns a command ranks least important, and fixes the widths;
``fitted`` falls back to one block of lines per row when even that cannot fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

__all__ = ["Fitted", "fit", "fitted"]

_UNBOUNDED = 100_000


def fit(
    t: Table,
    out: Console,
    *,
    short: Mapping[str, str] | None = None,
    drop: Sequence[str] = (),
    width: int | None = None,
) -> list[str]:
    """Make ``t`` fit ``width`` (default: ``out``'s) with every value whole: a narrow terminal first gets the
    ``short`` headers, then loses the ``drop`` columns in that order. Returns the lines that say so, for under
    the table.

    A value is never cut or split: each column is at least as wide as its longest word (rich wraps only
    between words), and when even that does not fit a column goes rather than a value.
    """
    width = out.width if width is None else width

    def fits() -> bool:
        return _least_width(t, out) <= width

    notes: list[str] = []
    if Measurement.get(out, out.options.update_width(_UNBOUNDED), t).maximum <= width:
        return notes
    by_header = {str(c.header): c for c in t.columns}
    legend: dict[str, str] = {}
    for header, abbreviation in (short or {}).items():
        if header in by_header:
            by_header[header].header = abbreviation
            legend[header] = abbreviation
    hidden: list[str] = []
    for header in drop:
        if fits():
            break
        if header in by_header:
            t.columns.remove(by_header[header])
            hidden.append(header)
            for index, column in enumerate(t.columns):  # rich pads by this position (edges); add_column sets it
                column._index = index
    if legend.keys() - set(hidden):
        notes.append(", ".join(f"{a}: {h}" for h, a in legend.items() if h not in hidden))
    if hidden:
        notes.append(f"not shown at {width} columns: {', '.join(hidden)} (a wider terminal or --json shows them)")
    _set_widths(t, out, width)
    return notes


def _least_width(t: Table, out: Console) -> int:
    """The narrowest ``t`` can be with no word split, and no ``no_wrap`` value cut (rich's own measure of a table
    takes a ``no_wrap`` column's longest word, not its longest value)."""
    return _overhead(t, out) + sum(_bounds(t, out)[0])


def _bounds(t: Table, out: Console) -> tuple[list[int], list[int]]:
    """Each column's least width that keeps its values whole (its longest word, or longest value when
    ``no_wrap``) and its natural width (its longest value), measured unbounded."""
    unbounded = out.options.update_width(_UNBOUNDED)
    ranges = [[Measurement.get(out, unbounded, cell) for cell in (c.header, *c.cells)] for c in t.columns]
    highs = [max(m.maximum for m in r) for r in ranges]
    lows = [
        high if c.no_wrap else max(m.minimum for m in r) for c, r, high in zip(t.columns, ranges, highs, strict=True)
    ]
    return lows, highs


def _overhead(t: Table, out: Console) -> int:
    """What padding and rules add to the columns' widths."""
    saved = [column.width for column in t.columns]
    for column in t.columns:
        column.width = 1
    overhead = Measurement.get(out, out.options.update_width(_UNBOUNDED), t).minimum - len(t.columns)
    for column, width in zip(t.columns, saved, strict=True):
        column.width = width
    return overhead


def _records(t: Table, headers: Sequence[tuple[Any, Any]]) -> RenderableType:
    """The rows of ``t`` as blocks of "header  value" lines, for a terminal too narrow for any table of them."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    blocks = [[column_cells[row] for column_cells in (list(c.cells) for c, _ in headers)] for row in range(t.row_count)]
    if t.show_footer:
        blocks.append([column.footer or "" for column, _ in headers])
    for i, block in enumerate(blocks):
        if i:
            grid.add_row("", "")
        for (_, header), cell in zip(headers, block, strict=True):
            grid.add_row(header, cell)
    title = Text(t.title, style="bold") if isinstance(t.title, str) else t.title
    return Group(title, grid) if title else grid


def _set_widths(t: Table, out: Console, width: int) -> None:
    """Fix each column's width: its longest word, and what is left to the columns that need least to be whole.

    rich would instead narrow the widest columns first, below their longest word, and split it.
    """
    lows, highs = _bounds(t, out)
    spare = width - _overhead(t, out) - sum(lows)
    wants = [high - low for low, high in zip(lows, highs, strict=True)]
    if spare < 0:
        for column in t.columns:
            column.width = None
        return  # nothing fits whole: the caller shows records instead
    gives = [0] * len(wants)
    for i in sorted(range(len(wants)), key=lambda i: wants[i]):  # the least wanting first: fewest columns wrap
        gives[i] = min(wants[i], spare)
        spare -= gives[i]
    for column, low, give in zip(t.columns, lows, gives, strict=True):
        column.width = low + give


def fitted(
    t: Table,
    out: Console,
    *,
    short: Mapping[str, str] | None = None,
    drop: Sequence[str] = (),
    width: int | None = None,
) -> tuple[RenderableType, list[str]]:
    """``t`` fitted to ``width`` (default: ``out``'s) and the lines for under it, or, when even its fewest columns
    cannot show each value whole, its rows as blocks of lines (every column, so nothing is hidden)."""
    width = out.width if width is None else width
    headers = [(column, column.header) for column in t.columns]
    lines = fit(t, out, short=short, drop=drop, width=width)
    if _least_width(t, out) > width:
        return _records(t, headers), []
    return t, lines


class Fitted:
    """A table that fits itself to the width it is drawn at (``fitted``), its notes under it in dim: for a
    table among other parts of a view (``mr why``, ``mr simulate``). Drawn once: fitting changes the table."""

    def __init__(self, t: Table, *, short: Mapping[str, str] | None = None, drop: Sequence[str] = ()) -> None:
        self.table, self.short, self.drop = t, short, drop

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        shown, notes = fitted(self.table, console, short=self.short, drop=self.drop, width=options.max_width)
        yield shown
        for note in notes:
            yield Text(note, style="dim")
