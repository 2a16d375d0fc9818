"""Numbers, durations and times as people read them, shared by the terminal (``mr``) and the web UI (``/ui/``).

Plain strings only, no rich and no jinja2, so the daemon can show the same
figures as ``mr`` without importing the terminal's modules. Anything that is
not a finite number reads as "n/a".
"""

from __future__ import annotations

import math
import time
from typing import Any

__all__ = [
    "NA",
    "finite",
    "fmt_age",
    "fmt_bool",
    "fmt_bytes",
    "fmt_count",
    "fmt_duration",
    "fmt_list",
    "fmt_num",
    "fmt_pct",
    "fmt_speeds",
    "fmt_time",
    "fmt_tokens",
]

NA = "n/a"


def finite(value: Any) -> float | None:
    """``value`` as a finite float, or ``None`` for anything else (missing, text, a bool, NaN, infinite)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def fmt_num(value: Any, digits: int = 2) -> str:
    """A number without noise: 3, 2.5, 0.33, -1,200."""
    number = finite(value)
    if number is None:
        return NA
    if number.is_integer() and abs(number) < 1e15:
        return f"{int(number):,}"
    return f"{number:,.{digits}f}".rstrip("0").rstrip(".")


def fmt_tokens(value: Any) -> str:
    """Token counts the way people read them: 950, 12.3k, 4.1M."""
    number = finite(value)
    if number is None:
        return NA
    sign = "-" if number < 0 else ""
    number = abs(number)
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if number >= size:
            return f"{sign}{number / size:.1f}{unit}"
    return f"{sign}{number:.0f}"


def fmt_pct(value: Any, digits: int = 0) -> str:
    """A fraction (0..1) as a percentage."""
    number = finite(value)
    return NA if number is None else f"{number * 100:.{digits}f}%"


def fmt_duration(value: Any) -> str:
    """Seconds as 850ms, 4.2s, 3m 05s, 2h 10m, 3d 4h."""
    seconds = finite(value)
    if seconds is None:
        return NA
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def fmt_bytes(value: Any) -> str:
    """Bytes in binary units: 512 MiB, 23.5 GiB."""
    number = finite(value)
    if number is None:
        return NA
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if number >= size:
            return f"{number / size:.1f} {unit}"
    return f"{number:.0f} B"


def fmt_count(value: Any) -> str:
    """A count, or the length of a list given in its place."""
    if isinstance(value, (list, tuple, dict)):
        return fmt_num(len(value))
    return fmt_num(value)


def fmt_bool(value: Any) -> str:
    return NA if value is None else ("yes" if value else "no")


def fmt_list(value: Any) -> str:
    if not value:
        return "-"
    if isinstance(value, str):
        return value
    return ", ".join(str(v) for v in value)


def fmt_speeds(value: Any) -> str:
    """Per-model decode rates a backend has shown (``model_speeds``), fastest first: "llama3 95, coder 61"."""
    if not isinstance(value, dict):
        return "-"
    rates = [(m, finite(s.get("decode"))) for m, s in value.items() if isinstance(s, dict)]
    known = sorted(((r, str(m)) for m, r in rates if r is not None), reverse=True)
    return ", ".join(f"{m} {fmt_num(r, 0)}" for r, m in known) or "-"


def fmt_time(value: Any) -> str:
    """A wall-clock time (epoch seconds) as local HH:MM:SS, with the date when not today."""
    stamp = finite(value)
    if stamp is None:
        return NA
    local = time.localtime(stamp)
    if time.strftime("%Y-%m-%d", local) == time.strftime("%Y-%m-%d"):
        return time.strftime("%H:%M:%S", local)
    return time.strftime("%Y-%m-%d %H:%M:%S", local)


def fmt_age(value: Any, now: float | None = None) -> str:
    """How long ago a wall-clock time was."""
    stamp = finite(value)
    if stamp is None:
        return NA
    return fmt_duration(max(0.0, (time.time() if now is None else now) - stamp)) + " ago"
