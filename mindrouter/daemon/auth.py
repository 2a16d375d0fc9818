"""API keys to users, with a cache so a request costs one dict lookup.

Keys are hashed (``names.hash_key``) once, before they are looked up or
stored; the plaintext never leaves this function and is never logged. The
lookup is by hash, so its timing says nothing about how close a guess was.
Any admin change to users, groups or keys clears the cache. When each key was
last used is kept here and written to the store at most once a minute.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import RequestError
from ..names import hash_key

__all__ = ["Auth", "Caller", "bearer_is"]


def bearer_is(request: Any, secret: str) -> bool:
    """Whether the request's ``Authorization: Bearer`` key is ``secret``, compared in constant time."""
    header = request.headers.get("Authorization", "")
    if header[:7].lower() != "bearer ":
        return False
    return hmac.compare_digest(header[7:].strip().encode("utf-8", "surrogatepass"), secret.encode("utf-8"))


@dataclass(frozen=True, slots=True)
class Caller:
    user_id: int
    name: str
    group: str
    weight: float
    key_id: int = 0


class Auth:
    #: Seconds between writes of the keys' last-used times.
    TOUCH_EVERY = 60.0

    def __init__(self, store: Any, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self._cache: dict[str, Caller | None] = {}
        self._used: dict[int, float] = {}
        self._touched = clock()

    def clear(self) -> None:
        self._cache.clear()

    def flush(self) -> None:
        """Write the keys' last-used times to the store."""
        if self._used:
            self.store.touch_keys(self._used)
            self._used.clear()
        self._touched = self.clock()

    def caller(self, authorization: str | None) -> Caller:
        """The user behind an ``Authorization: Bearer`` header.

        Raises:
            RequestError: 401 when the header is missing or the key is unknown.
        """
        if not authorization or not authorization[:7].lower() == "bearer ":
            raise RequestError(
                "missing API key; send `Authorization: Bearer <key>` (an admin creates one with `mr user key NAME`)",
                status=401,
                type="authentication_error",
                code="missing_api_key",
            )
        key = authorization[7:].strip()
        digest = hash_key(key)
        try:
            caller = self._cache[digest]
        except KeyError:
            found = self.store.key_owner(digest)
            caller = (
                None if found is None else Caller(found[1].id, found[1].name, found[1].group, found[1].weight, found[0])
            )
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[digest] = caller
        if caller is None:
            raise RequestError(
                "invalid API key; ask an admin for a new one (`mr user key NAME`)",
                status=401,
                type="authentication_error",
                code="invalid_api_key",
            )
        now = self.clock()
        self._used[caller.key_id] = now
        if now - self._touched > self.TOUCH_EVERY:
            self.flush()
        return caller
