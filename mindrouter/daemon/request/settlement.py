"""How a request ended: what the stats, the usage table and the decision log learn from its lease, and
the tokens it is charged: the backend's counts where it gave them, else estimates."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from ...scheduler import DecisionRecord, Job

if TYPE_CHECKING:
    from ...backends.base import Upstream
    from ...scheduler import Scheduler

__all__ = ["Attempt", "Outcome", "Settlement", "Streaming", "abandoned_tokens", "answer_tokens"]


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


def answer_tokens(upstream: Upstream, job: Job) -> tuple[int, int]:
    """Prompt and completion tokens of an opened answer: the backend's counts, else the prompt estimate
    and one token per chunk."""
    usage = upstream.usage
    prompt = usage.prompt_tokens if usage.prompt_tokens is not None else job.prompt_tokens
    completion = usage.completion_tokens if usage.completion_tokens is not None else upstream.chunks
    return prompt, completion


def abandoned_tokens(job: Job, scheduler: Scheduler, backend_id: Hashable | None, held: float) -> tuple[int, int]:
    """Tokens to charge for an answer left while a backend held a slot opening it (a whole answer the client
    did not wait for, a stream before its first chunk): the backend had the prompt, so its estimate;
    and a whole answer is taken to have produced what one answer of that model on that backend was
    seen to produce a second (``ModelSpeed.observed``) for each of the ``held`` seconds, up to its
    ``max_tokens``."""
    if job.stream:
        return job.prompt_tokens, 0
    load = scheduler.load(backend_id) if backend_id is not None else None
    speed = load.speeds.get(job.model) if load is not None else None
    rate = speed.observed if speed is not None and speed.observed is not None else 0.0
    produced = int(rate * held)
    return job.prompt_tokens, produced if job.max_tokens is None else min(produced, job.max_tokens)
