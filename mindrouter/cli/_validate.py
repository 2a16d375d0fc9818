"""Checks of command-line input, made before anything is sent to the daemon.

Each check returns the clean value or raises ``UsageError`` (exit 2) with one
sentence naming the option, the value and what would be accepted, so a typo
never reaches the pool half-applied. Numeric options are taken as text and
checked here, rather than by typer, so that every refusal reads the same way
(``mr: ...`` on one line) instead of some of them in typer's error panel.
"""

from __future__ import annotations

import math
import re
import time

from .. import names
from ..errors import UsageError
from ..localtime import parse_when
from ..scheduler.settings import check_weight

__all__ = ["amount", "engine", "gpus", "key_id", "limit", "max_concurrent", "name", "priority", "url", "weight", "when"]


def weight(value: object, what: str = "weight") -> float:
    """A fair-share weight: a finite number greater than 0."""
    try:
        return check_weight(value)
    except ValueError as exc:
        message = str(exc)
        if what != "weight":
            message = f"{what}: {message}"
        raise UsageError(message) from None


def name(value: str, what: str) -> str:
    """A group, user or backend name: 1 to 64 letters, digits and . _ - @ +."""
    try:
        return names.check_name(what, value)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def url(value: str, option: str = "URL") -> str:
    """An http(s) URL with a host, without a trailing slash."""
    try:
        return names.check_url(value, option)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def engine(value: str | None) -> str:
    if value is None:
        raise UsageError(f"--engine is required; say which server runs there: {', '.join(names.ENGINES)}")
    clean = value.strip().lower().replace(".", "").replace("-", "")
    if clean == "llamacppserver" or clean == "llamaserver":
        clean = "llamacpp"
    if clean not in names.ENGINES:
        raise UsageError(f"--engine {value!r} is not known; use one of {', '.join(names.ENGINES)}")
    return clean


def person_from(value: str | None) -> str | None:
    """``--person-from``: where a proxy's requests name their person (``names.PERSON_FROM``)."""
    if value is None or value in names.PERSON_FROM:
        return value
    raise UsageError(
        f"--person-from {value!r} is not known; use header (forwarding headers) or user-field "
        '(OpenAI\'s "user" body field)'
    )


def _int(value: str, option: str, minimum: int, example: str, maximum: int | None = None) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise UsageError(f"{option} {value!r} is not a whole number; use {example}") from None
    if number < minimum:
        raise UsageError(f"{option} {value!r} must be at least {minimum}; use {example}")
    if maximum is not None and number > maximum:
        raise UsageError(f"{option} {value!r} must be at most {maximum:,}; use {example}")
    return number


_AMOUNT = re.compile(r"(\d+(?:\.\d+)?)\s*([kKmMgG]?)\Z")
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


def amount(value: str | None, option: str) -> int | None:
    """A count such as 2M, 500k or 1500 (k, M and G are thousands, millions and billions)."""
    if value is None:
        return None
    match = _AMOUNT.match(value.strip())
    if not match:
        raise UsageError(f"{option} {value!r} is not a count; use a whole number such as 2000000, or 2M, 500k")
    number = float(match.group(1)) * _SCALE[match.group(2).lower()]
    if not number.is_integer():
        raise UsageError(f"{option} {value!r} is not a whole number; use such as 2M or 1500")
    return int(number)


def max_concurrent(value: str | None) -> int | None:
    """Requests a backend may serve at once: a whole number of at least 1."""
    return (
        None
        if value is None
        else _int(value, "--max-concurrent", 1, "a whole number of at least 1, such as 4", 100_000)
    )


def slots(value: str | None, option: str) -> int | None:
    """Ollama's per-model slots or loaded models: a whole number from 1 to 1000."""
    return None if value is None else _int(value, option, 1, "a whole number of at least 1, such as 4", 1000)


def limit(value: str | None, option: str = "--limit") -> int | None:
    return None if value is None else _int(value, option, 1, "a whole number of at least 1, such as 50", 10_000)


def key_id(value: str) -> int:
    """A key's id as `mr user keys` lists it."""
    return _int(value, "--revoke", 1, "an id from `mr user keys NAME`, such as 3")


def gpus(value: str | None) -> list[int] | None:
    """GPU indexes as a comma list, such as ``0,1``."""
    if value is None:
        return None
    items = [item.strip() for item in value.split(",")]
    out: list[int] = []
    for item in items:
        if not item.isdigit():
            raise UsageError(f"--gpus {value!r} is not a comma list of GPU indexes; write it like 0 or 0,1")
        index = int(item)
        if index in out:
            raise UsageError(f"--gpus {value!r} names GPU {index} twice; name each GPU once, like 0,1")
        out.append(index)
    return out


def priority(value: str | None) -> float | None:
    """Points added to a backend's score: any finite number (negative makes it a fallback)."""
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        raise UsageError(
            f"--priority {value!r} is not a number; use points such as 10, or -10 for a fallback backend"
        ) from None
    if not math.isfinite(number):
        raise UsageError(f"--priority {value!r} must be a finite number, such as 10 or -10")
    return number


def when(value: str, option: str) -> str:
    """``--since``/``--until``: checked here with the daemon's own parser, and sent as typed (the daemon reads
    dates in its own zone)."""
    try:
        parse_when(value, time.time())
    except ValueError as exc:
        raise UsageError(f"{option} {exc}") from None
    return value.strip()
