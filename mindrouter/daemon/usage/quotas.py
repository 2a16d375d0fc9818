"""Token and request quotas per user and per group, checked before a request queues.

Admission makes one call, ``Quotas.admit(caller, job)``, before it submits
the job: it raises a 429 ``RequestError`` when a quota is spent or the request
cannot fit in what is left, and otherwise returns the ``X-Quota-*`` headers
for the response. A request is never cut within what it reserved; a stream that grows past it
while a quota it counts against is spent is ended there (``progress``).

What counts: tokens of completed requests (``record``, called where the usage
row is written) plus a reservation for each request in flight. A request
reserves twice:

- at admission (``admit``), what it may use (its prompt plus its ``max_tokens``,
  or a typical answer where it names none, within what is left). While it
  waits in the queue this counts against its sender alone: one member's
  queued requests never refuse another member of a group, whatever they ask for;
- when it starts on a backend (``start``), against everyone: what is left after
  use and the other running requests' reservations, and against a quota
  several people share (a group's) at most a fair part of that (an eighth,
  less as more run at once, at least a typical answer), so no running request
  holds a shared quota alone. A whole answer, which cannot be cut as it goes,
  is capped where its reservation ends (the backend is sent it as the
  request's limit); a stream that outgrows its reservation grows it as it
  streams (``outgrow``) and is ended once the quota is spent.

Running reservations together never exceed what is left, so use ends at most
one batch a stream above a limit (docs/accounting.md).
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

from ...errors import RequestError
from ...localtime import Periods, iso_local, month_start, next_day, next_month
from ...scheduler import Modality
from ...store import Quota, Store
from .limits import PERIODS, Limit, cut, no_room, refusal

__all__ = ["Quotas"]

_MINUTE = 60.0
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
    """One request's reservation: what counts for it while it is queued (its sender's) or running (everyone's)."""

    user: Hashable
    prompt: int
    answer: int
    """The answer tokens it asks for: its ``max_tokens``, or a typical answer."""
    whole: bool
    """A whole answer (not a stream, not an embedding): capped where its reservation ends."""
    named: bool
    """The request named its ``max_tokens``."""
    reserved: int
    """Prompt plus the answer reserved (at admission, again at the start), grown as a longer answer streams."""
    subjects: tuple[tuple[str, Hashable], ...]
    """The user and group whose quotas it counts against."""
    until: float
    """Monotonic time its queue timeout ends: a refusal it causes while queued says to try again by then."""
    headers: dict[str, str]
    """The response's quota headers (``X-Quota-Max-Tokens`` is added when a cap is set at the start)."""
    cap: int | None = None
    """The answer's tokens sent to the backend as its limit (a whole answer reserved less than it asks)."""
    started: bool = False


class Quotas:
    """The quota counters and limits of one daemon.

    Args:
        store: where limits live and usage is read back at start.
        scheduler: asked whether a job is still queued or running.
        default_completion: the typical answer reserved for a request that names no ``max_tokens``
            (a user's usual answer once it is longer).
        queue_timeout: seconds a request may wait in the queue (the latest a queued reservation ends).
        wall: wall-clock seconds (periods, resets). Defaults to ``time.time``.
        clock: monotonic seconds (the per-minute rate). Defaults to ``time.monotonic``.
    """

    def __init__(
        self,
        store: Store,
        scheduler: Any,
        *,
        default_completion: int = 256,
        queue_timeout: float = 300.0,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.scheduler = scheduler
        self.default_completion = default_completion
        self.queue_timeout = queue_timeout
        self.wall = wall
        self.clock = clock
        self._limits: dict[tuple[str, Hashable], Quota] = {}
        self._names: dict[Hashable, str] = {}
        self._used: dict[tuple[str, Hashable, str], int] = {}
        """(subject, id, period key) -> completed tokens; a day key is ``2026-12-03``, a month ``2026-12``."""
        self._inflight: dict[tuple[str, Hashable], dict[str, _Hold]] = {}
        """subject -> job id -> its reservation (one ``_Hold`` shared by the user and its group); token quotas only."""
        self._jobs: dict[str, _Hold] = {}
        self._usual: dict[Hashable, float] = {}
        """user id -> its usual answer length, learned from completed requests."""
        self._recent: dict[tuple[str, Hashable], deque[float]] = {}
        self._periods = ("", "")
        self._keys = Periods()
        self.reload()
        self.restore()

    def restore(self) -> None:
        """Count this month's tokens and the last minute's requests again from the store (a start, a new leader)."""
        self._used.clear()
        self._recent.clear()
        now = self.wall()
        for day, user_id, group, tokens in self.store.daily_tokens(month_start(now)):
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
        for subject in hold.subjects:
            for limit in self._token_limits(subject):
                if limit.used + self._running(subject) > limit.limit:
                    return cut(limit, completion_tokens)
        return None

    def start(self, job_id: str) -> int | None:
        """The job starts on a backend: reserve what it may use against everyone; returns its answer's cap.

        What is left after use and the other running requests' reservations bounds it; against a
        quota several people share, so does a fair part of that (``_SHARE``), so one member's huge
        ``max_tokens`` holds back no one else. A whole answer reserved less than it asks for is
        capped there (the backend is sent it as the limit, ``X-Quota-Max-Tokens`` says so).

        Raises:
            RequestError: 429, what is left no longer holds its prompt (the quota was used while it waited).
        """
        hold = self._jobs.get(job_id)
        if hold is None or hold.started:
            return None if hold is None else hold.cap
        room, tightest = self._room([(subject, None) for subject in hold.subjects])
        if tightest is None:
            return None
        prompt = hold.prompt
        if room <= prompt:  # used, or reserved by the requests that started while it waited
            self._drop(job_id)
            if tightest.used >= tightest.limit:
                raise refusal(tightest, self.wall())
            raise no_room(tightest, room, prompt, "running", 5, self.wall())
        key = tightest.name if tightest.subject == "group" else hold.user
        running = sum(1 for other in self._holds((tightest.subject, key)).values() if other.started)
        part = max(self.typical_answer(hold.user), (room - prompt) // (_SHARE * (1 + running)))
        answer = part if hold.whole and not hold.named else hold.answer  # known only at its end: its share
        if tightest.subject == "group":  # shared by several people: at most a fair part of what is left
            answer = min(answer, part)
        answer = min(answer, room - prompt)
        hold.reserved, hold.started = prompt + answer, True
        if hold.whole and (not hold.named or answer < hold.answer):
            hold.cap = answer
            hold.headers["X-Quota-Max-Tokens"] = str(answer)
        return hold.cap

    def _drop(self, job_id: str) -> None:
        hold = self._jobs.pop(job_id, None)
        if hold is not None:
            for subject in hold.subjects:
                self._inflight.get(subject, {}).pop(job_id, None)

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

    def _holds(self, subject: tuple[str, Hashable]) -> dict[str, _Hold]:
        """The subject's reservations in flight, once those of jobs the scheduler no longer knows are dropped."""
        jobs = self._inflight.get(subject)
        if not jobs:
            return {}
        scheduler = self.scheduler
        for job_id in [j for j in jobs if not (scheduler.is_queued(j) or scheduler.is_running(j))]:
            del jobs[job_id]
            self._jobs.pop(job_id, None)
        return jobs

    def _running(self, subject: tuple[str, Hashable]) -> int:
        """What the requests running now reserve (they count against everyone)."""
        return sum(hold.reserved for hold in self._holds(subject).values() if hold.started)

    def _room(self, subjects: list[tuple[tuple[str, Hashable], Hashable | None]]) -> tuple[int, Limit | None]:
        """Tokens left under the tightest token quota of ``subjects`` after use and what counts against the
        asker: the running requests' reservations, and the queued ones of ``user`` where one is named."""
        best: tuple[int, Limit | None] = (0, None)
        for subject, user in subjects:
            held = self._holds(subject).values()
            against = sum(h.reserved for h in held if h.started or (user is not None and h.user == user))
            for limit in self._token_limits(subject):
                room = limit.limit - limit.used - against
                if best[1] is None or (room, limit.resets) < (best[0], best[1].resets):
                    best = (room, limit)
        return best

    # -- checking --------------------------------------------------------------

    def limits(self, user_id: int, group: str) -> list[Limit]:
        """Every quota that applies to this user, with its use so far (the user's own first)."""
        return self.subject_limits("user", user_id) + self.subject_limits("group", group)

    def overview(self) -> list[Limit]:
        """Every quota set, users' and groups', with its use so far."""
        return [limit for limits in self.by_subject().values() for limit in limits]

    def by_subject(self) -> dict[tuple[str, Hashable], list[Limit]]:
        """Every quota set with its use so far, by (``user``, user id) or (``group``, group name)."""
        return {(subject, key): self.subject_limits(subject, key) for subject, key in list(self._limits)}

    def _token_limits(self, subject: tuple[str, Hashable]) -> list[Limit]:
        return [limit for limit in self.subject_limits(*subject) if limit.kind != "requests_per_minute"]

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
        reserved = sum(hold.reserved for hold in self._holds((subject, key)).values())
        for kind, period in PERIODS.items():
            limit = getattr(quota, kind)
            if limit is None:
                continue
            used = self._used.get((subject, key, day if period == "day" else month), 0)
            resets = next_day(now) if period == "day" else next_month(now)
            out.append(Limit(subject, name, kind, limit, used, resets, reserved))
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

        Only use, the running requests' reservations and the caller's own queued ones can refuse it:
        another member's queued requests never do.

        Raises:
            RequestError: 429 naming the spent quota, with ``Retry-After`` until its period turns over;
                or 429 saying what is left after the requests in flight is too little for its prompt,
                with ``Retry-After`` no later than the end of those that reserve it.
        """
        subjects = [s for s in (("user", caller.user_id), ("group", caller.group)) if s in self._limits]
        if not subjects:
            return None
        for limit in self.limits(caller.user_id, caller.group):
            if limit.used >= limit.limit:
                raise refusal(limit, self.wall())
        room, tightest = self._room([(subject, caller.user_id) for subject in subjects])
        hold = None
        if tightest is not None:
            prompt = job.prompt_tokens
            if room <= prompt:
                raise self._refuse_for_room(tightest, prompt, caller.user_id)
            answer = job.max_tokens if job.max_tokens is not None else self.typical_answer(caller.user_id)
            whole = not job.stream and job.modality is not Modality.EMBEDDINGS
            headers = {"X-Quota-Remaining-Tokens": str(room), "X-Quota-Reset": iso_local(tightest.resets)}
            until = self.clock() + self.queue_timeout
            named = job.max_tokens is not None
            hold = _Hold(caller.user_id, prompt, answer, whole, named, min(prompt + answer, room), (), until, headers)
        for subject in subjects:
            quota = self._limits[subject]
            if hold is not None and (quota.tokens_per_day is not None or quota.tokens_per_month is not None):
                self._inflight.setdefault(subject, {})[job.id] = hold
                hold.subjects += (subject,)
            if quota.requests_per_minute is not None:
                self._recent_requests(subject).append(self.clock())
        if hold is None:
            return None
        self._jobs[job.id] = hold
        return hold.headers

    def _refuse_for_room(self, limit: Limit, prompt: int, user: Hashable) -> RequestError:
        """What is left is too little for the prompt: say whose requests in flight hold the rest, if any."""
        key = (limit.subject, user if limit.subject == "user" else limit.name)
        held = self._holds(key).values()
        own = [h.until for h in held if h.user == user and not h.started]
        room = limit.limit - limit.used - sum(h.reserved for h in held if h.started or h.user == user)
        if own:  # the caller's own queued requests: they end by their queue timeout at the latest
            return no_room(limit, room, prompt, "yours", max(1, math.ceil(min(own) - self.clock())), self.wall())
        if any(h.started for h in held):
            return no_room(limit, room, prompt, "running", 5, self.wall())
        return no_room(limit, room, prompt, None, None, self.wall())
