"""The bounds on every number a client's inference body holds, checked once where it is read.

A number a backend cannot hold (a 400-digit ``max_tokens``, ``1e999``, ``NaN``)
used to pass here and fail deep inside the scheduler, where it stalled the
pool (issue 19). Now the body is strict JSON (no ``NaN`` or ``Infinity``,
every float finite), the fields with a known meaning are held to their range,
and every other number at the top of the body or in Ollama's ``options`` to a
32-bit integer's, which every engine can store. Token limits share the core's
:data:`~mindrouter.scheduler.TOKEN_LIMIT`. Numbers deeper in the body
(message content, tool schemas) are forwarded as they are.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..errors import RequestError
from ..scheduler import TOKEN_LIMIT
from ._shapes import Dialect

__all__ = ["check_numbers", "loads"]

_INT32 = 2**31 - 1
_INT64 = 2**63 - 1

_Bound = tuple[bool, int, int]
"""(integers only, lowest, highest)."""

_OPENAI: dict[str, _Bound] = {
    "max_tokens": (True, 1, TOKEN_LIMIT),
    "max_completion_tokens": (True, 1, TOKEN_LIMIT),
    "max_output_tokens": (True, 1, TOKEN_LIMIT),
    "n": (True, 1, 128),
    "seed": (True, -_INT64 - 1, _INT64),
    "top_logprobs": (True, 0, 20),
    "dimensions": (True, 1, 65536),
    "temperature": (False, 0, 2),
    "top_p": (False, 0, 1),
    "presence_penalty": (False, -2, 2),
    "frequency_penalty": (False, -2, 2),
}
"""OpenAI's documented ranges (its API reference), for every OpenAI-dialect route."""

_OLLAMA: dict[str, _Bound] = {
    "num_predict": (True, -2, TOKEN_LIMIT),  # -1: no limit, -2: fill the context
    "num_ctx": (True, 1, TOKEN_LIMIT),
    "num_keep": (True, -1, TOKEN_LIMIT),
    "num_batch": (True, 1, TOKEN_LIMIT),
    "repeat_last_n": (True, -1, TOKEN_LIMIT),
    "top_k": (True, 0, TOKEN_LIMIT),
    "seed": (True, -_INT64 - 1, _INT64),
    "temperature": (False, 0, _INT32),
    "top_p": (False, 0, 1),
    "min_p": (False, 0, 1),
    "typical_p": (False, 0, 1),
}
"""Ollama's ``options``: ranges its runner accepts (its docs set no upper bound on a temperature)."""

_ANY: _Bound = (False, -_INT32 - 1, _INT32)


def _fail(message: str) -> RequestError:
    return RequestError(message, status=400, type="invalid_request_error")


def _constant(name: str) -> Any:
    raise _fail(f"The request body is not valid JSON: {name} is not a JSON number; send a finite number.")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _fail(f"The request body holds the number {text[:40]}, larger than any a backend can use.")
    return value


_decoder = json.JSONDecoder(parse_constant=_constant, parse_float=_finite)
"""One decoder for every body: ``json.loads`` with hooks builds a new one (and its scanner) each call."""


def loads(raw: bytes) -> Any:
    """Parse a body as strict JSON: ``NaN``, ``Infinity`` and floats beyond a double are refused.

    Raises:
        RequestError: 400 saying what is wrong (not JSON, or a number no backend can hold).
    """
    try:  # as json.loads reads bytes: UTF-8, 16 or 32, told apart by the first bytes
        return _decoder.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except ValueError:  # includes a body that is not UTF-8, and ints past Python's 4,300 digits
        raise RequestError("The request body is not valid JSON.") from None


def _check(key: str, value: Any, bound: _Bound) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return  # types are checked with each field's meaning (``call.inspect_body``)
    integral, low, high = bound
    if (integral and not isinstance(value, int)) or not low <= value <= high:
        what = "an integer" if integral else "a number"
        raise _fail(f'"{key}" must be {what} from {low} to {high}; it was {_shown(value)}.')


def _shown(value: float) -> str:
    text = repr(value)
    return text if len(text) <= 24 else f"a number of {len(text)} digits"


def check_numbers(dialect: Dialect, body: dict[str, Any]) -> None:
    """Hold every number at the top of ``body``, and in Ollama's ``options``, to its range.

    Raises:
        RequestError: 400 naming the field and its bound.
    """
    table = _OPENAI if dialect == "openai" else _OLLAMA
    for key, value in body.items():
        _check(key, value, table.get(key, _ANY) if dialect == "openai" else _ANY)
    options = body.get("options") if dialect == "ollama" else None
    if isinstance(options, dict):
        for key, value in options.items():
            _check(key, value, table.get(key, _ANY))
