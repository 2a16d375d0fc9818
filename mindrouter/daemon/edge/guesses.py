"""Wrong secrets per client address: after a few, each address waits before its next try, longer each time.

Whatever checks a secret the client chose (a web UI login, the ``admin_key`` on the TCP port, the
metrics key) asks :meth:`Guesses.wait` first and answers 429 while it is above 0, then reports a
wrong one with :meth:`Guesses.wrong`. The first ``free`` wrong secrets of an address cost nothing
(a typo, a stale key in a script); each one after makes the address wait ``first`` seconds, doubling
up to ``longest``. An address whose last wrong secret is ``forget`` seconds old starts again.

A right secret resets nothing: an address with one valid key (a student's) could otherwise
interleave its own logins to keep guessing the admin's. An IPv6 client is counted by its /64, the
block one machine is given, so it cannot step through addresses. A proxy in front of the daemon
makes its clients one address: their wrong keys count together.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...errors import RequestError

__all__ = ["Guesses", "client_of"]


@dataclass(slots=True)
class _Tally:
    wrong: int
    last: float
    until: float


def client_of(remote: str | None) -> str:
    """Whose guesses a request's ``remote`` address counts as: itself, or an IPv6 address's /64."""
    if not remote:
        return ""
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return remote
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class Guesses:
    """Wrong secrets by client address, and how long each must wait before its next try.

    Args:
        free: wrong secrets an address may send before it waits. Defaults to 10.
        first: seconds of the first wait. Defaults to 1.
        longest: the longest wait. Defaults to 300.
        forget: seconds after its last wrong secret that an address starts again. Defaults to 900.
        limit: addresses tracked at most; beyond it the longest quiet is forgotten. Defaults to 100,000.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        *,
        free: int = 10,
        first: float = 1.0,
        longest: float = 300.0,
        forget: float = 900.0,
        limit: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free = free
        self.first = first
        self.longest = longest
        self.forget = forget
        self.limit = limit
        self.clock = clock
        self._tallies: dict[str, _Tally] = {}
        """By client, oldest wrong secret first (a wrong one moves its client to the end)."""

    def wait(self, remote: str | None) -> float:
        """Seconds the client at ``remote`` must wait before its next try; 0 when it may try now."""
        tally = self._tallies.get(client_of(remote))
        return 0.0 if tally is None else max(0.0, tally.until - self.clock())

    def wrong(self, remote: str | None) -> None:
        """The client at ``remote`` sent a wrong secret."""
        client, now = client_of(remote), self.clock()
        tally = self._tallies.pop(client, None)
        if tally is None or now - tally.last > self.forget:
            tally = _Tally(0, now, now)
        tally.wrong += 1
        tally.last = now
        over = tally.wrong - self.free
        if over > 0:
            tally.until = now + min(self.longest, self.first * math.pow(2, min(over - 1, 64)))
        self._tallies[client] = tally
        if len(self._tallies) > self.limit:
            del self._tallies[next(iter(self._tallies))]

    def refusal(self, remote: str | None) -> RequestError | None:
        """The 429 for a client that must wait, or None when it may try now."""
        wait = math.ceil(self.wait(remote))
        if wait <= 0:
            return None
        return RequestError(
            f"too many wrong keys from your address; wait {wait} s before trying again",
            status=429,
            type="rate_limit_error",
            code="too_many_wrong_keys",
            retry_after=wait,
        )
