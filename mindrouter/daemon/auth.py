"""API keys to users, with a cache so a request costs one dict lookup.

Keys are hashed (SHA-256) before they are looked up or stored; the plaintext
never leaves this function and is never logged. Any admin change to users,
groups or keys clears the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import RequestError
from ..names import hash_key

__all__ = ["Auth", "Caller"]


@dataclass(frozen=True, slots=True)
class Caller:
    user_id: int
    name: str
    group: str
    weight: float


class Auth:
    def __init__(self, store: Any) -> None:
        self.store = store
        self._cache: dict[str, Caller | None] = {}

    def clear(self) -> None:
        self._cache.clear()

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
            user = self.store.user_for_key(key)
            caller = None if user is None else Caller(user.id, user.name, user.group, user.weight)
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
        return caller
