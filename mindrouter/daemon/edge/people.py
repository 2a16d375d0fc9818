"""Who a proxy's request is for: a person of the proxy's own, or the proxy itself.

A proxy names the person behind a front end by the identity it forwards (``names.person_identity``).
It reaches only people created through it (``store.person_of``), so it can never act as, or
charge, a regular user, an admin, another proxy or another proxy's people. An identity that is
already the name of a user that is not its own is charged to the proxy and logged once; so is one that cannot be
an identity. New people are capped per proxy per hour (``[server] new_people_per_hour``), counted
from the store, so a restart does not reset the count.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Protocol

from ...errors import RequestError
from ...store import NotFound, Store, StoreError, User
from ..edge.logsafe import safe

__all__ = ["HOUR", "People", "Proxy"]

log = logging.getLogger(__name__)

HOUR = 3600.0


class Proxy(Protocol):
    """What a proxy's caller tells about it."""

    @property
    def user_id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def forwards_to(self) -> str | None: ...


class People:
    """Finds or creates a proxy's people; ``find`` returns None where the proxy itself is charged.

    Args:
        store: the daemon's ``Store``.
        new_per_hour: the most people one proxy may create in an hour; 0 lets it create none.
        clock: wall-clock seconds, the store's ``created`` times. Defaults to ``time.time``.
    """

    def __init__(self, store: Store, new_per_hour: int, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.new_per_hour = new_per_hour
        self.clock = clock
        self._warned: set[tuple[int, str]] = set()

    def refused(self, proxy: Proxy, raw: object, why: str) -> None:
        """Log, once per proxy and name, that a name it sent is charged to it."""
        key = (proxy.user_id, str(raw)[:300])
        if key in self._warned:
            return
        if len(self._warned) > 10_000:
            self._warned.clear()
        self._warned.add(key)
        log.warning("proxy=%s named %s, %s; its requests are charged to the proxy", proxy.name, safe(repr(raw)), why)

    def find(self, proxy: Proxy, identity: str) -> User | None:
        """The proxy's person for ``identity``, created on first sight; None: charge the proxy.

        Raises:
            RequestError: 429 when the proxy has created ``new_per_hour`` people in the last hour.
        """
        person = self.store.person_of(proxy.user_id, identity)
        if person is not None:
            if person.proxy:
                self.refused(proxy, identity, "a person an admin has since made a proxy")
                return None
            return person
        try:
            other = self.store.get_user(identity)
        except NotFound:
            other = None
        if other is not None and other.owner_id != proxy.user_id:
            self.refused(proxy, identity, f"which is user {other.name!r}, not its own person")
            return None
        self._check_cap(proxy)
        group = proxy.forwards_to
        assert group is not None, "only a proxy (a user whose people go to a group) names people"
        try:
            return self.store.add_person(proxy.user_id, group, identity)
        except StoreError as exc:  # its people group is gone, say: charge the proxy rather than fail the request
            self.refused(proxy, identity, f"whom the store refuses ({exc})")
            return None

    def _check_cap(self, proxy: Proxy) -> None:
        now = self.clock()
        count, first = self.store.people_since(proxy.user_id, now - HOUR)
        if count < self.new_per_hour:
            return
        wait = max(1.0, (first if first is not None else now) + HOUR - now)
        raise RequestError(
            f"proxy {proxy.name!r} has added {count} new people in the last hour, the most "
            f"[server] new_people_per_hour allows; try again in {math.ceil(wait / 60)} minutes, "
            "or ask an admin to raise the setting",
            status=429,
            type="rate_limit_error",
            code="new_people_limit",
            retry_after=wait,
        )
