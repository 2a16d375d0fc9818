"""What a backend or a ``mr agent`` reports, checked for type and range where it is read.

Backends and agents run on students' and staff's workstations, so nothing
they say is trusted: a token count of ``1e400`` once turned fair-share
numbers into NaN and stalled a pool, a negative one credited its user and
drove a throughput score past its cap, a string count raised TypeErrors and
a huge one failed the batched usage write (issue 19). Every count, size,
duration, fraction and rate goes through one of the checks below: a value of
the wrong type (``"12"``, ``true``) or out of range (NaN, infinite, negative,
above the bound) reads as ``None``, "not reported", and the caller names it
to :func:`distrust`, which logs it once per backend and field, never once per
request. Text a backend supplies (model names, errors) is made safe for a
terminal or a log line by :func:`shown`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from .scheduler import TOKEN_LIMIT
from .scheduler.jobs import token_count

__all__ = [
    "BYTES_LIMIT",
    "COUNTER_LIMIT",
    "TOKEN_LIMIT",
    "count",
    "counter",
    "distrust",
    "fraction",
    "nbytes",
    "number",
    "shown",
]

log = logging.getLogger(__name__)

BYTES_LIMIT = 1 << 50
"""The most bytes a size may say (1 PiB: far above any GPU's memory or model file)."""
COUNTER_LIMIT = 1 << 53
"""The most an engine's running counter may say (the last integer a double holds exactly)."""

_WARNED_LIMIT = 4096
_warned: set[tuple[str, str]] = set()
"""(backend, field) pairs already logged; bounded, so a backend cannot grow it for ever."""


def number(value: Any, high: float, *, low: float = 0, integral: bool = False) -> float | int | None:
    """``value`` if it is a JSON number (not a bool) within ``[low, high]``, integral if asked; else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and (not math.isfinite(value) or (integral and not value.is_integer())):
        return None
    if not low <= value <= high:
        return None
    return int(value) if integral else value


def count(value: Any) -> int | None:
    """A token count: an integer from 0 to the core's ``TOKEN_LIMIT`` (the core's own rule, ``token_count``)."""
    return token_count(value)


def counter(value: Any) -> int | None:
    """An engine's running total since it started (tokens, requests): an integer up to ``COUNTER_LIMIT``."""
    checked = number(value, COUNTER_LIMIT, integral=True)
    return None if checked is None else int(checked)


def nbytes(value: Any) -> int | None:
    """A size in bytes (GPU memory, a model file): an integer up to ``BYTES_LIMIT``."""
    checked = number(value, BYTES_LIMIT, integral=True)
    return None if checked is None else int(checked)


def fraction(value: Any) -> float | None:
    """A share from 0 to 1 (KV-cache usage)."""
    checked = number(value, 1.0)
    return None if checked is None else float(checked)


def distrust(source: str, field: str, value: Any) -> None:
    """Log, once per ``source`` (a backend's or agent's URL) and ``field``, that ``value`` was dropped."""
    key = (source, field)
    if key in _warned or len(_warned) >= _WARNED_LIMIT:
        return
    _warned.add(key)
    log.warning(
        "%s reported %s=%s, which is not a believable value; it is ignored (logged once)",
        shown(source),
        shown(field, 80),
        shown(repr(value), 80),
    )


def shown(text: object, limit: int = 200) -> str:
    """``text`` safe for a terminal or one log line: control characters escaped, at most ``limit`` characters.

    Escape sequences (ESC[2J clears a screen), newlines (a forged line) and other
    non-printable characters are written as ``repr`` writes them.
    """
    value = text if isinstance(text, str) else str(text)
    if not value.isprintable():
        value = "".join(c if c.isprintable() else repr(c)[1:-1] for c in value)
    return value if len(value) <= limit else value[:limit] + "..."
