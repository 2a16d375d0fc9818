"""API keys to users, with a cache so a request costs one dict lookup.

Keys are hashed (``names.hash_key``) once, before they are looked up or
stored; the plaintext never leaves this function and is never logged. The
lookup is by hash, so its timing says nothing about how close a guess was.
Any admin change to users, groups or keys clears the cache. When each key was
last used is kept here and written to the store at most once a minute.

A proxy's key (a front end such as Open WebUI, made one with ``mr user
set-proxy``) may name the person a request is for: :meth:`Auth.on_behalf`
turns the proxy's caller into that person's, a person of the proxy's own
(``people.py``), so each person behind the front end gets a fair share. The
proxy's ``person_from`` says where the name is: the forwarding headers, or
OpenAI's ``user`` body field; the other is ignored, and so are both from any
other key.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ...errors import RequestError
from ...names import hash_key, person_identity
from ...store import Store
from .guesses import Guesses
from .people import People

__all__ = ["PERSON_HEADERS", "Auth", "Caller", "bearer_is"]

log = logging.getLogger(__name__)

PERSON_HEADERS = ("X-OpenWebUI-User-Email", "X-OpenWebUI-User-Id", "X-OpenWebUI-User-Name", "X-Forwarded-User")
"""Headers that name the person behind a proxy, first found wins (Open WebUI sends its own with
``ENABLE_FORWARD_USER_INFO_HEADERS=true``); a proxy with ``person_from = "user-field"`` reads
OpenAI's ``user`` body field instead."""


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
    person_from: str = "header"
    """For a proxy's key: where its requests name their person (``names.PERSON_FROM``)."""

    @property
    def weight(self) -> float:
        """The scheduler weight: the override if set, else the group's weight."""
        return self.group_weight if self.weight_override is None else self.weight_override


def _caller(user: Any, key_id: int = 0) -> Caller:
    return Caller(
        user.id,
        user.name,
        user.group,
        user.weight_override,
        user.group_weight,
        key_id,
        user.forwards_to,
        user.person_from,
    )


class Auth:
    #: Seconds between writes of the keys' last-used times.
    TOUCH_EVERY = 60.0

    def __init__(self, store: Store, clock: Callable[[], float] = time.time, *, new_people_per_hour: int = 100) -> None:
        self.store = store
        self.clock = clock
        self.people = People(store, new_people_per_hour, clock)
        self.guesses = Guesses()
        """Wrong secrets (``admin_key``, metrics key, web UI logins) by client address."""
        self._cache: dict[str, Caller | None] = {}
        self._people: dict[tuple[int, str], Caller] = {}
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
        if authorization and authorization[:7].lower() != "bearer ":  # the key alone, or another scheme
            raise RequestError(
                "the Authorization header does not start with `Bearer `; put `Bearer ` before the key: "
                "`Authorization: Bearer <key>`",
                status=401,
                type="authentication_error",
                code="missing_api_key",
            )
        if not authorization:
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
            caller = None if found is None else _caller(found[1], found[0])
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
        """The person a proxy's request names, or ``caller`` itself.

        Only a proxy's key may name someone, and only a person of its own (``people.py``): a
        name that is anybody else's, or cannot be an identity, is charged to the proxy.

        Raises:
            RequestError: 429 when the name is new and the proxy has added its hour's people.
        """
        if caller.forwards_to is None:
            return caller
        if caller.person_from == "user-field":
            raw = body_user
        else:
            raw = next((headers[h] for h in PERSON_HEADERS if headers.get(h, "").strip()), None)
        if raw is None:
            return caller
        identity = person_identity(raw)
        if identity is None:
            self.people.refused(caller, raw, "which cannot be an identity")
            return caller
        person = self._people.get((caller.user_id, identity))
        if person is None:
            user = self.people.find(caller, identity)
            person = replace(caller, key_id=0) if user is None else _caller(user)
            if len(self._people) > 100_000:
                self._people.clear()
            self._people[(caller.user_id, identity)] = person
        return replace(person, key_id=caller.key_id)
