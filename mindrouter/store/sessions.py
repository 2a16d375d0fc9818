"""Web UI sessions in the store, so a restart or a failover to another router signs nobody out.

Only the SHA-256 of a session's token is kept (as for API keys): the database
never holds a cookie that could be replayed. The caps and the expiry are the
UI's rules (``daemon/ui/sessions.py``); here they are one transaction each.
"""

from __future__ import annotations

import sqlite3
from typing import NamedTuple

from .schema import transaction

__all__ = ["SessionRow", "UiSessions"]


class SessionRow(NamedTuple):
    user: str | None
    """The person's user name, or None for the admin key's session."""
    admin: bool
    key_hash: str
    csrf: str
    expires: float


_OLDEST = "DELETE FROM ui_sessions WHERE id IN (SELECT s.id FROM ui_sessions s {where} ORDER BY s.id LIMIT ?)"
"""The ``LIMIT`` oldest sessions (of one owner, or of all): ids only grow."""


class UiSessions:
    """The session half of ``Store``; it shares the store's connection."""

    _db: sqlite3.Connection

    def open_session(self, digest: str, row: SessionRow, *, now: float, per_user: int, limit: int) -> None:
        """Keep a new session under its token's hash: expired ones go, then the owner's oldest beyond
        ``per_user - 1``, then the oldest of all beyond ``limit - 1``."""
        owner = row.user or ""
        with transaction(self._db) as db:
            db.execute("DELETE FROM ui_sessions WHERE expires < ?", (now,))
            mine = db.execute("SELECT count(*) FROM ui_sessions WHERE owner = ?", (owner,)).fetchone()[0]
            if mine >= per_user:
                db.execute(_OLDEST.format(where="WHERE s.owner = ?"), (owner, mine - per_user + 1))
            every = db.execute("SELECT count(*) FROM ui_sessions").fetchone()[0]
            if every >= limit:
                db.execute(_OLDEST.format(where=""), (every - limit + 1,))
            db.execute(
                "INSERT INTO ui_sessions (hash, owner, admin, key_hash, csrf, expires) VALUES (?, ?, ?, ?, ?, ?)",
                (digest, owner, int(row.admin), row.key_hash, row.csrf, row.expires),
            )

    def find_session(self, digest: str) -> SessionRow | None:
        found = self._db.execute(
            "SELECT owner, admin, key_hash, csrf, expires FROM ui_sessions WHERE hash = ?", (digest,)
        ).fetchone()
        if found is None:
            return None
        owner, admin, key_hash, csrf, expires = found
        return SessionRow(owner or None, bool(admin), key_hash, csrf, expires)

    def close_session(self, digest: str) -> None:
        self._db.execute("DELETE FROM ui_sessions WHERE hash = ?", (digest,))
