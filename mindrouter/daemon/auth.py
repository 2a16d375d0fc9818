"""API keys to users, with a cache so a request costs one dict lookup.

Keys are hashed (``names.hash_key``) once, before they are looked up or
stored; the plaintext never leaves this function and is never logged. The
lookup is by hash, so its timing says nothing about how close a guess was.
Any admin change to users, groups or keys clears the cache. When each key was
last used is kept here and written to the store at most once a minute.

A proxy's key (a front end such as Open WebUI, made one with ``mr user
set-proxy``) may name the person a request is for: :meth:`Auth.on_behalf`
turns the proxy's caller into that person's, created on first sight in the
proxy's people group, so each person behind the front end gets a fair share.
The same headers from any other key are ignored.
"""

from __future__ import annotations

import hmac
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..errors import RequestError
from ..names import hash_key
from ..store import StoreError

__all__ = ["PERSON_HEADERS", "Auth", "Caller", "bearer_is"]

log = logging.getLogger(__name__)

PERSON_HEADERS = ("X-OpenWebUI-User-Email", "X-OpenWebUI-User-Id", "X-OpenWebUI-User-Name", "X-Forwarded-User")
"""Headers that name the person behind a proxy, first found wins (Open WebUI sends its own with
``ENABLE_FORWARD_USER_INFO_HEADERS=true``); then OpenAI's ``user`` body field."""
_NOT_IN_NAMES = re.compile(r"[^A-Za-z0-9._@+-]+")


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
    weight_override: float | None
    group_weight: float
    key_id: int = 0
    forwards_to: str | None = None
    """For a proxy's key: the group the people it names go in."""

    @property
    def weight(self) -> float:
        """The scheduler weight: the override if set, else the group's weight."""
        return self.group_weight if self.weight_override is None else self.weight_override


def _person_name(raw: Any) -> str | None:
    """A user name (``names.check_name``'s pattern) from what a proxy sent, or None if nothing is left."""
    if not isinstance(raw, str):
        return None
    name = _NOT_IN_NAMES.sub("-", raw.strip()).lstrip("._@+-")[:64]
    return name or None


class Auth:
    #: Seconds between writes of the keys' last-used times.
    TOUCH_EVERY = 60.0

    def __init__(self, store: Any, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self._cache: dict[str, Caller | None] = {}
        self._people: dict[str, Caller] = {}
        self._used: dict[int, float] = {}
        self._touched = clock()

    def clear(self) -> None:
        self._cache.clear()
        self._people.clear()

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
            user = None if found is None else found[1]
            caller = (
                None
                if user is None
                else Caller(
                    user.id, user.name, user.group, user.weight_override, user.group_weight, found[0], user.forwards_to
                )
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

    def on_behalf(self, caller: Caller, headers: Mapping[str, str], body_user: Any = None) -> Caller:
        """The person a proxy's request names (see :data:`PERSON_HEADERS`), or ``caller`` itself.

        Only a proxy's key may name someone; a named proxy, or a name that cannot be a user
        name, leaves the request charged to the proxy.
        """
        if caller.forwards_to is None:
            return caller
        raw = next((headers[h] for h in PERSON_HEADERS if headers.get(h, "").strip()), body_user)
        name = _person_name(raw)
        if name is None or name.lower() == caller.name.lower():
            return caller
        person = self._people.get(name.lower())
        if person is None:
            try:
                user = self.store.person(name, caller.forwards_to)
            except StoreError as exc:  # a name or group the store refuses: charge the proxy, not fail the request
                log.warning("proxy=%s named %r, which cannot be a user: %s", caller.name, name, exc)
                return caller
            if user.proxy:
                return caller
            person = Caller(user.id, user.name, user.group, user.weight_override, user.group_weight)
            if len(self._people) > 100_000:
                self._people.clear()
            self._people[name.lower()] = person
        return replace(person, key_id=caller.key_id)
