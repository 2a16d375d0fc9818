"""Who was passed over: waiting while a slot it could use was free, or went to someone whose turn was later.

A request that waits for a slot to free is not a decision of the scheduler:
Ollama cannot pause a stream, so while every slot a user's requests could take
is held, no scheduler that never interrupts a running request starts them
sooner. Starvation (``UserRun.max_starved``) counts that wait; this module
counts the part the scheduler chose. A user with something queued is *passed
over* at an instant when

- a slot it could use has been free for longer than ``[scheduler]
  anticipation`` after the scheduler decided (a slot of a backend that serves
  one of its queued models, with a request slot left there and, on a backend
  with per-model slots, its model loaded or loading there: a load takes
  seconds and evicts someone, so a slot that needs one is not free); the core
  may hold a slot that long for a closed-loop client about to send again
  (``mindrouter.scheduler.fairness.holds``), so a hold never counts, and a slot left
  free longer counts from the end of that grace; or
- such a slot went to someone whose turn was later by more than one request:
  whose VTC counter (service over entitlement, kept by issue 18's rules from
  the workload alone: ``_gap.GapTracker.returned``) was ahead of the waiting
  user's by more than the largest request so far (over the smaller
  entitlement of the two), both as generated (``Pool.gap``) and counted
  whole at dispatch (``Pool.dispatch_gap``). A scheduler that serves the
  lowest counter of either measure is never flagged. The margin is fair
  queueing's granularity (a weighted fair queue may finish a packet up to one
  largest packet later than the fluid ideal, Parekh and Gallager 1993): a
  scheduler learns a request's size only as it runs, and one that charges an
  estimate ahead misorders two users by up to one request whatever it does.

From that instant until one of its requests starts (or its queue empties, or
the run ends) it is passed over; ``UserRun.max_passed_over`` is the longest
such stretch. Every instant it counts lies inside a starvation stretch, so it
is never longer than the user's longest starvation.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence

from .pools import Pool
from .runs import BackendRun, UserRun
from .workstation import Workstation

__all__ = ["Turns"]


class Turns:
    """The slots in use per slot set and each user's queued requests per model, for finding who was passed over."""

    def __init__(
        self,
        pools: Sequence[Pool],
        users: Sequence[UserRun],
        backends: Mapping[str, BackendRun],
        stations: Mapping[str, Workstation],
        grace: float = 0.0,
    ) -> None:
        self.pools = pools
        self.grace = grace
        """Seconds a slot may stay free before it passes anyone over (the core's ``anticipation``)."""
        self.free_since: dict[str, deque[float]] = {}
        """Since when each free slot of each slot set has been free while someone waited, oldest first:
        a request that starts takes the oldest (slots of a set are interchangeable)."""
        self.users = users
        self.backends = backends
        self.stations = stations
        self.in_use: dict[str, int] = {k: 0 for p in pools for k in p.capacity}
        """Requests the router has running in each slot set."""
        self.waiting: list[dict[str, int]] = [{} for _ in users]
        """Each user's queued requests, by model."""

    def queued(self, user: int, model: str, step: int) -> None:
        """``user`` has ``step`` more requests for ``model`` in the scheduler's queue."""
        held = self.waiting[user]
        held[model] = held.get(model, 0) + step
        if not held[model]:
            del held[model]

    def _within_wait(self, u: int, at: float) -> float:
        """``at``, or the start of ``u``'s current starvation if later: no one is passed over before it waits."""
        since = self.users[u].starved_since
        return at if since is None else max(at, since)

    def _wants(self, pool: Pool, u: int, slots: set[str]) -> bool:
        """Whether a queued request of ``u`` could take a slot of one of ``slots``."""
        return any(not slots.isdisjoint(pool.serves.get(m, ())) for m in self.waiting[u])

    def started(self, pool: Pool, user: int, backend: str, model: str, now: float) -> None:
        """A request of ``user`` takes a slot: who could have taken it and was owed it first is passed over."""
        key = pool.slot_sets.of[backend, model]
        self.in_use[key] += 1
        generated, whole = pool.gap, pool.dispatch_gap
        by_generated, by_whole = generated.counter(user, now), whole.counter(user, now)
        weight, largest = pool.share_weight[user], pool.max_request_cost
        users, serves = self.users, pool.serves
        free = self.free_since.get(key)
        since = free.popleft() if free else None
        late = since is not None and since + self.grace < now - 1e-9  # free past the grace until now
        for u in pool.backlogged:
            if u == user or users[u].passed_since is not None:
                continue
            if late and any(key in serves.get(m, ()) for m in self.waiting[u]):
                users[u].passed_over(self._within_wait(u, since + self.grace))  # type: ignore[operator]
                continue
            margin = largest / min(weight, pool.share_weight[u])
            if by_generated - generated.counter(u, now) <= margin or by_whole - whole.counter(u, now) <= margin:
                continue
            if any(key in serves.get(m, ()) for m in self.waiting[u]):
                users[u].passed_over(now)

    def ended(self, pool: Pool, backend: str, model: str) -> None:
        self.in_use[pool.slot_sets.of[backend, model]] -= 1

    def check_free(self, now: float) -> None:
        """After the scheduler decided: everyone still waiting for a slot free past the grace is passed over."""
        for pool in self.pools:
            free: set[str] = set()
            for spec in pool.backends if pool.backlogged else ():
                if self.backends[spec.name].busy >= spec.max_concurrent:
                    continue
                resident = self.stations[spec.name].runners
                for m in spec.models:
                    key = pool.slot_sets.of[spec.name, m]
                    if m in resident and self.in_use[key] < pool.capacity[key]:
                        free.add(key)
            for key in pool.capacity:
                if key not in free:
                    self.free_since.pop(key, None)
            if not free:
                continue
            since = {}
            for key in free:
                slots = self.free_since.setdefault(key, deque())
                count = math.ceil(pool.capacity[key] - self.in_use[key])
                while len(slots) > count:
                    slots.popleft()
                slots.extend([now] * (count - len(slots)))
                since[key] = slots[0] + self.grace
            for u in pool.backlogged:
                if self.users[u].passed_since is not None:
                    continue
                late = [at for key, at in since.items() if at <= now + 1e-9 and self._wants(pool, u, {key})]
                if late:
                    self.users[u].passed_over(self._within_wait(u, min(late)))
