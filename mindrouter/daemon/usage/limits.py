"""One quota as it stands, and the 429 answers that explain a spent or too-full one.

Every refusal says which quota, what is used or left, when it resets and what to do; the
arithmetic that decides to refuse is ``quotas.Quotas``'s.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from ...errors import RequestError
from ...localtime import iso_local, zone_label

__all__ = ["PERIODS", "Limit", "cut", "no_room", "refusal"]

PERIODS = {"tokens_per_day": "day", "tokens_per_month": "month"}
"""A token quota's kind -> the period it counts over."""


@dataclass(frozen=True, slots=True)
class Limit:
    """One quota as it stands for one user or group."""

    subject: str
    """``user`` or ``group``."""
    name: str
    kind: str
    """``tokens_per_day``, ``tokens_per_month`` or ``requests_per_minute``."""
    limit: int
    used: int
    """Tokens of completed requests (requests in the last minute for the rate)."""
    resets: float
    """Wall-clock epoch seconds when the period turns over."""
    reserved: int = 0
    """Tokens reserved by the requests in flight (queued or running)."""

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used - self.reserved)

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "name": self.name,
            "kind": self.kind,
            "limit": self.limit,
            "used": self.used,
            "reserved": self.reserved,
            "remaining": self.remaining,
            "resets": self.resets,
            "resets_at": iso_local(self.resets),
        }


def _exceeded(message: str, retry_after: float | None = None) -> RequestError:
    return RequestError(message, status=429, type="rate_limit_error", code="quota_exceeded", retry_after=retry_after)


def _raise_it(limit: Limit) -> str:
    """The admin's fix, as every quota message ends."""
    flag = "--" + limit.kind.replace("_", "-")
    return f"ask an admin to raise it with `mr {limit.subject} set-quota {limit.name} {flag} N`"


def refusal(limit: Limit, now: float) -> RequestError:
    wait = max(1, math.ceil(limit.resets - now))
    if limit.kind == "requests_per_minute":
        spent = f"sent {limit.used} requests in the last minute, the most its quota allows"
        reset = time.strftime("%H:%M:%S", time.localtime(limit.resets))
    else:
        spent = f"used {limit.used:,} of the {limit.limit:,} tokens a {PERIODS[limit.kind]} its quota allows"
        reset = time.strftime("%Y-%m-%d %H:%M", time.localtime(limit.resets))
    return _exceeded(
        f"{limit.subject} {limit.name!r} has {spent}; try again after the reset at {reset} "
        f"({zone_label(limit.resets)}), or {_raise_it(limit)}",
        retry_after=wait,
    )


def cut(limit: Limit, completion: int) -> RequestError:
    """A stream past its reservation meets a spent quota: it ends here, charged what it delivered."""
    return _exceeded(
        f"the answer stops after {completion:,} tokens because {limit.subject} {limit.name!r} has used the "
        f"{limit.limit:,} tokens a {PERIODS[limit.kind]} its quota allows; send max_tokens"
        f" (options.num_predict for Ollama) to reserve a whole answer up front, or {_raise_it(limit)}"
    )


def no_room(
    limit: Limit, room: int, prompt: int, held_by: str | None, retry_after: int | None, now: float
) -> RequestError:
    """What is left of a token quota (``room``) is too little for this request's prompt.

    ``held_by`` says who reserves the rest: "yours" (the caller's queued requests), "running" (the
    requests running now), or None (used by completed requests); ``retry_after`` None waits for the reset.
    """
    left = (
        f"{limit.subject} {limit.name!r} has {max(0, room):,} of the {limit.limit:,} tokens a "
        f"{PERIODS[limit.kind]} its quota allows left"
    )
    if held_by is not None:
        whose = "your requests in flight" if held_by == "yours" else "the requests running now"
        return _exceeded(
            f"{left} after what is reserved by {whose}, too few for this request's prompt of about {prompt:,}"
            " tokens; wait for them to finish and send it again, or send a shorter prompt",
            retry_after=retry_after,
        )
    return _exceeded(
        f"{left}, too few for this request's prompt of about {prompt:,} tokens; send a shorter prompt, or"
        f" {_raise_it(limit)}",
        retry_after=max(1, math.ceil(limit.resets - now)),
    )
