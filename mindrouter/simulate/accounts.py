"""The simulated users as accounts: their weights and groups, and what each is entitled to in a pool.

Weights have two readers that must agree: the scheduler core, which decides
with them, and every ``Pool``, which measures the target shares the report
holds the core to. ``Accounts`` keeps them in one place: it tells the core of
every change, and the pools read entitlements back from it, so a weight event
cannot reach one and miss the other.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..scheduler import Scheduler
from .runs import UserRun
from .scenario import EventSpec, Scenario

__all__ = ["Accounts"]


class Accounts:
    """One ``UserRun`` per user name, in the order names first appear, and the group weights in force."""

    def __init__(self, scenario: Scenario, sched: Scheduler) -> None:
        self.sched = sched
        self.shares = scenario.settings.shares
        self.group_weights = dict(scenario.settings.group_weights)
        self.users: list[UserRun] = []
        self.by_name: dict[str, UserRun] = {}
        for spec in scenario.users:
            if spec.name not in self.by_name:
                user = UserRun(len(self.users), spec.name, spec.group, spec.weight_override, spec.weight)
                self.by_name[spec.name] = user
                self.users.append(user)
        for user in self.users:
            self._tell_core(user)

    def entitlement(self, backlogged: Sequence[int]) -> dict[int, float]:
        """What each backlogged user of a pool is entitled to, relative to the others.

        With ``shares = "user"`` that is its weight. With ``"group"``, a group's
        weight is its share, divided among its backlogged members by their own
        weights inside it (``weight_override``, else 1).
        """
        users = self.users
        if self.shares == "user":
            return {u: users[u].weight for u in backlogged}
        inner = {u: users[u].weight_override or 1.0 for u in backlogged}
        totals: dict[str | None, float] = {}
        for u in backlogged:
            totals[users[u].group] = totals.get(users[u].group, 0.0) + inner[u]
        return {u: self._group_weight(users[u]) * inner[u] / totals[users[u].group] for u in backlogged}

    def set_weight(self, event: EventSpec) -> None:
        """Change one user's or one group's weight, and tell the core, as ``mr user/group set-weight`` would."""
        if event.user is not None:
            user = self.by_name[event.user]
            user.weight_override = event.weight
            user.weight = event.weight or self.group_weights.get(user.group or "", 1.0)
            self._tell_core(user)
        else:
            assert event.group is not None and event.weight is not None
            self.group_weights[event.group] = event.weight
            for user in self.users:
                if user.group == event.group and user.weight_override is None:
                    user.weight = event.weight
            self.sched.set_group(event.group, event.weight)

    def _group_weight(self, user: UserRun) -> float:
        """The weight of ``user``'s group (its own weight when it has no group of known weight)."""
        weight = self.group_weights.get(user.group) if user.group is not None else None
        return user.weight if weight is None else weight

    def _tell_core(self, user: UserRun) -> None:
        self.sched.set_user(
            user.index,
            user.weight,
            name=user.name,
            group=user.group,
            weight_override=user.weight_override,
            group_weight=self.group_weights.get(user.group) if user.group is not None else None,
        )
