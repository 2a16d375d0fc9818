"""Fair-share accounting across pools: users, group weights, seats, charges, burst credits.

Invariants (checked by ``FairShare.check()`` in tests):

- Every user has one ``UserState``; in each pool it has used it has one ``Seat``
  (``pools.py`` holds the per-pool rules: reference, placement, heavy seats).
- Shares are per user by default: a seat weighs its user's weight. With
  ``shares = "group"`` a group's weight is its share of a pool, divided among
  its members active there (queued or running), each in proportion to its
  ``weight_override`` (1 without one): Slurm's hierarchical fair share.
- A weight change, whether set by an admin or caused by a group member coming
  or going, changes only the rate at which a seat moves from then on, and the
  price of what its running jobs were charged ahead for service still to come.
- A running job is charged as its service is produced, a little ahead: its
  prompt and a provisional answer when it starts, then one or two typical
  answers beyond what it has streamed (never past its expected total, unless
  it outlives it), then settled against the backend's token counts when it
  ends. A job that does not stream is charged its expected answer at once,
  capped by ``max_tokens`` but never ``max_tokens`` itself.
- Burst credits are the same amount per unit of weight for every user (they
  grow while nothing is queued and halve when contention starts), so they
  never reorder users; they are reported, not used as a priority term. What
  a user back from idle may gain is the pool's bounded return credit instead.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator

from ..jobs import Job
from ..pooling import PoolKey
from ..settings import SchedulerSettings, check_weight
from .pools import Pool, Seat, UserState
from .prices import Prices

__all__ = ["FairShare"]


class FairShare:
    """Per-user, per-pool fair-share accounting. Pure: every method that depends on time takes ``now``."""

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings
        self.prices = Prices(settings)
        self.users: dict[Hashable, UserState] = {}
        self.groups: dict[str, float] = {}
        """Group weights the core was told (group shares)."""
        self.pools: dict[PoolKey, Pool] = {}
        self.group_shares = settings.shares == "group"
        self._active: dict[tuple[PoolKey, str | None], set[Hashable]] = {}
        self.burst_per_weight = 0.0
        self._idle_since: float | None = 0.0

    # -- users and groups --------------------------------------------------

    def set_user(
        self,
        uid: Hashable,
        weight: float,
        name: str | None = None,
        group: str | None = None,
        override: float | None = None,
        group_weight: float | None = None,
    ) -> tuple[UserState, list[Seat]]:
        """Add or change a user; returns it and the seats whose priority needs a new key.

        Raises ValueError, changing nothing, when a weight is not a finite number above 0.
        """
        for value in (weight, override, group_weight):
            if value is not None:
                check_weight(value)
        user = self.users.get(uid)
        if user is None:
            user = self.users[uid] = UserState(uid, str(uid) if name is None else name, group, weight, override)
            return user, []
        moved = user.group != group
        if moved:
            for pool in self.pools.values():
                seat = pool.seats.get(uid)
                if seat is not None and (seat.queued or seat.running):
                    self._active.get((pool.key, user.group), set()).discard(uid)
                    self._active.setdefault((pool.key, group), set()).add(uid)
        old_group = user.group
        user.weight, user.override, user.group = weight, override, group
        if name is not None:
            user.name = name
        if group is not None and group_weight is not None:
            self.groups[group] = group_weight
        changed = self._reweigh_user(user)
        if moved and self.group_shares:
            for pool in self.pools.values():
                changed += self._reweigh_group(pool, old_group)
        return user, changed

    def set_group(self, name: str, weight: float) -> list[Seat]:
        """A group's weight changed: its members without an override follow, from now on."""
        self.groups[name] = weight = check_weight(weight)
        changed: list[Seat] = []
        for user in self.users.values():
            if user.group == name and user.override is None:
                user.weight = weight
                if not self.group_shares:
                    changed += self._reweigh_user(user)
        if self.group_shares:
            for pool in self.pools.values():
                changed += self._reweigh_group(pool, name)
        return changed

    def remove_user(self, uid: Hashable) -> None:
        """Forget a user that has nothing queued or running, and its seats."""
        user = self.users.get(uid)
        if user is None:
            return
        if user.queued or user.running:
            raise ValueError(f"user {user.name!r} still has jobs queued or running")
        del self.users[uid]
        for pool in self.pools.values():
            pool.seats.pop(uid, None)

    def _group_weight(self, user: UserState) -> float:
        known = self.groups.get(user.group) if user.group is not None else None
        if known is not None:
            return known
        if user.override is None:
            return user.weight
        return self.settings.group_weights.get(user.group or "", 1.0)

    def weight_in(self, pool: Pool, user: UserState) -> float:
        """The weight ``user`` has (or would have, once active) in ``pool``."""
        if not self.group_shares:
            return user.weight
        inner = user.override or 1.0
        members = self._active.get((pool.key, user.group), set())
        total = sum(self.users[u].override or 1.0 for u in members if u != user.id) + inner
        return self._group_weight(user) * inner / total

    def _reweigh_user(self, user: UserState) -> list[Seat]:
        changed: list[Seat] = []
        for pool in self.pools.values():
            if self.group_shares:
                changed += self._reweigh_group(pool, user.group)
            else:
                seat = pool.seats.get(user.id)
                if seat is not None:
                    changed += self._set_weight(pool, seat, user.weight)
        return changed

    def _reweigh_group(self, pool: Pool, group: str | None) -> list[Seat]:
        changed: list[Seat] = []
        for uid in self._active.get((pool.key, group), ()):
            seat = pool.seats[uid]
            changed += self._set_weight(pool, seat, self.weight_in(pool, seat.user))
        return changed

    @staticmethod
    def _set_weight(pool: Pool, seat: Seat, weight: float) -> list[Seat]:
        """Returns ``seat`` when its key moved: a heavy seat's key depends on its weight, and what it
        was charged ahead for service still to come is priced again at the new weight.

        Service is charged at the weight of the moment it is produced. Charged at the old weight,
        the 4 streams a user had running when its weight went from 1 to 2 kept it 960 units per
        weight behind its new share (set-weight: gap 1,760 of 1,600).
        """
        old = seat.weight
        if old == weight:
            return []
        seat.weight = weight
        if seat.unproduced > 0:
            seat.lag += seat.unproduced * (1 / old - 1 / weight)
        elif seat.factor == 1.0:
            return []
        pool.touch(seat)
        return [seat]

    # -- pools and seats ---------------------------------------------------

    def pool(self, key: PoolKey) -> Pool:
        pool = self.pools.get(key)
        if pool is None:
            pool = self.pools[key] = Pool(key, self.settings)
        return pool

    def seat(self, pool: Pool, user: UserState) -> tuple[Seat, bool]:
        """``user``'s seat in ``pool``, and whether it was just made."""
        seat = pool.seats.get(user.id)
        if seat is not None:
            return seat, False
        seat = pool.seats[user.id] = Seat(user, pool.reference(), self.weight_in(pool, user))
        return seat, True

    def activity(self, pool: Pool, seat: Seat) -> list[Seat]:
        """Call after ``seat``'s queued or running count changed: group shares follow who is active."""
        key = (pool.key, seat.user.group)
        members = self._active.get(key)
        active = bool(seat.queued or seat.running)
        if active == (members is not None and seat.user.id in members):
            return []
        if active:
            self._active.setdefault(key, set()).add(seat.user.id)
        else:
            assert members is not None
            members.discard(seat.user.id)
        if not self.group_shares:
            return []
        changed = self._reweigh_group(pool, seat.user.group)
        if not active:
            changed += self._set_weight(pool, seat, self.weight_in(pool, seat.user))
        return changed

    # -- burst credits (reported; the same per unit of weight for everyone) --

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

    def provisional_answer(self, user: UserState, pool: Pool, job: Job) -> tuple[float, float]:
        """``(total, ahead)`` for a job starting now: how long its answer is expected to be, in
        completion tokens, and how far ahead of what it has streamed to charge it (see ``ledger.py``).

        The total is the larger of the user's usual answer and the pool's slot answer
        (``Pool.slot_answer``: a short history is not trusted with a slot that long
        answers keep busy), at most ``max_tokens``; while the user has no completed
        answer it is unknown: ``max_tokens``, else unbounded, and a stream is charged
        one typical answer ahead of what it has produced (``answers_ahead`` slot
        answers once known), so a user taking several slots at once moves by each of
        them, and one whose answers are long is charged as they are produced, not
        all at the start. A job that
        does not stream reports nothing before its end. Its total is the expected
        answer (the larger of the user's usual and the pool's slot answer, at most
        ``max_tokens``), never ``max_tokens`` itself, so what a request asks for
        never changes a share (a 100,000 ``max_tokens`` had taken every slot from
        the others, or 3 of its sender's 4). Where one stream's rate on its
        (backend, model) is known, the clock stands in for its progress and it is
        charged as a stream is (``Ledger.tick``); else its whole total at once.
        """
        max_tokens = job.max_tokens
        usual = user.completion_ema
        slot = pool.slot_answer
        total = max(self.settings.default_completion_tokens if usual is None else usual, slot)
        ahead = self.settings.answers_ahead * slot if usual is not None else pool.answer
        if not job.stream:
            return (total if max_tokens is None else min(total, float(max_tokens))), ahead
        if usual is None:
            total = math.inf
        if max_tokens is not None:
            total = min(total, float(max_tokens))
        return total, ahead

    def learn_completion(self, user: UserState, completion_tokens: float) -> None:
        alpha = self.settings.completion_ema_alpha
        ema = user.completion_ema
        user.completion_ema = completion_tokens if ema is None else ema + alpha * (completion_tokens - ema)

    def add_usage(
        self, uid: Hashable, model: str, prompt: float, completion: float, at: float, pool: PoolKey | None = None
    ) -> None:
        """Replay usage recorded before a restart (``at`` on the caller's clock) into a pool's window.

        Without ``pool``, it goes to every pool the user has a seat in, or is dropped if none.
        """
        user = self.users.get(uid)
        tokens = prompt + completion
        if user is None or tokens <= 0:
            return
        units = self.prices.cost(model, prompt, completion)
        pools = [self.pool(pool)] if pool is not None else [p for p in self.pools.values() if uid in p.seats]
        for p in pools:
            seat, _ = self.seat(p, user)
            p.add_usage(seat, tokens, units, at)

    def active(self) -> dict[Hashable, UserState]:
        """The users with jobs queued or running, or usage in a pool's fairness window (as of its last refresh).

        Costs what they number, not what the registered users do: a listing of 10,000 accounts'
        standing walked them all on the event loop (56 ms a `/v1/me`, issue 33).
        """
        ids: dict[Hashable, None] = {}
        for members in self._active.values():
            ids.update(dict.fromkeys(members))
        for pool in self.pools.values():
            ids.update(dict.fromkeys(pool.windowed))
        users = self.users
        return {uid: users[uid] for uid in ids if uid in users}

    def __iter__(self) -> Iterator[UserState]:
        return iter(self.users.values())

    def check(self) -> None:
        """Assert the invariants (for tests)."""
        for user in self.users.values():
            assert user.weight > 0
            assert user.running >= 0 and user.queued >= 0, user
        for pool in self.pools.values():
            pool.check()
            for seat in pool.seats.values():
                active = bool(seat.queued or seat.running)
                assert active == (seat.user.id in self._active.get((pool.key, seat.user.group), ())), seat
