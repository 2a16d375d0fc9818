"""How a request ended: what the stats, the usage table and the decision log learn from its lease."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from ...scheduler import DecisionRecord, Job

__all__ = ["Attempt", "Outcome", "Settlement", "Streaming"]


class Outcome(str, Enum):
    """How a request ended, as its decision record says."""

    OK = "ok"
    CLIENT_GONE = "client_gone"
    BACKEND_FAILED = "backend_failed"
    TIMEOUT = "timeout"
    REJECTED = "rejected"
    """Refused before any backend worked on it (queue full, unknown model), or the backend's 4xx."""
    ERROR = "error"
    """A bug in the daemon ended it; the log has the traceback."""
    SHUTDOWN = "shutdown"
    """The daemon shut down before the answer was complete (told apart from a client gone by the lease's state)."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One dispatch of the request and how it ended."""

    record: DecisionRecord
    outcome: Outcome
    reason: str | None


@dataclass(frozen=True, slots=True)
class Settlement:
    """The end of one request: what the stats, the usage table and the decision log learn."""

    job: Job
    user: str
    group: str
    outcome: Outcome
    reason: str | None
    status: int
    """The HTTP status the client got (200 for a stream that broke after its headers)."""
    backend_id: Hashable | None
    """The backend that held the slot last, if any."""
    answered: bool
    """That backend's answer began (headers and a first chunk, or a whole body)."""
    prompt_tokens: int
    completion_tokens: int
    held: float
    """Seconds the last backend's slot was held (the usage row's GPU-seconds)."""
    attempts: tuple[Attempt, ...]
    """Every dispatch, in order; empty when the request never left the queue."""
    waited: float
    """Seconds from submission to the end (for a request never dispatched: its time in the queue)."""
    wall: float


class Streaming(Protocol):
    """What the durable streaming usage reads of a running lease at each charge (``UsageWriter.streamed``)."""

    job: Job
    group: str
    backend_id: Hashable | None

    @property
    def held(self) -> float:
        """Seconds the slot has been held so far."""
