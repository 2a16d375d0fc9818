"""API keys in the store: made once and shown once, kept as a hash, found by it."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..names import KEY_PREFIX, hash_key, new_key
from .errors import NotFound
from .people import USER_SELECT, user_of_row
from .rows import ApiKeyInfo, User

__all__ = ["ApiKeys"]

_ROWID_MAX = 2**63 - 1
"""The largest id SQLite can hold: a larger one names no key (and would not reach SQLite as a number)."""


class ApiKeys:
    """The key half of ``Store``; it shares the store's connection and clock."""

    _db: sqlite3.Connection
    _clock: Callable[[], float]

    if TYPE_CHECKING:

        def _user_id(self, name: str) -> int: ...

    def create_key(self, user: str, label: str = "") -> str:
        """Make a new key for ``user`` and return it: the only time it exists outside the client.

        ``label`` tells it from the user's other keys ("laptop"); the caller checks it (``names.key_label``).
        """
        user_id = self._user_id(user)
        key = new_key()
        self._db.execute(
            "INSERT INTO api_keys (user_id, hash, prefix, created, label) VALUES (?, ?, ?, ?, ?)",
            (user_id, hash_key(key), key[: len(KEY_PREFIX) + 6], self._clock(), label),
        )
        return key

    def user_for_key(self, key: str) -> User | None:
        """The user a key belongs to, or None; the lookup is by hash, so timing says nothing about the key."""
        if not isinstance(key, str) or not key.startswith(KEY_PREFIX) or len(key) > 256:
            return None
        found = self.key_owner(hash_key(key))
        return None if found is None else found[1]

    def key_owner(self, digest: str) -> tuple[int, User] | None:
        """(key id, user) for a key's hash (``names.hash_key``), or None."""
        row = self._db.execute(
            USER_SELECT.replace("SELECT ", "SELECT k.id, ", 1)
            + " JOIN api_keys k ON k.user_id = u.id WHERE k.hash = ?",
            (digest,),
        ).fetchone()
        return None if row is None else (row[0], user_of_row(row[1:]))

    def touch_keys(self, used: Mapping[int, float]) -> None:
        """Record when keys were last used (key id -> wall-clock time)."""
        self._db.executemany("UPDATE api_keys SET last_used = ? WHERE id = ?", [(at, kid) for kid, at in used.items()])

    def list_keys(self, user: str | None = None) -> list[ApiKeyInfo]:
        sql = (
            "SELECT k.id, u.name, k.prefix, k.created, k.last_used, k.label"
            " FROM api_keys k JOIN users u ON u.id = k.user_id"
        )
        if user is None:
            return [ApiKeyInfo(*r) for r in self._db.execute(sql + " ORDER BY k.id")]
        user_id = self._user_id(user)
        return [ApiKeyInfo(*r) for r in self._db.execute(sql + " WHERE k.user_id = ? ORDER BY k.id", (user_id,))]

    def key_counts(self) -> dict[str, int]:
        """How many keys each user who has any has, by name (`mr user list`), counted without reading them."""
        sql = "SELECT u.name, count(*) FROM api_keys k JOIN users u ON u.id = k.user_id GROUP BY u.name"
        return dict(self._db.execute(sql).fetchall())

    def revoke_key(self, user: str, key_id: int) -> None:
        """Delete one key of ``user``; the user and its other keys stay."""
        user_id = self._user_id(user)
        if (
            not 0 < key_id <= _ROWID_MAX
            or not self._db.execute("DELETE FROM api_keys WHERE id = ? AND user_id = ?", (key_id, user_id)).rowcount
        ):
            raise NotFound(f"user {user!r} has no key with id {key_id}; see its keys with `mr user keys {user}`")

    def revoke_keys(self, user: str) -> int:
        """Delete every key of ``user``; returns how many there were."""
        return self._db.execute("DELETE FROM api_keys WHERE user_id = ?", (self._user_id(user),)).rowcount
