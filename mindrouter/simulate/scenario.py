"""What a scenario is: the validated, frozen description of users, backends and events.

Reading and checking scenario files is in ``loading.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..scheduler.settings import SchedulerSettings

__all__ = [
    "BackendSpec",
    "EventSpec",
    "Scenario",
    "ScenarioError",
    "Tokens",
    "UserSpec",
]

#: A token count: fixed, or drawn uniformly from an inclusive [min, max].
Tokens = tuple[int, int]


class ScenarioError(UsageError):
    """A scenario file that cannot be simulated as written (exit status 2)."""


@dataclass(frozen=True, slots=True)
class BackendSpec:
    name: str
    models: tuple[str, ...]
    max_concurrent: int
    tokens_per_second: float
    """Decode rate of one request; requests running side by side do not slow each other."""
    prefill_tokens_per_second: float
    """Prompt processing rate; defaults to 10 x ``tokens_per_second``."""
    loaded_models: tuple[str, ...]
    """Models resident at the start (default: all of ``models``)."""
    priority: float = 0.0


@dataclass(frozen=True, slots=True)
class UserSpec:
    """One ``[[users]]`` entry: a phase of a user's workload.

    Entries that share a ``name`` are one user (one account, deficit and weight),
    each with its own ``start``/``stop``, model and workload; the parser gives
    every phase of a user the same ``group``, ``weight`` and ``weight_override``.
    """

    name: str
    group: str | None
    weight: float
    """The user's weight at the start: its ``weight_override``, else its group's, else 1."""
    model: str
    concurrency: int | None
    """Closed loop: requests kept outstanding between ``start`` and ``stop``."""
    rate: float | None
    """Open loop: Poisson arrivals per second between ``start`` and ``stop``."""
    prompt_tokens: Tokens
    completion_tokens: Tokens
    start: float
    stop: float | None
    """None: until the end of the run (so ``--duration`` moves it)."""
    max_tokens: int | None = None
    """Sent with each request (caps the completion); without it the scheduler estimates."""
    think_time: float = 0.0
    """Closed loop: seconds between one answer and the next request."""
    requests: int | None = None
    """Stop this phase after submitting this many requests."""
    weight_override: float | None = None
    """The user's own ``weight``, if given (an event with ``clear`` drops it for the group's)."""


@dataclass(frozen=True, slots=True)
class EventSpec:
    """An ``[[events]]`` entry: at ``at`` seconds, change one user's or one group's weight."""

    at: float
    user: str | None
    group: str | None
    weight: float | None
    """The new weight; None with ``clear``."""
    clear: bool = False
    """Drop the user's own weight so its group's (or 1) applies again."""


@dataclass(frozen=True, slots=True)
class Scenario:
    duration: float
    seed: int
    backends: tuple[BackendSpec, ...]
    users: tuple[UserSpec, ...]
    settings: SchedulerSettings
    groups: Mapping[str, float]
    name: str = "scenario"
    description: str = ""
    events: tuple[EventSpec, ...] = ()
    """Sorted by ``at``."""

    def replace(self, **changes: Any) -> Scenario:
        return dataclasses.replace(self, **changes)
