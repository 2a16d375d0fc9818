"""The service gap: the largest drift between two users' weighted service while both are backlogged.

Only users who compete for slots are compared (``slots``: a slot set both
could take): two users of models with separate slots on the same backends, or
of models on different backends of one pool, never take each other's slots, so
nothing bounds how far apart they drift; their shares are judged against their
targets instead. Competing is not transitive: a third user whose model both
backends serve competes with each, not joining the two (issue 30: such a pair
reported a gap of 1,122,240 against a bound of 1,600 after a late joiner).

Each user's service over weight is a piecewise-linear function of time,
``x_i(t) = a_i + b_i * t``, that changes only at events. For users i and j
backlogged together since T, the gap is ``|(x_i(t) - x_j(t)) - (x_i(T) - x_j(T))|``.
Between events that difference is linear, so its extremes lie at event times,
on one side or the other of a jump; the tracker therefore evaluates a pair
only where one of its lines changes (just before and just after the batch)
and never in between. A batch costs O(changed users x backlogged users).

Work already running when a pair becomes backlogged is delivered afterwards
whatever the scheduler does (Ollama cannot pause a stream): a user alone on
four slots when another arrives keeps all four until they free. So each pair
also remembers each side's head start, what its running requests had still to
deliver at that moment (over weight), and ``beyond`` is the largest gap less
the head start of the side ahead: what the scheduler's choices since then
account for. VTC's bound carries the same term as the tokens a full running
batch holds; the head start is the part of it actually running.
"""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["GapTracker"]


