"""Bytes of whole answers held at once, across every backend: a bound on what backends can make the daemon hold.

``max_answer_bytes`` bounds one whole (non-streamed) answer; nothing bounded their sum, so a few
backends answering 200 MB each grew the daemon by gigabytes (issue 28). Each whole answer takes a
:class:`Holding` from the one :class:`Budget` as it is read, and gives it back once it is written to
its client (``Upstream.close``). When a read would take the bytes held past ``limit``, the answer
still being read that holds the most is cut (:class:`NoRoom`), so a few huge answers give way
before any small one: an ordinary chat answer is never the one cut while a bigger one is held.
A cut answer that another request was reading stops at once: its connection is closed.

Invariant: ``held`` is the sum of the holdings' ``held`` and, after every ``take``, at most ``limit``.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Budget", "Holding", "NoRoom"]


class NoRoom(Exception):
    """The answer was cut: whole answers held at once would have passed the budget."""


class Holding:
    """One whole answer's bytes in the budget, from its first read until its client has it."""

    __slots__ = ("_stop", "budget", "cut", "held", "reading")

    def __init__(self, budget: Budget, stop: Callable[[], None]) -> None:
        self.budget = budget
        self.held = 0
        self.reading = True
        """Still growing: only an answer being read can be cut (one being written is nearly gone)."""
        self.cut = False
        self._stop = stop

    def take(self, size: int) -> None:
        """Hold ``size`` more bytes.

        Raises:
            NoRoom: this answer was cut, now or by another's read.
        """
        if self.cut:
            raise NoRoom
        self.held += size
        self.budget._grow(self, size)

    def read(self) -> None:
        """The answer is whole: from now on it only waits to be written.

        Raises:
            NoRoom: it was cut while its last read was under way (what that read returned, if anything,
                is the answer's beginning only: its connection was closed).
        """
        if self.cut:
            raise NoRoom
        self.reading = False

    def give_back(self) -> None:
        """The client has the answer (or never will): its bytes are free."""
        self.budget._release(self)


class Budget:
    """The bytes all whole answers may hold at once.

    Args:
        limit: the most bytes held at once (``[backends] max_held_answer_bytes``).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0
        """The most bytes held at once since start (tests, ``docs/reliability.md``)."""
        self.cuts = 0
        self._holdings: set[Holding] = set()

    def holding(self, stop: Callable[[], None]) -> Holding:
        """A new answer's holding; ``stop`` closes its connection if another's read cuts it."""
        holding = Holding(self, stop)
        self._holdings.add(holding)
        return holding

    def _grow(self, holding: Holding, size: int) -> None:
        self.held += size
        while self.held > self.limit:
            victim = max((h for h in self._holdings if h.reading), key=lambda h: h.held, default=holding)
            self._cut(victim)
            if victim is holding:
                raise NoRoom
            victim._stop()
        self.peak = max(self.peak, self.held)

    def _cut(self, holding: Holding) -> None:
        holding.cut = True
        self.cuts += 1
        self._release(holding)

    def _release(self, holding: Holding) -> None:
        if holding in self._holdings:
            self._holdings.discard(holding)
            self.held -= holding.held
            holding.held = 0
