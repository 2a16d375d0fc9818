"""Typed fields of a scenario file: each check fails with one sentence naming the key (``loading.py``'s base)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .scenario import ScenarioError, Seconds, Tokens

__all__ = ["Fields"]


class Fields:
    """Checks one value at a time; ``source`` (the file) starts every message."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, message: str) -> ScenarioError:
        return ScenarioError(f"{self.source}: {message}")

    # -- typed fields -----------------------------------------------------

    def number(self, key: str, value: Any, *, positive: bool = False, minimum: float = 0.0) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(f"{key} must be a number, not {value!r}")
        if positive and value <= 0:
            raise self.fail(f"{key} must be greater than 0, not {value!r}")
        if value < minimum:
            raise self.fail(f"{key} must be at least {minimum:g}, not {value!r}")
        return float(value)

    def integer(self, key: str, value: Any, *, minimum: int = 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"{key} must be a whole number, not {value!r}")
        if value < minimum:
            raise self.fail(f"{key} must be at least {minimum}, not {value!r}")
        return value

    def boolean(self, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.fail(f"{key} must be true or false, not {value!r}")
        return value

    def string(self, key: str, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(f"{key} must be a non-empty string, not {value!r}")
        return value

    def strings(self, key: str, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.fail(f'{key} must be a list of model names such as ["llama3"], not {value!r}')
        return tuple(value)

    def tokens(self, key: str, value: Any, *, minimum: int = 0) -> Tokens:
        if isinstance(value, list):
            if len(value) != 2:
                raise self.fail(f"{key} must be a number or a [min, max] pair, not {value!r}")
            low = self.integer(f"{key}[0]", value[0], minimum=minimum)
            high = self.integer(f"{key}[1]", value[1], minimum=minimum)
            if low > high:
                raise self.fail(f"{key} must be [min, max] with min <= max, not {value!r}")
            return low, high
        count = self.integer(key, value, minimum=minimum)
        return count, count

    def seconds(self, key: str, value: Any) -> Seconds:
        if isinstance(value, list):
            if len(value) != 2:
                raise self.fail(f"{key} must be a number or a [min, max] pair, not {value!r}")
            low, high = self.number(f"{key}[0]", value[0]), self.number(f"{key}[1]", value[1])
            if low > high:
                raise self.fail(f"{key} must be [min, max] with min <= max, not {value!r}")
            return low, high
        fixed = self.number(key, value)
        return fixed, fixed

    def table(self, key: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(f"{key} must be a table")
        return value

    def unknown(self, where: str, data: Mapping[str, Any], known: set[str]) -> None:
        for key in data:
            if key not in known:
                raise self.fail(f"unknown key {where}{key}; the keys are {', '.join(sorted(known))}")
