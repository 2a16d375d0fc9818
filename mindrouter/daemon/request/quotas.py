"""Token and request quotas per user and per group, checked before a request queues.

Admission makes one call, ``Quotas.admit(caller, job)``, before it submits
the job: it raises a 429 ``RequestError`` when a quota is spent or the request
cannot fit in what is left, and otherwise returns the ``X-Quota-*`` headers
for the response. A request is never cut within what it reserved; a stream that grows past it
while a quota it counts against is spent is ended there (``progress``).

What counts: tokens of completed requests (``record``, called where the usage
row is written) plus a reservation for each request still queued or running.
The reservation is what the request may use: its prompt plus its
``max_tokens`` (or a typical answer where it names none), within what is left
of the quota; a stream that outgrows it (an answer longer than the typical
one) grows it as it streams (``progress``), and is ended once the quota is
spent; a whole answer that names none, which cannot be cut as it goes,
reserves a share of what is left and is capped there (``answer_cap``: the
backend is sent it as the request's limit). Reservations together never exceed what is left, so use ends at most
one request's answer above a limit (docs/accounting.md).
A job's reservation is dropped once the scheduler no longer knows the job, so
no exit path needs to report back here. Days and months are the server's local
calendar; counters are rebuilt from the daily totals at start, and the
per-minute counts from the last minute's usage rows, so quotas survive restarts.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ...errors import RequestError
from ...localtime import Periods, iso_local, month_start, next_day, next_month, zone_label
from ...scheduler import Modality
from ...store import Quota, Store

__all__ = ["QUOTA_HEADERS", "Limit", "Quotas"]

QUOTA_HEADERS = web.RequestKey("mindrouter_quota_headers", dict[str, str])
"""Headers ``admit`` leaves on the request for ``answers.stamp``."""

_MINUTE = 60.0
_PERIODS = {"tokens_per_day": "day", "tokens_per_month": "month"}
_GROW = 32
"""Tokens a stream that has outgrown its reservation reserves at a time (one check per batch)."""
_LEARN = 0.2
"""Weight of each completed answer in a user's usual answer length (an exponential moving average)."""
_SHARE = 8
"""A whole answer that names no ``max_tokens`` reserves, and is capped at, what is left divided by this
times one more than the requests already holding some of it (at least a typical answer): together they
never pass the quota, a lone one gets an eighth, and the shares shrink as more run at once, so dozens fit."""


@dataclass(slots=True)
class _Hold:
    """One request's reservation: what counts for it while it is queued or running."""

    prompt: int
    reserved: int
    """Prompt plus the answer reserved at admission, grown as a longer answer streams."""
    subjects: tuple[tuple[str, Hashable], ...]
    """The user and group whose quotas it counts against."""
    cap: int | None = None
    """The answer's tokens sent to the backend as its limit (a whole answer that named none)."""


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
    """Completed tokens plus the reservations of those in flight (requests in the last minute for the rate)."""
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
            "resets_at": iso_local(self.resets),
        }