class GapTracker:
    """Largest |change of x_i - x_j| over the intervals in which i and j are both backlogged."""

    def __init__(self, users: int) -> None:
        self.a = [0.0] * users
        self.b = [0.0] * users
        self._pre: dict[int, tuple[float, float]] = {}
        """Lines as they were before this batch, for users whose line changed in it."""
        self._partners: list[dict[int, float]] = [{} for _ in range(users)]
        """partners[i][j] = x_i - x_j when i and j last became backlogged together."""
        self._heads: list[dict[int, float]] = [{} for _ in range(users)]
        """heads[i][j] = i's head start when i and j last became backlogged together."""
        self.max = 0.0
        self.pair: tuple[int, int] | None = None
        self.at: float | None = None
        self.beyond = 0.0
        """The largest gap less the head start of the side ahead (module docstring)."""
        self.beyond_pair: tuple[int, int] | None = None
        self.beyond_at: float | None = None
        self.group = [0] * users
        """Each user's group of contention (``slots.contention``): the reference its counter is kept from."""
        self.slots: list[frozenset[str]] = [frozenset()] * users
        """Each user's candidate slot sets: a pair is compared only where they meet (``competes``)."""
        self.lift = [0.0] * users
        """Added to x to make VTC's counters (``returned``)."""
        self.level: dict[int, float] = {}
        """Each group's reference: the lowest counter of its users with work, or the last one while none has."""
        self.standing: list[float | None] = [None] * users
        """Each user's counter less its group's reference when its queue last emptied."""

    def set(self, i: int, a: float, b: float) -> None:
        """User i's line is now ``a + b * t`` (from this batch's instant on)."""
        if i not in self._pre:
            self._pre[i] = (self.a[i], self.b[i])
        self.a[i] = a
        self.b[i] = b

    def settle(
        self, t: float, joined: list[int], left: list[int], backlogged: list[int], heads: list[float] | None = None
    ) -> None:
        """End a batch at ``t``: sample what can peak, then pair up who joined and drop who left.

        Args:
            joined: users that became backlogged in this batch.
            left: users that stopped being backlogged in this batch.
            backlogged: every user backlogged after this batch.
            heads: each user's head start at ``t`` (none: nothing counts as one).
        """
        changed = list(self._pre)
        partners = self._partners
        # Both sides of t for the pairs that existed during the batch (an ending pair's interval includes t).
        if any(partners[i] for i in changed) or any(partners[i] for i in left):
            self._scan(changed + left, self._values(t, pre=True), t)
        if any(partners[i] for i in changed):
            self._scan(changed, self._values(t, pre=False), t)
        self._pre.clear()
        for i in left:
            for j in partners[i]:
                del partners[j][i], self._heads[j][i]
            partners[i].clear()
            self._heads[i].clear()
        if joined:
            x = self._values(t, pre=False)
            own = self._heads
            for i in joined:
                for j in backlogged:
                    if j != i and j not in partners[i] and self.competes(i, j):
                        base = x[i] - x[j]
                        partners[i][j] = base
                        partners[j][i] = -base
                        own[i][j] = heads[i] if heads else 0.0
                        own[j][i] = heads[j] if heads else 0.0

    def competes(self, i: int, j: int) -> bool:
        """Whether i and j could take the same slot (with no slot sets told, everyone competes)."""
        return not (self.slots[i] and self.slots[j]) or not self.slots[i].isdisjoint(self.slots[j])

    def _reference(self, x: list[float], g: int, backlogged: list[int], skip: Collection[int]) -> float | None:
        """Group g's reference (``skip`` left out): the lowest counter of its backlogged users, or with
        none the one of the last to leave the backlog (VTC's; like the core's V, it stays put)."""
        lift, group = self.lift, self.group
        others = [x[j] + lift[j] for j in backlogged if j not in skip and group[j] == g]
        if others:
            self.level[g] = min(others)
        return self.level.get(g)

    def emptied(self, t: float, users: list[int], backlogged: list[int]) -> None:
        """``users`` have nothing queued after ``t`` (their queues emptied, or their requests started as
        they came): remember where each stands from the reference. ``backlogged``: after the batch."""
        x = self._values(t, pre=False)
        lift, group = self.lift, self.group
        for i in users:
            if not any(group[j] == group[i] for j in backlogged):  # the last to leave sets the reference
                self.level[group[i]] = min(x[j] + lift[j] for j in users if group[j] == group[i])
            low = self._reference(x, group[i], backlogged, users)
            self.standing[i] = None if low is None else x[i] + lift[i] - low

    def returned(self, t: float, users: list[int], idle: Collection[int], backlogged: list[int]) -> None:
        """``users`` sent requests at ``t`` with nothing queued before; ``idle``: nothing running either.

        VTC's counters, as issue 18 asks them kept: a user returning from idle is raised to the
        reference (``_reference``), never lowered: idle time banks nothing, and a debt stays. One
        whose requests still ran keeps where it stood from the reference when its queue emptied,
        raised to that if it fell behind: what it was owed it keeps, but it banks nothing while it
        asked for nothing more.
        """
        x = self._values(t, pre=False)
        for i in users:
            low = self._reference(x, self.group[i], backlogged, users)
            if low is None:
                continue
            standing = self.standing[i]
            floor = low if i in idle or standing is None else low + standing
            self.lift[i] = max(self.lift[i], floor - x[i])

    def counter(self, i: int, t: float) -> float:
        """User i's VTC counter at ``t``: its x, lifted (``returned``); the lower, the sooner its turn."""
        return self.a[i] + self.b[i] * t + self.lift[i]

    def finish(self, t: float) -> None:
        """Sample every pair at the end of the run."""
        self._pre.clear()
        self._scan(list(range(len(self.a))), self._values(t, pre=False), t)

    def _values(self, t: float, pre: bool) -> list[float]:
        a, b = self.a, self.b
        if pre and self._pre:
            a, b = a.copy(), b.copy()
            for i, (ai, bi) in self._pre.items():
                a[i] = ai
                b[i] = bi
        return [ai + bi * t for ai, bi in zip(a, b, strict=False)]

    def _scan(self, users: list[int], x: list[float], t: float) -> None:
        partners, heads = self._partners, self._heads
        best, beyond = self.max, self.beyond
        for i in users:
            xi = x[i]
            for j, base in partners[i].items():
                gap = xi - x[j] - base
                ahead = gap - heads[i][j] if gap >= 0 else -gap - heads[j][i]
                if gap < 0:
                    gap = -gap
                if gap > best:
                    best = gap
                    self.pair = (i, j) if i < j else (j, i)
                    self.at = t
                if ahead > beyond:
                    beyond = ahead
                    self.beyond_pair = (i, j) if i < j else (j, i)
                    self.beyond_at = t
        self.max, self.beyond = best, beyond
