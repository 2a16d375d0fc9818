"""Fair-share state: deficits, in-flight charges, burst credits, recent usage, heavy users.

Invariants (checked by ``FairShare.check()`` in tests):

- A user's *effective* deficit is ``(deficit - inflight_charge) / weight``, in cost
  per unit of weight. Higher means more owed. Deficits only ever fall (by the real
  cost at completion) except in two places: all users shift up together by the
  same effective amount when they drift far below zero (order and shares are
  unchanged), and a user who comes back after being idle is *lowered* to at most
  one return credit ahead of the most-owed backlogged user. Nobody is ever clipped
  on their own while backlogged.
- ``reference`` (V) is the highest effective deficit among backlogged users, or
  the last such value when nobody is backlogged. Priorities are measured from V,
  so the absolute zero of deficits, which the shift moves, never changes a
  decision.
- The deprioritization factor only ever lowers a heavy user's priority: it
  multiplies a distance above V and divides a distance below it.
- Burst credits are the same amount per unit of weight for every user (they grow
  while nothing is queued and halve when contention starts), so they can never
  reorder users; the seed's "use the whole idle cluster" already follows from
  dispatch being work-conserving.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable, Iterator
from dataclasses import dataclass

from .settings import SchedulerSettings

__all__ = ["FairShare", "UserState", "apply_factor", "heavy_factor", "seed_priority"]


def heavy_factor(usage_fraction: float, threshold: float, floor: float = 0.1) -> float:
    """The seed's deprioritization factor: 1 up to the threshold, then falling to ``floor``."""
    if usage_fraction <= threshold:
        return 1.0
    return max(floor, 1.0 - (usage_fraction - threshold) * 2.0)


def apply_factor(base: float, factor: float) -> float:
    """Lower ``base`` by ``factor`` (0 < factor <= 1) whatever its sign.

    Multiplying a negative number by 0.1 would raise it, helping the heavy user;
    below zero we divide instead, so the result is never above ``base``.
    """
    return base * factor if base >= 0 else base / factor


def seed_priority(deficit: float, burst: float, weight: float, factor: float, wait_bonus: float) -> float:
    """The seed's priority formula with the sign correction, for records and tests."""
    return apply_factor((deficit + burst) / weight, factor) + wait_bonus


@dataclass(slots=True)
class UserState:
    id: Hashable
    name: str
    group: str | None
    weight: float
    deficit: float = 0.0
    inflight_charge: float = 0.0
    """Estimated cost of this user's running jobs, charged until they complete."""
    recent: float = 0.0
    """Tokens completed within the fairness window."""
    factor: float = 1.0
    completion_ema: float | None = None
    """Moving average of this user's completion tokens: the estimate for the next job."""
    queued: int = 0
    running: int = 0
    version: int = 0
    """Bumped whenever this user's priority changes; stale heap entries carry an older one."""
    served: float = 0.0
    """Total cost completed, never shifted (for reports)."""

    @property
    def effective(self) -> float:
        return (self.deficit - self.inflight_charge) / self.weight


