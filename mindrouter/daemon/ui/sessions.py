"""Web UI sessions: random tokens kept in the store, one HttpOnly SameSite=Strict cookie, a CSRF token each.

The store keeps only the SHA-256 of each token (with its user, CSRF token and
expiry), so a restart, or a failover to another router on the same PostgreSQL,
signs nobody out, and the database holds no cookie that could be replayed.
Every page reads its session's row (one lookup by primary key), so logging out
or a cap ending a session holds on every router at once. A session remembers
the hash of the key it was opened with and is checked against the store on
every page, so revoking that key (or removing the user) ends it at once too.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from ...names import hash_key
from ...store import Store
from ...store.sessions import SessionRow

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
    """The outcome of the last form, ("ok" or "error", sentence), shown once (on this router only)."""
    new_key: tuple[str, str] | None = None
    """(user, key) just created: shown on the next page of that user only, then forgotten (never in a URL
    nor in the store)."""


class Sessions:
    """Open sessions by token, in ``store``: at most ``per_user`` of one user (or of the admin key), the oldest
    of theirs going first, so nobody's logins end anyone else's session; and at most ``limit`` in all (the
    oldest going first), so logins cannot fill the disk: ``limit / per_user`` users must log in to reach it.

    This router's ``Session`` objects (at most ``limit``) carry what lasts one page only (``flash``,
    ``new_key``); the store decides whether a session exists."""

    def __init__(
        self,
        store: Store,
        ttl: float = 12 * 3600.0,
        limit: int = 10_000,
        clock: Callable[[], float] = time.time,
        per_user: int = 5,
    ) -> None:
        self.store = store
        self.ttl = ttl
        self.limit = limit
        self.per_user = per_user
        self.clock = clock
        self._here: dict[str, Session] = {}
        """Sessions this router has shown, by token hash, oldest first."""

    def open(
        self, response: web.StreamResponse, request: web.Request, user: str | None, admin: bool, key_hash: str
    ) -> Session:
        token = secrets.token_urlsafe(32)
        now = self.clock()
        session = Session(user, admin, key_hash, now + self.ttl)
        row = SessionRow(user, admin, key_hash, session.csrf, session.expires)
        self.store.open_session(hash_key(token), row, now=now, per_user=self.per_user, limit=self.limit)
        self._remember(hash_key(token), session)
        set_cookie(response, request, COOKIE, token, self.ttl)
        return session

    def get(self, request: web.Request) -> Session | None:
        token = request.cookies.get(COOKIE, "")
        if not token or len(token) > 256:
            return None
        digest = hash_key(token)
        row = self.store.find_session(digest)
        if row is None or row.expires < self.clock():
            self._here.pop(digest, None)
            if row is not None:
                self.store.close_session(digest)
            return None
        session = self._here.get(digest)
        if session is None:
            session = Session(row.user, row.admin, row.key_hash, row.expires, row.csrf)
            self._remember(digest, session)
        return session

    def close(self, request: web.Request, response: web.StreamResponse) -> None:
        digest = hash_key(request.cookies.get(COOKIE, ""))
        self._here.pop(digest, None)
        self.store.close_session(digest)
        response.del_cookie(COOKIE, path="/ui/")

    def _remember(self, digest: str, session: Session) -> None:
        while len(self._here) >= self.limit:
            del self._here[next(iter(self._here))]
        self._here[digest] = session


def set_cookie(response: web.StreamResponse, request: web.Request, name: str, value: str, max_age: float) -> None:
    """A cookie only our pages send back: HttpOnly, SameSite=Strict, under /ui/, Secure behind HTTPS."""
    response.set_cookie(
        name, value, max_age=int(max_age), path="/ui/", httponly=True, samesite="Strict", secure=request.secure
    )


def same(given: str | None, expected: str) -> bool:
    """Whether a submitted token matches, in constant time."""
    return bool(given) and hmac.compare_digest(str(given).encode("utf-8", "surrogatepass"), expected.encode())
