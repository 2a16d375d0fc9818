"""One backend's circuit breaker: it counts only the backend's own faults, so no client can open it.

Invariants:

- A failed probe, and a request whose connection failed (refused or reset,
  a stream cut off: ``Fault.DOWN``), always count.
- A 5xx, an error event or a timeout (``Fault.ERROR``) counts only once more
  than one user's requests met one within ``circuit_window``, or a probe
  failed in it: one client whose body makes the backend fail or hang (a lone
  UTF-16 surrogate on /api/embed answered 500, the openai SDK's two retries)
  meets it alone, and that is the client's error, not the backend's.
- "Not supported" (``Fault.UNSUPPORTED``) and answers the daemon cut
  (``Fault.CUT``) never count: the backend is up, and routing learns the
  first (``Registry.lacks``).
- ``circuit_failures`` counted faults within ``circuit_window`` open the
  circuit for ``circuit_cooldown`` seconds; then the first passing probe
  closes it. A request the backend served clears the counts; a passing probe
  does not, so a backend that flaps between probes is held out.

Pure: time is passed in, nothing here does I/O or logs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

from ...backends import Fault
from ...config import BackendSettings

__all__ = ["Breaker"]


class Breaker:
    """The counts and state of one backend's circuit."""

    def __init__(self, settings: BackendSettings) -> None:
        self.settings = settings
        self.down_at: deque[tuple[float, bool]] = deque()
        """(when, from a probe) of every failed probe and unanswered request in the window."""
        self.errors_at: deque[tuple[float, Hashable]] = deque()
        """(when, user) of every 5xx or error event in the window."""
        self.open = False
        self.open_until = 0.0

    def _trim(self, now: float) -> None:
        cutoff = now - self.settings.circuit_window
        for queue in (self.down_at, self.errors_at):
            while queue and queue[0][0] < cutoff:
                queue.popleft()

    def _errors_count(self) -> bool:
        """5xx answers are the backend's once two users met them, or a probe failed as well."""
        if not self.errors_at:
            return False
        first = self.errors_at[0][1]
        return any(user != first for _, user in self.errors_at) or any(probe for _, probe in self.down_at)

    def failures(self, now: float) -> int:
        """Faults counted toward the circuit now."""
        self._trim(now)
        return len(self.down_at) + (len(self.errors_at) if self._errors_count() else 0)

    def record(self, fault: Fault, user: Hashable, now: float) -> bool:
        """A request on this backend failed with ``fault``; True when that opened the circuit."""
        if fault is Fault.DOWN:
            self.down_at.append((now, False))
        elif fault is Fault.ERROR:
            self.errors_at.append((now, user))
        else:
            return False
        return self._maybe_open(now)

    def probe_failed(self, now: float) -> bool:
        """A health probe failed; True when that opened the circuit."""
        self.down_at.append((now, True))
        return self._maybe_open(now)

    def probe_passed(self, now: float) -> bool:
        """A health probe passed; True when that closed the circuit (its cool-down is over)."""
        if self.open and now >= self.open_until:
            self.open = False
            self.down_at.clear()
            self.errors_at.clear()
            return True
        return False

    def served(self) -> None:
        """A request was served: the backend works, so the counts start again (an open circuit stays open)."""
        if not self.open:
            self.down_at.clear()
            self.errors_at.clear()

    def _maybe_open(self, now: float) -> bool:
        if self.open or self.failures(now) < self.settings.circuit_failures:
            return False
        self.open = True
        self.open_until = now + self.settings.circuit_cooldown
        return True

    def next_probe(self, now: float, backoff: float) -> float:
        """Seconds to the next probe of a backend that is down, given the current ``backoff``.

        Never before the cool-down ends (a probe then could not close the circuit), never
        later than ``poll_interval``.
        """
        wait = backoff
        if self.open:
            wait = max(wait, self.open_until - now)
        return min(max(wait, 0.0), self.settings.poll_interval)
