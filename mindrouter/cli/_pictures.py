"""Small pictures for the terminal, as nvitop and btop draw them: sparklines and share bars.

Each returns a rich ``Text`` of exactly the width asked for, so table columns
that hold them line up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.text import Text

__all__ = ["share_bar", "sparkline"]

_TICKS = " ▁▂▃▄▅▆▇█"
_EIGHTHS = " ▏▎▍▌▋▊▉█"


def sparkline(values: Sequence[float], width: int, top: float | None = None) -> Text:
    """The last ``width`` values as one row of bars, scaled so ``top`` (default: their maximum) is full."""
    shown = [v if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else 0.0 for v in values[-width:]]
    shown = [0.0] * (width - len(shown)) + shown
    peak = top if top and top > 0 else max(shown, default=0.0)
    if peak <= 0:
        return Text("▁" * width, style="dim")
    cells = "".join(_TICKS[min(8, math.ceil(v / peak * 8))] if v > 0 else "▁" for v in shown)
    return Text(cells, style="cyan")


def share_bar(actual: float | None, target: float | None, scale: float, width: int) -> Text:
    """A user's actual share as a bar, with ``│`` where its target share is; ``scale`` is the full width.

    Green while at or under the target (plus a tenth), yellow above it.
    """
    cells = [" "] * width
    a = max(0.0, actual or 0.0) / scale if scale > 0 else 0.0
    eighths = min(width * 8, round(a * width * 8))
    full, part = divmod(eighths, 8)
    for i in range(full):
        cells[i] = "█"
    if part and full < width:
        cells[full] = _EIGHTHS[part]
    style = "yellow" if (actual or 0) > (target or 0) * 1.1 else "green"
    plain = "".join(cells)
    if target is None or scale <= 0:
        return Text(plain, style=style)
    at = min(width - 1, int(target / scale * width))
    marker = "│" if plain[at] == " " else "┃"
    return Text.assemble((plain[:at], style), (marker, "bold"), (plain[at + 1 :], style))
