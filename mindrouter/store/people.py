"""Proxies and their people in the store: each person belongs to the proxy it was created through.

A proxy (a front end such as Open WebUI) names the person a request is for. That person is found
by the proxy's id and the exact identity it forwarded (``names.person_identity``), never by user
name, so a proxy reaches only people of its own: no regular user, admin, other proxy or other
proxy's person. The user name is for showing (``names.person_name``) and may differ.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..names import person_name
from .errors import InvalidValue
from .rows import KEEP, QUOTA_FIELDS, Quota, User
from .validate import _person_from

_QUOTAS = ", ".join(f"u.{f}" for f in QUOTA_FIELDS)
USER_SELECT = (
    f"SELECT u.id, u.name, g.name, u.weight_override, g.scheduler_weight, u.created, {_QUOTAS},"
    " u.proxy = 1, pg.name, u.person_from, u.owner_id, o.name, u.identity"
    " FROM users u JOIN groups g ON g.id = u.group_id LEFT JOIN groups pg ON pg.id = u.proxy_group_id"
    " LEFT JOIN users o ON o.id = u.owner_id"
)
"""Every column of a ``User``, in its order; append a WHERE clause."""


def user_of_row(row: tuple[Any, ...]) -> User:
    """The ``User`` of a row read with :data:`USER_SELECT`."""
    return User(*row[:6], Quota(*row[6:9]), *row[9:])  # type: ignore[call-arg]


class People:
    """The proxy half of ``Store``; it shares the store's connection and clock."""

    _db: sqlite3.Connection
    _clock: Callable[[], float]

    if TYPE_CHECKING:

        def _group_id(self, name: object) -> int: ...
        def _user_id(self, name: str) -> int: ...
        def get_user(self, name: str) -> User: ...

    def set_user_proxy(self, name: str, proxy: bool, proxy_group: Any = KEEP, person_from: Any = KEEP) -> User:
        """Let (or stop) ``name``'s requests name the person they are for.

        Args:
            proxy: whether the user is a proxy; off clears its other settings.
            proxy_group: the group its new people go in, None for the proxy's own. Defaults to
                keeping the current one.
            person_from: ``header`` or ``user-field`` (``names.PERSON_FROM``). Defaults to keeping it.
        """
        user_id = self._user_id(name)
        changes: dict[str, Any] = {"proxy": int(proxy)}
        if not proxy:
            changes.update(proxy_group_id=None, person_from="header")
        if proxy and proxy_group is not KEEP:
            changes["proxy_group_id"] = None if proxy_group is None else self._group_id(proxy_group)
        if proxy and person_from is not KEEP:
            changes["person_from"] = _person_from(person_from)
        assignments = ", ".join(f"{column} = ?" for column in changes)
        self._db.execute(f"UPDATE users SET {assignments} WHERE id = ?", (*changes.values(), user_id))
        return self.get_user(name)

    def person_of(self, proxy_id: int, identity: str) -> User | None:
        """The person the proxy ``proxy_id`` created for ``identity``, or None."""
        row = self._db.execute(
            USER_SELECT + " WHERE u.owner_id = ? AND u.identity = ?", (proxy_id, identity)
        ).fetchone()
        return None if row is None else user_of_row(row)

    def add_person(self, proxy_id: int, group: str, identity: str) -> User:
        """Create the proxy ``proxy_id``'s person for ``identity`` in ``group``, named for showing.

        The name is ``names.person_name(identity)``, with ``-2``, ``-3``... if another user has it.
        """
        base = name = person_name(identity)
        taken = "SELECT 1 FROM users WHERE name = ?"
        n = 1
        while self._db.execute(taken, (name,)).fetchone():
            n += 1
            name = f"{base[: 64 - len(str(n)) - 1]}-{n}"
        self._db.execute(
            "INSERT INTO users (name, group_id, created, owner_id, identity) VALUES (?, ?, ?, ?, ?)",
            (name, self._group_id(group), self._clock(), proxy_id, identity),
        )
        return self.get_user(name)

    def people_since(self, proxy_id: int, since: float) -> tuple[int, float | None]:
        """How many people the proxy ``proxy_id`` created at or after ``since`` (wall clock), and the first when."""
        row = self._db.execute(
            "SELECT count(*), min(created) FROM users WHERE owner_id = ? AND created >= ?", (proxy_id, since)
        ).fetchone()
        return row[0], row[1]

    def _import_person(self, name: str, proxy: str, identity: str) -> None:
        """Make the imported user ``name`` the person ``proxy`` forwards as ``identity``."""
        owner = self._db.execute("SELECT id FROM users WHERE name = ? AND proxy = 1", (proxy,)).fetchone()
        if owner is None:
            raise InvalidValue(f"user {name!r} is a person of {proxy!r}, which is not a proxy; import the proxy too")
        try:
            self._db.execute("UPDATE users SET owner_id = ?, identity = ? WHERE name = ?", (owner[0], identity, name))
        except sqlite3.IntegrityError:
            raise InvalidValue(
                f"user {name!r}: proxy {proxy!r} already has a person with identity {identity!r}; list each once"
            ) from None
