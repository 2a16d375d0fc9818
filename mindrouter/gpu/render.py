"""Rich renderables for GPU readings, shared by ``mr gpu`` and ``mr top``.

Pure functions of the readings: tests render them on a recorded console of
fixed width. The memory bar draws filled and empty cells with different
characters, so it still reads under NO_COLOR or in a pipe.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from ..formats import NA
from .probe import GpuReading

__all__ = ["gpu_table", "no_gpu_sentence", "vram_bar"]

_GIB = 1024**3


def no_gpu_sentence(reason: str | None) -> str:
    """What ``mr gpu`` says on a machine where NVML finds nothing."""
    return f"No NVIDIA GPU found on this machine (NVML: {reason or 'no device'}); GPU columns will read n/a."


def _bar_style(fraction: float) -> str:
    return "red" if fraction >= 0.9 else "yellow" if fraction >= 0.7 else "green"


def vram_bar(used: int | None, total: int | None, *, width: int = 10, ascii: bool = False) -> Text:
    """``█████░░░░░ 40.1/80.0 GiB``, or ``n/a`` when either number is unknown."""
    if used is None or total is None or total <= 0:
        return Text(NA, style="dim")
    fraction = min(1.0, max(0.0, used / total))
    filled = round(fraction * width)
    full, empty = ("#", ".") if ascii else ("█", "░")
    text = Text()
    text.append(full * filled, style=_bar_style(fraction))
    text.append(empty * (width - filled), style="dim")
    text.append(f" {used / _GIB:.1f}/{total / _GIB:.1f} GiB")
    return text


def _pct(value: int | None) -> Text:
    if value is None:
        return Text(NA, style="dim")
    return Text(f"{value}%", style=_bar_style(value / 100))


def _power(draw: float | None, limit: float | None) -> str:
    if draw is None:
        return NA
    return f"{draw:.0f} W" if limit is None else f"{draw:.0f}/{limit:.0f} W"


def gpu_table(readings: Sequence[GpuReading], *, title: str | None = None, ascii: bool = False) -> Table:
    """One row per GPU: index, name, memory bar, utilization, temperature, power, processes."""
    table = Table(title=title, title_justify="left", box=None, pad_edge=False, header_style="bold")
    table.add_column("GPU", justify="right")
    table.add_column("Name", overflow="fold")
    table.add_column("Memory", no_wrap=True)
    table.add_column("Util", justify="right")
    table.add_column("Mem util", justify="right")
    table.add_column("Temp", justify="right", no_wrap=True)
    table.add_column("Power", justify="right", no_wrap=True)
    table.add_column("Procs", justify="right")
    for r in readings:
        table.add_row(
            NA if r.index is None else str(r.index),
            r.name or NA,
            vram_bar(r.memory_used, r.memory_total, ascii=ascii),
            _pct(r.utilization_gpu),
            _pct(r.utilization_memory),
            NA if r.temperature_c is None else f"{r.temperature_c} °C" if not ascii else f"{r.temperature_c} C",
            _power(r.power_w, r.power_limit_w),
            NA if r.processes is None else str(len(r.processes)),
        )
    return table
