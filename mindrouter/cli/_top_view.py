"""The ``mr top`` screen as a pure function: ``/admin/top`` JSON and a terminal size in, a rich renderable out.

No I/O and no clock of its own (``now`` is passed in), so a test renders a
frame on a recorded console of fixed size and reads it back as text.

Layout: a header line (version, uptime, requests/s, tokens/s, queue), then
the sections backends (with a tokens/s sparkline each), quota warnings (only
when a user is above 80% of a quota), GPUs, queue by user and model, fair
share (a bar of actual against target share per user), today's usage (top
users and models) and the last decisions. Columns are as wide as their
content and no value is cut: when the terminal is narrow the least important
columns are left out, and when even the rest cannot fit (a long name) the
section's rows become blocks of lines. The height is shared out exactly: each
shown section gets at least one row (a line), then rows are handed out in
turn; a section that is cut ends with "… N more". When the terminal is short
the least important sections are left out (decisions, then today's usage,
then GPUs, then queue).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..formats import fmt_duration, fmt_num, fmt_tokens
from ._output import safe_cell
from ._top_sections import Col, Section, clock, sections

__all__ = ["Section", "allocate", "render_top"]


def allocate(wanted: Sequence[int], space: int, order: Sequence[int] | None = None) -> list[int]:
    """Share ``space`` lines among sections wanting ``wanted`` rows.

    Each section first gets one row (in ``order``, most important first), then
    the most important ones are filled up in that order. Returns the rows
    each gets; their total never exceeds ``space``.
    """
    order = list(range(len(wanted))) if order is None else list(order)
    got = [0] * len(wanted)
    left = max(0, space)
    for i in order:
        if left and wanted[i] > 0:
            got[i] = 1
            left -= 1
    for i in order:
        extra = min(left, wanted[i] - got[i])
        if extra > 0:
            got[i] += extra
            left -= extra
    return got


# -- assembly ---------------------------------------------------------------------------------


def _widths(
    columns: list[Col], cells: list[list[Text]], width: int
) -> tuple[list[Col], list[list[Text]], list[int]] | None:
    """The columns that fit ``width``, each as wide as its widest value or header, the least important dropped
    until they fit; None when even the columns that are never dropped do not (the rows become blocks)."""
    cols, cells = list(columns), [list(row) for row in cells]

    def natural(i: int) -> int:
        return max([Text(cols[i].header).cell_len, *(r[i].cell_len for r in cells)])

    while sum(natural(i) + 1 for i in range(len(cols))) > width + 1:
        droppable = [i for i, c in enumerate(cols) if c.drop]
        if not droppable:
            return None
        gone = max(droppable, key=lambda i: (cols[i].drop, i))
        del cols[gone]
        for row in cells:
            del row[gone]
    return cols, cells, [natural(i) for i in range(len(cols))]


def _blocks(section: Section, cells: list[list[Text]], width: int, lines: int) -> list[Text]:
    """Rows as blocks when a row cannot fit one line whole: its first value, then "header value" pairs filling
    lines of ``width`` (a pair longer than a line folds, never cut); at most ``lines`` lines, the last saying how
    many rows did not fit."""
    out: list[Text] = []
    for n, row in enumerate(cells):
        block = [row[0].copy()]
        for col, value in zip(section.columns[1:], row[1:], strict=True):
            if not value.plain.strip():
                continue
            pair = Text.assemble((f"{col.header} " if col.header else "", "dim"), value)
            if block[-1].cell_len + 2 + pair.cell_len <= width:
                block[-1].append("  ")
                block[-1].append_text(pair)
            else:
                block.append(Text("  ").append_text(pair))
        folded = [part for line in block for part in line.wrap(Console(width=width), width, overflow="fold")]
        left = len(cells) - n
        if len(out) + len(folded) > lines - (1 if left > 1 else 0):
            out.append(Text(f"… {left} more", style="dim"))
            return out[:lines]
        out.extend(folded)
    return out


def _wanted(section: Section, width: int, height: int) -> int:
    """The lines ``section``'s rows want below its header: one a row, or its blocks' lines (the header line
    theirs too) when a row cannot fit whole; only the rows a screen of ``height`` could show are measured."""
    if not section.rows:
        return 1
    cells = [[safe_cell(col.cell(row)) for col in section.columns] for row in section.rows[:height]]
    if _widths(section.columns, cells, width) is not None:
        return len(section.rows)
    return max(1, len(_blocks(section, cells, width, 10 * height)) - 1)


def _table(section: Section, width: int, rows: int) -> RenderableType:
    title = section.title.copy()
    title.truncate(width, overflow="ellipsis")
    if not section.rows:  # no header over nothing: the title and one sentence
        empty = Text(section.empty, style="dim")
        empty.truncate(width, overflow="ellipsis")
        return Group(title, empty)
    items = section.rows
    cut = 1 < rows < len(items)  # one line left: better the top row than only "… N more"
    shown = [[safe_cell(col.cell(row)) for col in section.columns] for row in items[: rows - 1 if cut else rows]]
    fitted = _widths(section.columns, shown, width)
    if fitted is None:  # the header line is a block's too: the rows get it
        every = [[safe_cell(col.cell(row)) for col in section.columns] for row in items]
        return Group(title, *_blocks(section, every, width, rows + 1))
    cols, cells, widths = fitted
    t = Table(
        box=None,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        expand=False,
        header_style="bold dim",
    )
    for col, fixed in zip(cols, widths, strict=True):
        t.add_column(col.header, justify=col.justify, no_wrap=True, width=fixed)  # type: ignore[arg-type]
    for row in cells:
        t.add_row(*row)
    if cut:
        t.add_row(Text(f"… {len(items) - rows + 1} more", style="dim"), *[""] * (len(cols) - 1))
    return Group(title, t)


def _header(data: Mapping[str, Any] | None, width: int, now: float | None) -> Text:
    status = (data or {}).get("status") or {}
    text = Text()
    text.append("mindrouter" if width >= 80 else "mr", style="bold")
    if status.get("version") and width >= 100:
        text.append(f" {status['version']}")
    parts = [
        f"up {fmt_duration(status.get('uptime_seconds'))}",
        f"{fmt_num(status.get('requests_per_second'), 1)} req/s",
        f"{fmt_tokens(status.get('tokens_per_second'))} tok/s",
        f"queue {fmt_num(status.get('queue_total'))}",
        f"running {fmt_num(status.get('running'))}",
    ]
    text.append("  " + " · ".join(parts))
    right = f"{clock(now)}  q quits" if now is not None else "q quits"
    gap = width - text.cell_len - len(right)
    if gap >= 2:
        text.append(" " * gap)
        text.append(right, style="dim")
    text.truncate(width, overflow="ellipsis")
    return text


def render_top(
    data: Mapping[str, Any] | None,
    width: int,
    height: int,
    *,
    socket: str = "",
    error: str | None = None,
    now: float | None = None,
) -> RenderableType:
    """One frame of ``mr top``.

    Args:
        data: the ``/admin/top`` answer, or None before the first one came.
        width, height: the terminal's size in cells; the frame never exceeds it.
        socket: the admin socket, named when the daemon is away.
        error: why the last poll failed; shown as a banner over the last data.
        now: wall-clock time for the header. Defaults to not showing it.
    """
    width = max(20, width)
    height = max(3, height)
    lines: list[RenderableType] = [_header(data, width, now)]
    if error is not None:
        banner = Text(f" {error} ", style="bold white on red")
        banner.truncate(width, overflow="ellipsis")
        lines.append(banner)
    standby = ((data or {}).get("status") or {}).get("standby")
    if standby:  # its panels are empty: say why, and where the pool's state is (whole, however narrow)
        lines.append(Text(str(standby), style="bold black on yellow"))
    if data is None:
        lines.append(Text("waiting for the daemon…", style="dim"))
        return Group(*lines)

    bars = 10 if width >= 140 else 6
    shown = sections(data, bars)
    space = height - len(lines)
    # Leave out the least important sections until each kept one has its title, header and a row.
    while shown and space < sum(3 for _ in shown):
        shown.remove(max(shown, key=lambda s: s.rank))
    space -= 2 * len(shown)
    wanted = [_wanted(s, width, height) for s in shown]
    gaps = len(shown) - 1 if space - sum(wanted) >= len(shown) - 1 else 0
    ranks = sorted(range(len(shown)), key=lambda i: shown[i].rank)
    got = allocate(wanted, space - gaps, ranks)
    for i, (section, rows) in enumerate(zip(shown, got, strict=True)):
        if i and gaps:
            lines.append(Text(""))
        lines.append(_table(section, width, rows))
    return Group(*lines)
