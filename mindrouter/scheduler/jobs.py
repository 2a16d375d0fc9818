"""Jobs and the outcomes the core hands back to its caller.

Jobs are frozen: what a client asked for never changes. Everything the core
decides about a job (when it was dispatched, where, how it ended) is returned
as a new value, so the I/O shell acts on decisions and never on shared state
(a dispatch, with its decision record, is in ``records.py``).

Invariants: a job never changes, so neither does its class (``class_key``);
every token count the core takes from a job or a backend is an integer in
``[0, TOKEN_LIMIT]`` (``numbers_refusal``, ``token_count``).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum

from .prefix import Prefix

__all__ = [
    "TOKEN_LIMIT",
    "ClassKey",
    "Expired",
    "Job",
    "Modality",
    "Outcome",
    "Rejection",
    "Timings",
    "class_key",
    "numbers_refusal",
    "token_count",
]

TOKEN_LIMIT = 1 << 24
"""The most tokens a job may name (16,777,216: above any model's context today).

Every token count of a job, and every token limit a client sends, stays
within it, so the core's arithmetic stays finite and exact."""


class Modality(str, Enum):
    CHAT = "chat"
    COMPLETION = "completion"
    EMBEDDINGS = "embeddings"
    VISION = "vision"


@dataclass(frozen=True, slots=True)
class Job:
    """One inference request, as the scheduler sees it."""

    id: str
    user_id: Hashable
    model: str
    submitted_at: float
    """Monotonic seconds, from the caller's clock."""
    modality: Modality = Modality.CHAT
    json_mode: bool = False
    """The client asked for JSON mode or a JSON schema."""
    prompt_tokens: int = 0
    """Estimate of the prompt's tokens (the shell guesses from the body)."""
    max_tokens: int | None = None
    """The client's completion limit, if any."""
    context_tokens: int | None = None
    """Context size the client asked for (Ollama ``num_ctx``), for the VRAM estimate."""
    stream: bool = False
    """The answer streams, so the caller reports its progress (``Scheduler.progress``)."""
    unload_after: bool = False
    """The client asked its model unloaded once idle (Ollama ``keep_alive`` 0): routing then expects it gone."""
    prefix: Prefix = ()
    """The prompt's blocks, hashed in a chain (``prefix.py``): where a backend holds some of them in its prompt
    cache, routing prices the prefill they save."""
    via: Hashable | None = None
    """The proxy (a front end's user id) that sent it, for one of its people or itself: its people's queued
    jobs count together against ``max_queued_per_proxy``."""


#: (model, modality, JSON mode): a job's class. Jobs of one class are interchangeable for routing,
#: and queue per user and class (``fairness/queues.py``).
ClassKey = tuple[str, Modality, bool]


def class_key(job: Job) -> ClassKey:
    return (job.model, job.modality, job.json_mode)


def token_count(value: object) -> int | None:
    """``value`` if it is a token count the core can use (an integer in ``[0, TOKEN_LIMIT]``), else None.

    The one rule for a token count: the core applies it to what it is told, and
    ``mindrouter.reported`` to what a backend says.
    """
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= TOKEN_LIMIT:
        return value
    return None


def numbers_refusal(job: Job) -> Rejection | None:
    """A 400 for a job whose token counts are not integers in ``[0, TOKEN_LIMIT]``.

    The shell bounds what clients send; the core checks again, so no caller can
    put a number into its arithmetic that overflows a float or runs it backwards.
    """
    for name in ("prompt_tokens", "max_tokens", "context_tokens"):
        value = getattr(job, name)
        if value is None and name != "prompt_tokens":
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= TOKEN_LIMIT:
            return Rejection(
                job, 400, "invalid_request", f"{name} must be an integer from 0 to {TOKEN_LIMIT}; send a smaller number"
            )
    return None


@dataclass(frozen=True, slots=True)
class Timings:
    """Seconds a backend says it spent on a job (Ollama's ``load_duration``, ``prompt_eval_duration``,
    ``eval_duration``); None where it does not say, and the core falls back to the shell's clock."""

    load: float | None = None
    prefill: float | None = None
    decode: float | None = None


class Outcome(str, Enum):
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


@dataclass(frozen=True, slots=True)
class Rejection:
    """The job cannot be queued; ``status`` is the HTTP status that says why."""

    job: Job
    status: int
    code: str
    message: str
    retry_after: float | None = None


@dataclass(frozen=True, slots=True)
class Expired:
    """A queued job waited past ``queue_timeout`` and was removed."""

    job: Job
    waited: float