class Quotas:
    """The quota counters and limits of one daemon.

    Args:
        store: where limits live and usage is read back at start.
        scheduler: asked whether a job is still queued or running.
        default_completion: the typical answer reserved for a request that names no ``max_tokens``
            (a user's usual answer once it is longer).
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
        self._inflight: dict[tuple[str, Hashable], dict[str, _Hold]] = {}
        """subject -> job id -> its reservation (one ``_Hold`` shared by the user and its group)."""
        self._jobs: dict[str, _Hold] = {}
        self._usual: dict[Hashable, float] = {}
        """user id -> its usual answer length, learned from completed requests."""
        self._recent: dict[tuple[str, Hashable], deque[float]] = {}
        self._periods = ("", "")
        self._keys = Periods()
        self.reload()
        now = wall()
        for day, user_id, group, tokens in store.daily_tokens(month_start(now)):
            self._add(user_id, group, tokens, day, day[:7])
        self._restore_recent(now)

    def _restore_recent(self, now: float) -> None:
        """The last minute's requests from the usage rows, so a restart does not reset requests-per-minute."""
        rated = {key for key, quota in self._limits.items() if quota.requests_per_minute is not None}
        if not rated:
            return
        ago = self.clock() - now
        for user_id, group, at in self.store.recent_requests(now - _MINUTE):
            for subject in (("user", user_id), ("group", group)):
                if subject in rated:
                    self._recent.setdefault(subject, deque()).append(at + ago)

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

    def record(self, user_id: int, group: str, tokens: int, at: float, completion: int | None = None) -> None:
        """A completed request's real tokens (``at``: wall-clock time it ended; ``completion``: its answer's)."""
        self._add(user_id, group, tokens, *self._keys(at))
        if completion:
            usual = self._usual.get(user_id)
            self._usual[user_id] = completion if usual is None else usual + _LEARN * (completion - usual)

    def allowance(self, job_id: str) -> float:
        """Completion tokens the job may stream within its reservation (infinite when it has none)."""
        hold = self._jobs.get(job_id)
        return math.inf if hold is None else hold.reserved - hold.prompt

    def outgrow(self, job_id: str, completion_tokens: int) -> RequestError | None:
        """A stream past its reservation: grow it by the next batch, or end the stream if a quota is spent.

        Within what admission reserved a request is never cut; past it, a stream is ended as soon as
        a quota it counts against is used up, so no quota is overshot by more than a batch a stream.
        """
        hold = self._jobs.get(job_id)
        if hold is None:
            return None
        hold.reserved = max(hold.reserved, hold.prompt + completion_tokens + _GROW)
        for subject, key in hold.subjects:
            for limit in self.subject_limits(subject, key):
                if limit.kind != "requests_per_minute" and limit.used > limit.limit:
                    return _cut(limit, completion_tokens)
        return None

    def answer_cap(self, job_id: str) -> int | None:
        """The most answer tokens the job may have, where admission set it (a whole answer naming none)."""
        hold = self._jobs.get(job_id)
        return None if hold is None else hold.cap

    def typical_answer(self, user_id: Hashable) -> int:
        """What a request that names no ``max_tokens`` reserves: the longer of the default and the user's usual."""
        return max(self.default_completion, math.ceil(self._usual.get(user_id, 0)))

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
        periods = self._keys(now)
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
            self._jobs.pop(job_id, None)
        return sum(hold.reserved for hold in jobs.values())

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
        day, month = self._keys(now)
        name = self._user_name(key) if subject == "user" else str(key)
        out = []
        for kind, period in _PERIODS.items():
            limit = getattr(quota, kind)
            if limit is None:
                continue
            used = self._used.get((subject, key, day if period == "day" else month), 0)
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
        """Let the job queue with its reservation, or refuse it with 429; returns the response's quota headers.

        Raises:
            RequestError: 429 naming the spent quota, with ``Retry-After`` until its period turns over;
                or 429 saying what is left is too little for the request's prompt.
        """
        subjects = [s for s in (("user", caller.user_id), ("group", caller.group)) if s in self._limits]
        if not subjects:
            return None
        limits = self.limits(caller.user_id, caller.group)
        for limit in limits:
            if limit.used >= limit.limit:
                raise _refusal(limit, self.wall())
        tokens = [lim for lim in limits if lim.kind != "requests_per_minute"]
        tightest = min(tokens, key=lambda lim: (lim.remaining, lim.resets)) if tokens else None
        if tightest is not None:
            prompt = job.prompt_tokens
            held = self._inflight.get(
                (tightest.subject, caller.user_id if tightest.subject == "user" else caller.group)
            )
            if tightest.remaining <= prompt:
                raise _no_room(tightest, prompt, bool(held))
            answer, whole = job.max_tokens, not job.stream and job.modality is not Modality.EMBEDDINGS
            if answer is None:
                answer = self.typical_answer(caller.user_id)
            if whole and job.max_tokens is None:  # known only at its end, it cannot be cut as a stream is: capped
                answer = max(answer, (tightest.remaining - prompt) // (_SHARE * (1 + len(held or ()))))
            hold = _Hold(prompt, min(prompt + answer, tightest.remaining), tuple(subjects))
            if whole and job.max_tokens is None:
                hold.cap = hold.reserved - prompt
            self._jobs[job.id] = hold
        for subject in subjects:
            quota = self._limits[subject]
            if tightest is not None and (quota.tokens_per_day is not None or quota.tokens_per_month is not None):
                self._inflight.setdefault(subject, {})[job.id] = hold
            if quota.requests_per_minute is not None:
                self._recent_requests(subject).append(self.clock())
        if tightest is None:
            return None
        headers = {"X-Quota-Remaining-Tokens": str(tightest.remaining), "X-Quota-Reset": iso_local(tightest.resets)}
        if hold.cap is not None:
            headers["X-Quota-Max-Tokens"] = str(hold.cap)
        return headers


def _exceeded(message: str, retry_after: float | None = None) -> RequestError:
    return RequestError(message, status=429, type="rate_limit_error", code="quota_exceeded", retry_after=retry_after)


def _raise_it(limit: Limit) -> str:
    """The admin's fix, as every quota message ends."""
    flag = "--" + limit.kind.replace("_", "-")
    return f"ask an admin to raise it with `mr {limit.subject} set-quota {limit.name} {flag} N`"


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
    return _exceeded(
        f"{limit.subject} {limit.name!r} has {spent}; try again after the reset at {reset} "
        f"({zone_label(limit.resets)}), or {_raise_it(limit)}",
        retry_after=wait,
    )


def _cut(limit: Limit, completion: int) -> RequestError:
    """A stream past its reservation meets a spent quota: it ends here, charged what it delivered."""
    return _exceeded(
        f"the answer stops after {completion:,} tokens because {limit.subject} {limit.name!r} has used the "
        f"{limit.limit:,} tokens a {_PERIODS[limit.kind]} its quota allows; send max_tokens"
        f" (options.num_predict for Ollama) to reserve a whole answer up front, or {_raise_it(limit)}"
    )


def _no_room(limit: Limit, prompt: int, running: bool) -> RequestError:
    """What is left of a token quota is too little for this request's prompt."""
    left = (
        f"{limit.subject} {limit.name!r} has {limit.remaining:,} of the {limit.limit:,} tokens a "
        f"{_PERIODS[limit.kind]} its quota allows left"
    )
    if running:
        return _exceeded(
            f"{left} after the requests running now, too few for this request's prompt of about {prompt:,} tokens;"
            " wait for them to finish and send it again, or send a shorter prompt",
            retry_after=5,
        )
    return _exceeded(
        f"{left}, too few for this request's prompt of about {prompt:,} tokens; send a shorter prompt, or"
        f" {_raise_it(limit)}",
        retry_after=max(1, math.ceil(limit.resets - time.time())),
    )
