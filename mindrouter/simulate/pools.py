"""Pools of contention and the fair-share accounting the report measures in each.

A *pool* is a set of backends that some users' jobs could share: backends are
joined when one model is served by both, and the pools are the connected
groups that result. Users compete only inside a pool, so targets, windows, the
service gap and Jain's index are all kept per pool: two users alone on
separate models are each owed all of their own pool, and are reported as fair.

Invariants of ``Pool``:

- A user's service in the pool is piecewise linear in time (prompt tokens when
  the prefill ends, completion tokens at the decode rate), so it is exact at
  any instant without per-token events. Fairness is judged in service units,
  the unit the core charges (``SchedulerSettings.cost``: prompt and completion
  tokens at their costs); tokens are kept beside them for the report.
- The *target* splits the service units of each epoch (an interval with one
  set of outstanding requests and one set of weights) from the workload alone (issue 18, case 4):
  while someone waits, the service delivered is owed by weighted max-min
  fairness in service units among the people with work in the pool, queued or
  running: each request holds at most one slot of a slot set that serves its
  model (``slots.SlotSets``), and a slot delivers the units per second of the
  person holding it (its outstanding requests' cost at their phases' mean
  sizes over the time they hold a slot), so a person's demand is its slots x
  that rate (``reweigh_targets``; ``maxmin.max_min`` water-fills it); each
  group of people who compete for slots (``slots.contention``) is owed what
  it delivered, split by those rates; weights are entitlements (under group shares a
  group's weight divided among its members with work). While no one waits
  everyone gets what it asked for, so each is owed what it received. What the
  scheduler has charged anyone never enters.
- Service over entitlement (``x``) is continuous: when an entitlement changes,
  only the slope changes from then on, so a weight change never rewrites the
  past, which is how the service gap is measured across weight changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..scheduler.pooling import joined
from ._gap import GapTracker
from .maxmin import max_min_units
from .scenario import BackendSpec
from .slots import SlotSets, contention

__all__ = ["Pool", "PoolWindow", "find_pools"]


def find_pools(backends: Sequence[BackendSpec]) -> list[tuple[BackendSpec, ...]]:
    """Group backends that share a model, transitively, in the order they are listed (the core's pools)."""
    return [tuple(backends[i] for i in group) for group in joined([b.models for b in backends])]


@dataclass(slots=True)
class PoolWindow:
    start: float
    end: float
    tokens: list[float]
    units: list[float]
    """Service units delivered to each user in the window: what ``targets`` split."""
    targets: list[float]
    backlogged: float
    """Seconds of the window during which someone was backlogged in the pool."""
    outlasting: int
    """Most requests running at once in the window that each take longer than a window."""
    outlasting_users: set[int]
    """Users with such a request running in the window."""

    @classmethod
    def opened(cls, start: float, users: int, long_running: list[int]) -> PoolWindow:
        """A window from ``start`` on, its ``end`` set when it closes; ``long_running``: per user, requests
        running at ``start`` that take longer than a window."""
        held = {u for u, n in enumerate(long_running) if n}
        return cls(start, start, [0.0] * users, [0.0] * users, [0.0] * users, 0.0, sum(long_running), held)


#: Entitlements of the backlogged users (indexes) of a pool, by the current weights.
Entitlement = Callable[[Sequence[int]], dict[int, float]]


class Pool:
    """One pool's per-user service lines, backlog, targets, windows and service gaps."""

    def __init__(
        self,
        index: int,
        backends: tuple[BackendSpec, ...],
        slot_sets: SlotSets,
        users: int,
        entitlement: Entitlement,
        *,
        prompt_cost: Callable[[str], float],
        completion_cost: float,
        window: float,
    ) -> None:
        self.index = index
        self.backends = backends
        self.models = frozenset(m for b in backends for m in b.models)
        self.slots = sum(b.max_concurrent for b in backends)
        self.entitlement = entitlement
        self.pc, self.cc = prompt_cost, completion_cost
        self.window = window
        self.members: list[int] = []
        """Users who sent a request here, in order of their first."""
        self.prompt_done = [0.0] * users
        self.prompt_units = [0.0] * users
        """Its prompt tokens read, in service units (each at its model's prompt weight when read)."""
        self.c_base = [0.0] * users
        self.c_rate = [0.0] * users
        self.queued = [0] * users
        self.outstanding: list[dict[str, int]] = [{} for _ in range(users)]
        """Each user's requests queued or running here, by model."""
        self.sizes: list[dict[str, list[float]]] = [{} for _ in range(users)]
        """The mean prompt and completion tokens of those requests (their phases'), summed by model."""
        self.demand_changed = False
        self.arrived: dict[int, int] = {}
        """Requests each user sent in the current batch."""
        self.owed: dict[int, tuple[int, float, float]] | None = None
        """Each user's group of contention (``slots.contention``), its fraction of what its group delivers
        in the current epoch, and of what the pool delivers; None while no one waits."""
        self.slot_sets = slot_sets
        self.serves = slot_sets.serves
        self.capacity = slot_sets.capacity
        self.backlogged: list[int] = []
        self.is_backlogged = [False] * users
        self.ever_backlogged = [False] * users
        self.share_weight = [1.0] * users
        """Each user's entitlement as of the last epoch it was backlogged in."""
        self.x_off = [0.0] * users
        self.dispatched = [0.0] * users
        """Cost dispatched over entitlement: the scheduler's decisions alone."""
        self.started_units = [0.0] * users
        """Cost of every request started here: less the service so far, what is still running."""
        self.batch_started: dict[int, float] = {}
        """Cost of the requests each user started in the current batch: chosen with the batch's backlog."""
        self.target = [0.0] * users
        """Service units each user is owed, summed over epochs."""
        self.epoch_tokens = [0.0] * users
        self.epoch_units = [0.0] * users
        self.epoch_start = 0.0
        self.changed: set[int] = set()
        self.long_running = [0] * users
        """Each user's requests running here that take longer than a window."""
        self.open = PoolWindow.opened(0.0, users, self.long_running)
        """The window being filled."""
        self.windows: list[PoolWindow] = []
        self.gap = GapTracker(users)
        """Service as generated."""
        self.dispatch_gap = GapTracker(users)
        """Service counted whole at dispatch."""
        self.max_request_cost = 0.0
        self.max_prompt_cost = 0.0
        """The largest prompt's units: counted whole when its prefill ends."""
        self.min_entitlement = 1.0
        """The smallest entitlement a backlogged user had, if below 1 (group shares: a member's part)."""
        self.decoded_base = 0.0
        self.decoded_rate = 0.0
        """Completion tokens of every user here, as generated: ``decoded_base + decoded_rate * t``."""

    @property
    def gap_bound(self) -> float:
        """2 x the largest request cost, over the smallest entitlement when that is below 1.

        Two users a and b each one request off their fair position are
        ``cost / w_a + cost / w_b`` apart in service over entitlement.
        """
        return 2 * self.max_request_cost / self.min_entitlement

    def compete(self, models: dict[int, set[str]]) -> None:
        """Tell the gap trackers who competes, from the models each user sends here (``slots.contention``)."""
        candidates = {u: frozenset().union(*(self.serves[m] for m in held)) for u, held in models.items()}
        for u, g in contention(candidates).items():
            self.gap.group[u] = self.dispatch_gap.group[u] = g
            self.gap.slots[u] = self.dispatch_gap.slots[u] = candidates[u]

    # -- service lines --------------------------------------------------------

    def tokens(self, u: int, t: float) -> float:
        return self.prompt_done[u] + self.c_base[u] + self.c_rate[u] * t

    def service(self, u: int, t: float) -> float:
        """Service units of ``u`` by ``t``: its tokens at the prompt and completion costs."""
        a, b = self._cost_line(u)
        return a + b * t

    def _cost_line(self, u: int) -> tuple[float, float]:
        """Service in cost units as ``a + b * t``."""
        return self.prompt_units[u] + self.cc * self.c_base[u], self.cc * self.c_rate[u]

    def _set_line(self, u: int) -> None:
        a, b = self._cost_line(u)
        w = self.share_weight[u]
        self.gap.set(u, a / w + self.x_off[u], b / w)

    def prefill_done(self, u: int, prompt: int, rate: float, now: float, model: str = "") -> None:
        self.prompt_done[u] += prompt
        if prompt:
            units = prompt * self.pc(model)
            self.prompt_units[u] += units
            self.max_prompt_cost = max(self.max_prompt_cost, units)
        self.c_rate[u] += rate
        self.c_base[u] -= rate * now
        self.decoded_rate += rate
        self.decoded_base -= rate * now
        self._set_line(u)

    def decode_done(self, u: int, rate: float, now: float) -> None:
        self.c_rate[u] -= rate
        self.c_base[u] += rate * now
        self.decoded_rate -= rate
        self.decoded_base += rate * now
        if self.c_rate[u] < 1e-9:  # no decode left: drop rounding so the line stays exact
            self.c_rate[u] = 0.0
        self._set_line(u)

    def decode_rate_changed(self, u: int, old: float, new: float, now: float) -> None:
        """A stream of ``u`` decodes at ``new`` tokens/s from ``now`` on, no longer at ``old`` (streams share a GPU)."""
        self.decode_done(u, old, now)
        self.prefill_done(u, 0, new, now)

    def decoded(self, t: float) -> float:
        """Completion tokens generated here by ``t``."""
        return self.decoded_base + self.decoded_rate * t

    # -- queue ------------------------------------------------------------------

    def submitted(self, u: int, model: str, size: tuple[float, float]) -> None:
        """A request of ``u`` arrived; ``size``: its phase's mean prompt and completion tokens."""
        if u not in self.members:
            self.members.append(u)
        self.queued[u] += 1
        self.arrived[u] = self.arrived.get(u, 0) + 1
        self._outstanding(u, model, 1, size)
        self.changed.add(u)

    def _outstanding(self, u: int, model: str, step: int, size: tuple[float, float]) -> None:
        held = self.outstanding[u]
        held[model] = held.get(model, 0) + step
        sums = self.sizes[u].setdefault(model, [0.0, 0.0])
        sums[0] += step * size[0]
        sums[1] += step * size[1]
        if not held[model]:
            del held[model], self.sizes[u][model]  # drop rounding with the last one
        self.demand_changed = True

    def expired(self, u: int, model: str, size: tuple[float, float]) -> None:
        """A queued request of ``u`` timed out."""
        self.left_queue(u)
        self._outstanding(u, model, -1, size)

    def left_queue(self, u: int) -> None:
        self.queued[u] -= 1
        self.changed.add(u)

    def started(self, u: int, cost: float, seconds: float) -> None:
        """A request of ``u`` was dispatched; it will cost ``cost`` and take ``seconds``."""
        self.left_queue(u)
        self.max_request_cost = max(self.max_request_cost, cost)
        self.started_units[u] += cost
        self.batch_started[u] = self.batch_started.get(u, 0.0) + cost
        self.dispatched[u] += cost / self.share_weight[u]
        self.dispatch_gap.set(u, self.dispatched[u], 0.0)
        if seconds > self.window:
            self.long_running[u] += 1
            self.open.outlasting = max(self.open.outlasting, sum(self.long_running))
            self.open.outlasting_users.add(u)

    def finished(self, u: int, model: str, seconds: float, size: tuple[float, float]) -> None:
        self._outstanding(u, model, -1, size)
        if seconds > self.window:
            self.long_running[u] -= 1

    # -- epochs -----------------------------------------------------------------

    def end_batch(self, now: float) -> None:
        """Move users in or out of the backlog, re-weigh, and sample the gaps."""
        flips = [u for u in self.changed if (self.queued[u] > 0) != self.is_backlogged[u]]
        # Requests that started as they came: their users passed through the queue in this batch.
        through = [u for u in self.changed if u in self.arrived and not self.queued[u] and not self.is_backlogged[u]]
        self.changed.clear()
        joined: list[int] = []
        left: list[int] = []
        if flips or self.demand_changed:
            self.close_epoch(now)
        if flips:
            for u in flips:
                if self.queued[u] > 0:
                    self.backlogged.append(u)
                    self.is_backlogged[u] = self.ever_backlogged[u] = True
                    joined.append(u)
                else:
                    self.backlogged.remove(u)
                    self.is_backlogged[u] = False
                    left.append(u)
            self.reweigh(now)
        elif self.demand_changed:
            self.reweigh_targets()
        self.gap.settle(
            now, joined, left, self.backlogged if joined else [], self._head_starts(now) if joined else None
        )
        self.dispatch_gap.settle(now, joined, left, self.backlogged if joined else [])
        came = joined + through
        if came:  # idle: all it has outstanding came in this batch (what ended in it is gone)
            idle = {u for u in came if sum(self.outstanding[u].values()) == self.arrived[u]}
            self.gap.returned(now, came, idle, self.backlogged)
            self.dispatch_gap.returned(now, came, idle, self.backlogged)
        if left or through:
            self.gap.emptied(now, left + through, self.backlogged)
            self.dispatch_gap.emptied(now, left + through, self.backlogged)
        self.arrived.clear()
        self.batch_started.clear()

    def _head_starts(self, now: float) -> list[float]:
        """What each user's requests started before ``now`` have still to deliver, over its entitlement."""
        fresh = self.batch_started
        return [
            max(0.0, started - fresh.get(u, 0.0) - self.service(u, now)) / w
            for u, (started, w) in enumerate(zip(self.started_units, self.share_weight, strict=True))
        ]

    def reweigh(self, now: float) -> None:
        """Take the backlogged users' current entitlements; ``x`` stays continuous, only its slope changes.

        Call ``close_epoch`` first, while the old weights still apply.
        """
        for u, w in self.entitlement(self.backlogged).items():
            self.min_entitlement = min(self.min_entitlement, w)
            old = self.share_weight[u]
            if w != old:
                a, b = self._cost_line(u)
                self.x_off[u] += (a + b * now) * (1 / old - 1 / w)
                self.share_weight[u] = w
                self._set_line(u)
        self.reweigh_targets()

    def reweigh_targets(self) -> None:
        """What each user is owed of the next epoch: weighted max-min in units among those with work.

        Slots deliver units at the rate of whoever holds one: in ``few-outstanding`` with big at
        weight 2, big's 2 slots of 30,000-token prompts deliver 9,684 units a second and small's
        4 chat streams 530, so max-min of the slots (2 and 2) would owe big 50% where its weight's
        share of the units, 66.7%, takes it a fifth of a slot.
        """
        self.demand_changed = False
        demand = {u: sum(held.values()) for u, held in enumerate(self.outstanding) if held}
        if sum(demand.values()) <= sum(self.capacity.values()) and not any(self.queued):
            self.owed = None
            return
        weights = self.entitlement(list(demand))
        candidates = {u: frozenset().union(*(self.serves[m] for m in self.outstanding[u])) for u in demand}
        rate = {u: self.slot_sets.units_per_second(self.sizes[u], self.pc, self.cc) for u in demand}
        alloc = max_min_units(weights, rate, demand, candidates, self.capacity)
        total = sum(alloc.values())
        if total <= 0:
            self.owed = None
            return
        group = contention(candidates)
        held: dict[int, float] = {}
        for u, a in alloc.items():
            held[group[u]] = held.get(group[u], 0.0) + a
        self.owed = {u: (group[u], a / held[group[u]] if held[group[u]] else 0.0, a / total) for u, a in alloc.items()}

    def close_epoch(self, now: float) -> None:
        """Share out the service delivered since the last epoch boundary (see the module's invariants)."""
        span = now - self.epoch_start
        total = 0.0
        owed = self.owed
        deltas = {}
        for u in self.members:
            tokens = self.tokens(u, now)
            self.open.tokens[u] += tokens - self.epoch_tokens[u]
            self.epoch_tokens[u] = tokens
            units = self.service(u, now)
            delta = units - self.epoch_units[u]
            self.epoch_units[u] = units
            self.open.units[u] += delta
            deltas[u] = delta
            total += delta
            if owed is None:
                self.target[u] += delta
                self.open.targets[u] += delta
        if owed is not None:
            delivered: dict[int, float] = {}
            for u, (group, _, _) in owed.items():
                delivered[group] = delivered.get(group, 0.0) + deltas.get(u, 0.0)
            stray = total - sum(delivered.values())
            for u, (group, inside, fraction) in owed.items():
                due = delivered[group] * inside + stray * fraction
                self.target[u] += due
                self.open.targets[u] += due
        if self.backlogged:
            self.open.backlogged += span
        self.epoch_start = now

    def close_window(self, now: float) -> None:
        self.close_epoch(now)
        self.open.end = now
        self.windows.append(self.open)
        self.open = PoolWindow.opened(now, len(self.open.tokens), self.long_running)

    def finish(self, end: float) -> None:
        self.gap.finish(end)
        self.dispatch_gap.finish(end)
        if end > self.open.start:
            self.close_window(end)
        else:
            self.close_epoch(end)