class FairShare:
    """Per-user fair-share accounting. Pure: every method that depends on time takes ``now``."""

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings
        self.users: dict[Hashable, UserState] = {}
        self._ref_heap: list[tuple[float, int, Hashable, int]] = []  # (-effective, seq, uid, version)
        self._seq = 0
        self._last_reference = 0.0
        self.burst_per_weight = 0.0
        self._idle_since: float | None = 0.0
        self._window: deque[tuple[float, Hashable, float]] = deque()
        self.global_recent = 0.0
        self._heavy: set[Hashable] = set()
        self._next_heavy_refresh = 0.0
        self.max_request_cost = settings.cost(0, settings.default_completion_tokens)
        self.shifts = 0

    # -- users -------------------------------------------------------------

    def set_user(self, uid: Hashable, weight: float, name: str | None = None, group: str | None = None) -> UserState:
        user = self.users.get(uid)
        if user is None:
            user = self.users[uid] = UserState(uid, str(uid) if name is None else name, group, weight)
        else:
            user.weight = weight
            if name is not None:
                user.name = name
            user.group = group
        self.touch(user)
        return user

    def touch(self, user: UserState) -> None:
        """Record that ``user``'s priority changed (the caller re-keys its queue heads)."""
        user.version += 1
        if user.queued:
            self._seq += 1
            heapq.heappush(self._ref_heap, (-user.effective, self._seq, user.id, user.version))
            if len(self._ref_heap) > 64 and len(self._ref_heap) > 4 * len(self.users):
                self._compact_reference()

    def _compact_reference(self) -> None:
        self._ref_heap = [(-u.effective, i, u.id, u.version) for i, u in enumerate(self.users.values()) if u.queued]
        heapq.heapify(self._ref_heap)

    # -- the reference V ---------------------------------------------------

    def reference(self) -> float:
        """Highest effective deficit among backlogged users (the last one seen if none)."""
        heap = self._ref_heap
        users = self.users
        while heap:
            neg, _, uid, version = heap[0]
            user = users.get(uid)
            if user is not None and user.version == version and user.queued:
                self._last_reference = -neg
                return -neg
            heapq.heappop(heap)
        return self._last_reference

    def return_credit(self) -> float:
        credit = self.settings.return_credit
        return self.max_request_cost if credit is None else credit

    def activate(self, user: UserState, now: float) -> None:
        """``user`` goes from nothing queued to backlogged: bound how far ahead it may be."""
        limit = self.reference() + self.return_credit() / user.weight
        if user.effective > limit:
            user.deficit = limit * user.weight + user.inflight_charge

    def priority(self, user: UserState, reference: float) -> float:
        """Priority of ``user`` measured from ``reference``, without the wait bonus."""
        base = user.effective - reference
        return base if user.factor == 1.0 else apply_factor(base, user.factor)

    def maybe_shift(self) -> bool:
        """Shift every user up together once deficits drift far below zero."""
        ref = self.reference()
        if ref > -self.settings.deficit_shift_threshold:
            return False
        for user in self.users.values():
            user.deficit -= ref * user.weight
            user.version += 1
        self._last_reference -= ref
        self._compact_reference()
        self.shifts += 1
        return True

    # -- burst credits -----------------------------------------------------

    def queue_became_empty(self, now: float) -> None:
        self._idle_since = now

    def contention_started(self, now: float) -> None:
        """Nothing was queued and now something is: accrue the idle time, then halve."""
        self.burst_per_weight = self.current_burst(now) * 0.5
        self._idle_since = None

    def current_burst(self, now: float) -> float:
        """Burst credits per unit of weight at ``now``."""
        if self._idle_since is None:
            return self.burst_per_weight
        gained = max(0.0, now - self._idle_since) * self.settings.credit_rate
        return min(self.settings.max_burst_credits, self.burst_per_weight + gained)

    # -- charges -----------------------------------------------------------

    def estimate(self, user: UserState, prompt_tokens: int, max_tokens: int | None) -> float:
        completion = user.completion_ema if user.completion_ema is not None else self.settings.default_completion_tokens
        if max_tokens is not None:
            completion = min(completion, max_tokens)
        cost = self.settings.cost(prompt_tokens, completion)
        if cost > self.max_request_cost:
            self.max_request_cost = cost
        return cost

    def charge_start(self, user: UserState, estimate: float) -> None:
        user.inflight_charge += estimate
        user.running += 1
        self.touch(user)

    def charge_end(
        self, user: UserState, estimate: float, cost: float, now: float, tokens: float, completion_tokens: float | None
    ) -> None:
        """A running job ended: replace its estimate with what it really cost."""
        user.inflight_charge -= estimate
        if user.inflight_charge < 1e-9:
            user.inflight_charge = 0.0
        user.running -= 1
        user.deficit -= cost
        user.served += cost
        if cost > self.max_request_cost:
            self.max_request_cost = cost
        if completion_tokens is not None:
            alpha = 0.2
            ema = user.completion_ema
            user.completion_ema = completion_tokens if ema is None else ema + alpha * (completion_tokens - ema)
        if tokens > 0:
            self._window.append((now, user.id, tokens))
            user.recent += tokens
            self.global_recent += tokens
        self.touch(user)

    def add_usage(self, uid: Hashable, tokens: float, at: float) -> None:
        """Replay usage recorded before a restart into the window (``at`` on the caller's clock)."""
        user = self.users.get(uid)
        if user is None or tokens <= 0:
            return
        self._window.append((at, uid, tokens))
        user.recent += tokens
        self.global_recent += tokens

    # -- heavy users -------------------------------------------------------

    def refresh(self, now: float) -> set[Hashable]:
        """Expire old usage and, at most once per ``heavy_refresh_interval``, re-rate heavy users.

        Returns the users whose factor changed (the caller re-keys them).
        """
        window = self._window
        horizon = now - self.settings.fairness_window
        users = self.users
        while window and window[0][0] < horizon:
            _, uid, tokens = window.popleft()
            self.global_recent -= tokens
            user = users.get(uid)
            if user is not None:
                user.recent -= tokens
        if not window:
            self.global_recent = 0.0
        if now < self._next_heavy_refresh:
            return set()
        self._next_heavy_refresh = now + self.settings.heavy_refresh_interval
        threshold = self.settings.deprioritize_threshold
        total = self.global_recent
        heavy: set[Hashable] = set()
        if total > 0:
            cut = threshold * total
            heavy = {uid for uid, user in users.items() if user.recent > cut}
            # Heavy means heavy next to others: a user alone in the window is using an idle cluster.
            if heavy and not any(user.recent > 0 for uid, user in users.items() if uid not in heavy):
                heavy = set()
        changed: set[Hashable] = set()
        for uid in heavy | self._heavy:
            user = users.get(uid)
            if user is None:
                continue
            factor = (
                heavy_factor(user.recent / total, threshold, self.settings.min_deprioritization)
                if uid in heavy and total > 0
                else 1.0
            )
            if factor != user.factor:
                user.factor = factor
                self.touch(user)
                changed.add(uid)
        self._heavy = heavy
        return changed

    @property
    def heavy(self) -> set[Hashable]:
        return self._heavy

    def usage_fraction(self, user: UserState) -> float:
        return user.recent / self.global_recent if self.global_recent > 0 else 0.0

    def __iter__(self) -> Iterator[UserState]:
        return iter(self.users.values())

    def check(self) -> None:
        """Assert the invariants (for tests)."""
        for user in self.users.values():
            assert user.weight > 0
            assert user.inflight_charge >= 0, user
            assert user.running >= 0 and user.queued >= 0, user
            assert user.factor <= 1.0
