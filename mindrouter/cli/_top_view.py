"""The ``mr top`` screen as a pure function: ``/admin/top`` JSON and a terminal size in, a rich renderable out.

No I/O and no clock of its own (``now`` is passed in), so a test renders a
frame on a recorded console of fixed size and reads it back as text.

Layout: a header line (version, uptime, requests/s, tokens/s, queue), then
the sections backends, GPUs, queue by user and model, fair share and the last
decisions. Every row is one line (cells are cut with an ellipsis, never
wrapped), so the height can be shared out exactly: each shown section gets at
least one row, then rows are handed out in turn; a section that is cut ends
with "… N more". When the terminal is short the least important sections are
left out (decisions, then GPUs, then queue); when it is narrow the least
important columns are.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ._output import bar, factor_text, fmt_duration, fmt_list, fmt_num, fmt_pct, fmt_tokens, status_text
from .queue import user_model_rows

__all__ = ["Section", "allocate", "render_top"]

Cell = str | Text


@dataclass
class _Col:
    header: str
    cell: Callable[[Mapping[str, Any]], Cell]
    min_width: int
    """Columns are dropped, least important first, until the minimum widths fit."""
    justify: str = "left"
    ratio: int | None = None
    drop: int = 0
    """Higher is dropped sooner on a narrow terminal; 0 is never dropped."""


@dataclass
class Section:
    """One block of the screen: a title line, a header line, then one line per row."""

    title: Text
    columns: list[_Col]
    rows: Sequence[Mapping[str, Any]]
    empty: str
    rank: int
    """Which section goes first when the terminal is too short (lower stays longer)."""
    shown: int = field(default=0)

    @property
    def wanted(self) -> int:
        return max(1, len(self.rows))


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


# -- cells --------------------------------------------------------------------------------


def _vram_fraction(free: Any, total: Any) -> float | None:
    try:
        total_f = float(total)
        return (total_f - float(free)) / total_f if total_f > 0 else None
    except (TypeError, ValueError):
        return None


def _gpu_util(row: Mapping[str, Any]) -> float | None:
    value = row.get("utilization_gpu")
    return None if value is None else float(value) / 100.0


def _gpu_mem(row: Mapping[str, Any]) -> float | None:
    try:
        return float(row["memory_used"]) / float(row["memory_total"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def _load(row: Mapping[str, Any]) -> Text:
    text = Text(f"{fmt_num(row.get('in_flight'))}/{fmt_num(row.get('max_concurrent'))}")
    try:
        if int(row.get("in_flight") or 0) >= int(row.get("max_concurrent") or 1):
            text.stylize("yellow")
    except (TypeError, ValueError):
        pass
    return text


def _clock(value: Any) -> str:
    try:
        return time.strftime("%H:%M:%S", time.localtime(float(value)))
    except (TypeError, ValueError, OverflowError):
        return "n/a"


def _selected_score(record: Mapping[str, Any]) -> Any:
    return (record.get("scores") or {}).get(str(record.get("selected_backend_id")))


# -- sections --------------------------------------------------------------------------------


def _backends(data: Mapping[str, Any], bars: int) -> Section:
    rows = sorted(data.get("backends") or [], key=lambda b: str(b.get("name")))
    cols = [
        _Col("backend", lambda r: Text(str(r.get("name")), style="bold"), 8, ratio=2),
        _Col("status", lambda r: status_text(r.get("status")), 9),
        _Col("load", _load, 5, "right"),
        _Col("gpu", lambda r: bar(r.get("utilization"), bars), bars + 5, drop=3),
        _Col("vram", lambda r: bar(_vram_fraction(r.get("vram_free"), r.get("vram_total")), bars), bars + 5, drop=4),
        _Col("latency", lambda r: fmt_duration(r.get("latency_ema")), 7, "right", drop=5),
        _Col("tok/s", lambda r: fmt_num(r.get("tokens_per_second"), 1), 6, "right", drop=6),
        _Col("loaded models", lambda r: Text(fmt_list(r.get("loaded_models")), style="green"), 13, ratio=3, drop=2),
    ]
    healthy = sum(1 for r in rows if r.get("status") == "healthy")
    title = Text("Backends", style="bold")
    title.append(f"  {healthy} of {len(rows)} healthy", style="dim")
    return Section(title, cols, rows, "no backends; add one with `mr backend add NAME URL --engine ollama`", rank=0)


def _gpus(data: Mapping[str, Any], bars: int) -> Section:
    rows: list[dict[str, Any]] = []
    for node in data.get("gpus") or []:
        for gpu in node.get("gpus") or []:
            rows.append({**gpu, "_node": node.get("node"), "_stale": node.get("stale")})
    cols = [
        _Col("node", lambda r: Text(str(r.get("_node")), style="dim" if r.get("_stale") else ""), 6, ratio=1),
        _Col("gpu", lambda r: f"{fmt_num(r.get('index'))} {r.get('name') or ''}".strip(), 5, ratio=2),
        _Col("util", lambda r: bar(_gpu_util(r), bars), bars + 5),
        _Col("memory", lambda r: bar(_gpu_mem(r), bars), bars + 5, drop=2),
        _Col(
            "temp", lambda r: "n/a" if r.get("temperature_c") is None else f"{r['temperature_c']}°C", 5, "right", drop=3
        ),
        _Col("", lambda r: Text("stale", style="yellow") if r.get("_stale") else "", 5, drop=1),
    ]
    return Section(Text("GPUs", style="bold"), cols, rows, "no GPU readings", rank=3)


def _queue(data: Mapping[str, Any]) -> Section:
    q = (data.get("queue") or {}).get("queue") or {}
    rows = user_model_rows(q)
    cols = [
        _Col("user", lambda r: Text(str(r.get("user")), style="bold"), 6, ratio=2),
        _Col("model", lambda r: str(r.get("model")), 6, ratio=2),
        _Col("queued", lambda r: fmt_num(r.get("queued")), 6, "right"),
        _Col("oldest wait", lambda r: fmt_duration(r.get("oldest_wait_seconds")), 11, "right", drop=1),
    ]
    title = Text("Queue", style="bold")
    title.append(
        f"  {fmt_num(q.get('total', 0))} queued · {fmt_num(q.get('running', 0))} running"
        + (
            f" · avg wait {fmt_duration(q.get('average_wait_seconds'))} · oldest {fmt_duration(q.get('oldest_wait_seconds'))}"
            if q.get("total")
            else ""
        ),
        style="dim",
    )
    return Section(title, cols, rows, "nothing queued", rank=2)


def _share(data: Mapping[str, Any]) -> Section:
    share = data.get("share") or {}
    rows = sorted(share.get("users") or [], key=lambda u: (-float(u.get("actual_share") or 0), str(u.get("name"))))
    cols = [
        _Col("user", lambda r: Text(str(r.get("name")), style="bold"), 6, ratio=2),
        _Col("group", lambda r: str(r.get("group")), 6, ratio=1, drop=4),
        _Col("weight", lambda r: fmt_num(r.get("weight")), 6, "right"),
        _Col("target", lambda r: fmt_pct(r.get("normalized_share"), 1), 6, "right"),
        _Col("actual", lambda r: fmt_pct(r.get("actual_share"), 1), 6, "right"),
        _Col("deficit", lambda r: fmt_num(r.get("deficit"), 0), 8, "right", drop=2),
        _Col("burst", lambda r: fmt_tokens(r.get("burst_credits")), 6, "right", drop=3),
        _Col("factor", lambda r: factor_text(r.get("factor")), 6, "right", drop=1),
    ]
    title = Text("Fair share", style="bold")
    title.append(
        f"  last {fmt_duration(share.get('window_seconds'))} · {fmt_tokens(share.get('global_recent_tokens'))} tokens",
        style="dim",
    )
    return Section(title, cols, rows, "no users yet", rank=1)


def _decisions(data: Mapping[str, Any]) -> Section:
    rows = list(reversed(data.get("decisions") or []))  # newest first
    cols = [
        _Col("time", lambda r: _clock(r.get("wall_time")), 8, drop=3),
        _Col("request", lambda r: str(r.get("request_id")), 8, ratio=2),
        _Col("user", lambda r: str(r.get("user") or r.get("user_id")), 6, ratio=1),
        _Col("model", lambda r: str(r.get("model")), 6, ratio=2, drop=2),
        _Col(
            "backend",
            lambda r: Text(str(r.get("selected_backend") or r.get("selected_backend_id")), style="cyan"),
            7,
            ratio=1,
        ),
        _Col("waited", lambda r: fmt_duration(r.get("queue_wait")), 6, "right", drop=1),
        _Col("score", lambda r: fmt_num(_selected_score(r), 1), 6, "right", drop=4),
    ]
    return Section(Text("Last decisions", style="bold"), cols, rows, "no decisions yet", rank=4)


# -- assembly ---------------------------------------------------------------------------------


def _fit_columns(columns: list[_Col], width: int) -> list[_Col]:
    """Drop the least important columns until the minimum widths (and one space each) fit."""
    cols = list(columns)
    while sum(c.min_width + 1 for c in cols) > width + 1:
        droppable = [c for c in cols if c.drop]
        if not droppable:
            break
        cols.remove(max(droppable, key=lambda c: (c.drop, cols.index(c))))
    return cols


#: Tables stop growing here: past it, wider name columns only spread the numbers apart.
TABLE_MAX_WIDTH = 120


def _table(section: Section, width: int, rows: int) -> RenderableType:
    width = min(width, TABLE_MAX_WIDTH)
    cols = _fit_columns(section.columns, width)
    title = section.title.copy()
    title.truncate(width, overflow="ellipsis")
    if not section.rows:  # no header over nothing: the title and one sentence
        empty = Text(section.empty, style="dim")
        empty.truncate(width, overflow="ellipsis")
        return Group(title, empty)
    t = Table(
        box=None,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        expand=True,
        width=width,
        header_style="bold dim",
        title=title,
        title_justify="left",
    )
    for col in cols:
        t.add_column(
            col.header, justify=col.justify, no_wrap=True, overflow="ellipsis", min_width=col.min_width, ratio=col.ratio
        )  # type: ignore[arg-type]
    items = section.rows
    cut = 1 < rows < len(items)  # one line left: better the top row than only "… N more"
    for row in items[: rows - 1 if cut else rows]:
        t.add_row(*(col.cell(row) for col in cols))
    if cut:
        t.add_row(Text(f"… {len(items) - rows + 1} more", style="dim"), *[""] * (len(cols) - 1))
    return t


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
    right = f"{_clock(now)}  q quits" if now is not None else "q quits"
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
    if data is None:
        lines.append(Text("waiting for the daemon…", style="dim"))
        return Group(*lines)

    bars = 10 if width >= 140 else 6
    sections = [_backends(data, bars), _gpus(data, bars), _queue(data), _share(data), _decisions(data)]
    if not any(node.get("gpus") for node in data.get("gpus") or []):
        sections.remove(sections[1])  # no GPU readings anywhere: the backends' bars say "n/a"
    space = height - len(lines)
    # Leave out the least important sections until each kept one has its title, header and a row.
    while sections and space < sum(3 for _ in sections):
        sections.remove(max(sections, key=lambda s: s.rank))
    space -= 2 * len(sections)
    gaps = len(sections) - 1 if space - sum(s.wanted for s in sections) >= len(sections) - 1 else 0
    ranks = sorted(range(len(sections)), key=lambda i: sections[i].rank)
    got = allocate([s.wanted for s in sections], space - gaps, ranks)
    for i, (section, rows) in enumerate(zip(sections, got, strict=True)):
        if i and gaps:
            lines.append(Text(""))
        lines.append(_table(section, width, rows))
    return Group(*lines)
