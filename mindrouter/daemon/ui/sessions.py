"""Web UI sessions: a server-side table of random tokens, one HttpOnly SameSite=Strict cookie, a CSRF token each.

A session remembers the hash of the key it was opened with and is checked
against the store on every page, so revoking that key (or removing the user)
ends it at once. Sessions live in memory: a restart logs everyone out, which
costs one login and keeps no secret on disk.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

__all__ = ["COOKIE", "LOGIN_COOKIE", "Session", "Sessions"]

COOKIE = "mr_session"
LOGIN_COOKIE = "mr_login"
"""The login form's CSRF token (double submit), before there is a session."""


@dataclass(slots=True)
class Session:
    user: str | None
    """The person's user name, or None for the admin key's session."""
    admin: bool
    key_hash: str
    expires: float
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    flash: tuple[str, str] | None = None
    """The outcome of the last form, ("ok" or "error", sentence), shown once."""
    new_key: tuple[str, str] | None = None
    """(user, key) just created: shown on the next page of that user only, then forgotten (never in a URL)."""


class Sessions:
    """Open sessions by token: at most ``per_user`` of one user (or of the admin key), the oldest of theirs
    going first, so nobody's logins end anyone else's session; and at most ``limit`` in all (the oldest
    going first), so logins cannot exhaust memory: ``limit / per_user`` users must log in to reach it."""

    def __init__(
        self,
        ttl: float = 12 * 3600.0,
        limit: int = 10_000,
        clock: Callable[[], float] = time.time,
        per_user: int = 5,
    ) -> None:
        self.ttl = ttl
        self.limit = limit
        self.per_user = per_user
        self.clock = clock
        self._open: dict[str, Session] = {}
        self._owned: dict[str | None, list[str]] = {}
        """Each user's open tokens, oldest first (None: the admin key's)."""

    def open(
        self, response: web.StreamResponse, request: web.Request, user: str | None, admin: bool, key_hash: str
    ) -> Session:
        owned = self._owned.setdefault(user, [])
        while len(owned) >= self.per_user:
            self._drop(owned[0])
        if len(self._open) >= self.limit:
            self._drop(next(iter(self._open)))
        token = secrets.token_urlsafe(32)
        session = Session(user, admin, key_hash, self.clock() + self.ttl)
        self._open[token] = session
        self._owned.setdefault(user, []).append(token)
        set_cookie(response, request, COOKIE, token, self.ttl)
        return session

    def get(self, request: web.Request) -> Session | None:
        token = request.cookies.get(COOKIE, "")
        session = self._open.get(token)
        if session is not None and session.expires < self.clock():
            self._drop(token)
            return None
        return session

    def close(self, request: web.Request, response: web.StreamResponse) -> None:
        self._drop(request.cookies.get(COOKIE, ""))
        response.del_cookie(COOKIE, path="/ui/")

    def _drop(self, token: str) -> None:
        session = self._open.pop(token, None)
        if session is None:
            return
        owned = self._owned[session.user]
        owned.remove(token)
        if not owned:
            del self._owned[session.user]


def set_cookie(response: web.StreamResponse, request: web.Request, name: str, value: str, max_age: float) -> None:
    """A cookie only our pages send back: HttpOnly, SameSite=Strict, under /ui/, Secure behind HTTPS."""
    response.set_cookie(
        name, value, max_age=int(max_age), path="/ui/", httponly=True, samesite="Strict", secure=request.secure
    )


def same(given: str | None, expected: str) -> bool:
    """Whether a submitted token matches, in constant time."""
    return bool(given) and hmac.compare_digest(str(given).encode("utf-8", "surrogatepass"), expected.encode())
