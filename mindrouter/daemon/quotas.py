"""Token and request quotas per user and per group, checked before a request queues.

Admission makes one call, ``Quotas.admit(caller, job)``, before it submits
the job: it raises a 429 ``RequestError`` when a quota is spent, and
otherwise returns the ``X-Quota-*`` headers for the response. A request
already admitted is never cut.

What counts: tokens of completed requests (``record``, called where the usage
row is written) plus an estimate of the requests still queued or running
(prompt tokens plus the expected completion), so a burst of parallel requests
cannot overshoot a budget by more than what is already running. A job's
estimate is dropped once the scheduler no longer knows the job, so no exit
path needs to report back here. Days and months are the server's local
calendar; counters are rebuilt from the daily totals at start, so quotas
survive restarts.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aiohttp import web

from ..errors import RequestError
from ..localtime import day_key, month_key, month_start, next_day, next_month, zone_label
from ..store import Quota, Store

__all__ = ["QUOTA_HEADERS", "Limit", "Quotas"]

QUOTA_HEADERS: Any = getattr(web, "RequestKey", lambda name, _type: name)("mindrouter_quota_headers", dict)
"""Headers ``admit`` leaves on the request for ``add_quota_headers`` (a typed key where aiohttp has them)."""

_MINUTE = 60.0
_PERIODS = {"tokens_per_day": "day", "tokens_per_month": "month"}


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
    """Completed tokens plus the estimate of those in flight (requests in the last minute for the rate)."""
    resets: float
    """Wall-clock epoch seconds when the period turns over."""

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "name": self.name,
            "kind": self.kind,
            "limit": self.limit,
            "used": self.used,
            "remaining": self.remaining,
            "resets": self.resets,
            "resets_at": _when(self.resets),
        }


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")


class Quotas:
    """The quota counters and limits of one daemon.

    Args:
        store: where limits live and usage is read back at start.
        scheduler: asked whether a job is still queued or running.
        default_completion: completion tokens expected of a request that names no ``max_tokens``.
        wall: wall-clock seconds (periods, resets). Defaults to ``time.time``.
        clock: monotonic seconds (the per-minute rate). Defaults to ``time.monotonic``.
    """

    def __init__(
        self,
        store: Store,
        scheduler: Any,
        *,
        default_completion: int = 256,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.scheduler = scheduler
        self.default_completion = default_completion
        self.wall = wall
        self.clock = clock
        self._limits: dict[tuple[str, Hashable], Quota] = {}
        self._names: dict[Hashable, str] = {}
        self._used: dict[tuple[str, Hashable, str], int] = {}
        """(subject, id, period key) -> completed tokens; a day key is ``2026-12-03``, a month ``2026-12``."""
        self._inflight: dict[tuple[str, Hashable], dict[str, int]] = {}
        self._recent: dict[tuple[str, Hashable], deque[float]] = {}
        self._periods = ("", "")
        self.reload()
        now = wall()
        for day, user_id, group, tokens in store.daily_tokens(month_start(now)):
            self._add(user_id, group, tokens, day, day[:7])

    def reload(self) -> None:
        """Read the limits again (after an admin change)."""
        limits: dict[tuple[str, Hashable], Quota] = {}
        users = self.store.list_users()
        self._names = {user.id: user.name for user in users}
        for user in users:
            if user.quota:
                limits["user", user.id] = user.quota
        for group in self.store.list_groups():
            if group.quota:
                limits["group", group.name] = group.quota
        self._limits = limits

    # -- counting --------------------------------------------------------------

    def record(self, user_id: int, group: str, tokens: int, at: float) -> None:
        """A completed request's real tokens (``at``: wall-clock time it ended)."""
        self._add(user_id, group, tokens, day_key(at), month_key(at))

    def _add(self, user_id: int, group: str, tokens: int, day: str, month: str) -> None:
        self._turn_over()
        for subject in (("user", user_id), ("group", group)):
            for period in (day, month):
                if period in self._periods:
                    key = (*subject, period)
                    self._used[key] = self._used.get(key, 0) + tokens

    def _turn_over(self) -> None:
        """Forget the counters of days and months that have ended."""
        now = self.wall()
        periods = (day_key(now), month_key(now))
        if periods != self._periods:
            self._periods = periods
            self._used = {k: v for k, v in self._used.items() if k[2] in periods}

    def _in_flight(self, subject: tuple[str, Hashable]) -> int:
        jobs = self._inflight.get(subject)
        if not jobs:
            return 0
        scheduler = self.scheduler
        for job_id in [j for j in jobs if not (scheduler.is_queued(j) or scheduler.is_running(j))]:
            del jobs[job_id]
        return sum(jobs.values())

    # -- checking --------------------------------------------------------------

    def limits(self, user_id: int, group: str) -> list[Limit]:
        """Every quota that applies to this user, with its use so far (the user's own first)."""
        return self.subject_limits("user", user_id) + self.subject_limits("group", group)

    def overview(self) -> list[Limit]:
        """Every quota set, users' and groups', with its use so far."""
        return [limit for subject, key in list(self._limits) for limit in self.subject_limits(subject, key)]

    def subject_limits(self, subject: str, key: Hashable) -> list[Limit]:
        """The quotas of one user (by id) or group (by name)."""
        quota = self._limits.get((subject, key))
        if quota is None:
            return []
        self._turn_over()
        now = self.wall()
        name = self._user_name(key) if subject == "user" else str(key)
        out = []
        for kind, period in _PERIODS.items():
            limit = getattr(quota, kind)
            if limit is None:
                continue
            used = self._used.get((subject, key, day_key(now) if period == "day" else month_key(now)), 0)
            used += self._in_flight((subject, key))
            out.append(Limit(subject, name, kind, limit, used, next_day(now) if period == "day" else next_month(now)))
        if quota.requests_per_minute is not None:
            recent = self._recent_requests((subject, key))
            resets = (recent[0] + _MINUTE - self.clock() + now) if recent else now
            out.append(Limit(subject, name, "requests_per_minute", quota.requests_per_minute, len(recent), resets))
        return out

    def _user_name(self, user_id: Hashable) -> str:
        return self._names.get(user_id, f"#{user_id}")

    def _recent_requests(self, subject: tuple[str, Hashable]) -> deque[float]:
        recent = self._recent.setdefault(subject, deque())
        cutoff = self.clock() - _MINUTE
        while recent and recent[0] <= cutoff:
            recent.popleft()
        return recent

    def admit(self, caller: Any, job: Any) -> dict[str, str] | None:
        """Let the job queue, or refuse it with 429 naming the spent quota; returns the response's quota headers.

        Raises:
            RequestError: 429 with ``Retry-After`` until the quota's period turns over.
        """
        if ("user", caller.user_id) not in self._limits and ("group", caller.group) not in self._limits:
            return None
        limits = self.limits(caller.user_id, caller.group)
        for limit in limits:
            if limit.used >= limit.limit:
                raise _refusal(limit, self.wall())
        subjects = [("user", caller.user_id), ("group", caller.group)]
        estimate = job.prompt_tokens + min(job.max_tokens or self.default_completion, self.default_completion)
        for subject in subjects:
            quota = self._limits.get(subject)
            if quota is None:
                continue
            if quota.tokens_per_day is not None or quota.tokens_per_month is not None:
                self._inflight.setdefault(subject, {})[job.id] = estimate
            if quota.requests_per_minute is not None:
                self._recent_requests(subject).append(self.clock())
        tokens = [lim for lim in limits if lim.kind != "requests_per_minute"]
        if not tokens:
            return None
        tightest = min(tokens, key=lambda lim: (lim.remaining, lim.resets))
        return {"X-Quota-Remaining-Tokens": str(tightest.remaining), "X-Quota-Reset": _when(tightest.resets)}


def _refusal(limit: Limit, now: float) -> RequestError:
    wait = max(1, math.ceil(limit.resets - now))
    if limit.kind == "requests_per_minute":
        spent = f"sent {limit.used} requests in the last minute, the most its quota allows"
        reset = time.strftime("%H:%M:%S", time.localtime(limit.resets))
    else:
        spent = (
            f"used {limit.used:,} of the {limit.limit:,} tokens a {_PERIODS[limit.kind]} its quota allows"
            " (running requests included)"
        )
        reset = time.strftime("%Y-%m-%d %H:%M", time.localtime(limit.resets))
    flag = "--" + limit.kind.replace("_", "-")
    return RequestError(
        f"{limit.subject} {limit.name!r} has {spent}; try again after the reset at {reset} "
        f"({zone_label(limit.resets)}), or ask an admin to raise it with "
        f"`mr {limit.subject} set-quota {limit.name} {flag} N`",
        status=429,
        type="rate_limit_error",
        code="quota_exceeded",
        retry_after=wait,
    )


async def add_quota_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: the headers ``admit`` left on this request."""
    headers = request.get(QUOTA_HEADERS)
    if headers:
        response.headers.update(headers)
