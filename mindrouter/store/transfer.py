"""Export and import of the pool's setup: groups, users (never keys), backends and aliases as TOML can hold them.

``mr export`` writes what ``mr import`` takes; an import creates or replaces by name, validated whole
before one transaction writes it, and can be tried (``dry_run``) to see what it would change.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .backends import _BACKEND_COLUMNS
from .changes import pool_changes
from .errors import InvalidValue
from .rows import QUOTA_FIELDS, BackendRow, Group, User
from .schema import transaction
from .validate import _validate_import

__all__ = ["Transfer"]

_QUOTA_COLUMNS = ", ".join(QUOTA_FIELDS)
_QUOTA_SET = ", ".join(f"{f} = excluded.{f}" for f in QUOTA_FIELDS)


class _RolledBack(Exception):
    """Ends a dry run's transaction (``Transfer.import_``)."""


def _no_nulls(row: dict[str, Any]) -> dict[str, Any]:
    """TOML has no null: leave out what is unset."""
    return {k: v for k, v in row.items() if v is not None}


class Transfer:
    """The export and import half of ``Store``; it shares the store's connection and clock."""

    _db: sqlite3.Connection
    _clock: Callable[[], float]

    if TYPE_CHECKING:

        def list_users(self, group: str | None = None) -> list[User]: ...
        def list_groups(self) -> list[Group]: ...
        def list_backends(self) -> list[BackendRow]: ...
        def backend_at(self, url: str) -> BackendRow | None: ...
        def list_aliases(self) -> dict[str, str]: ...
        def import_aliases(self, entries: object) -> int: ...
        def _import_person(self, name: str, proxy: str, identity: str) -> None: ...

    def export(self) -> dict[str, Any]:
        """Groups, users (never keys) and backends, in the shape ``import_`` takes and TOML can hold."""
        users = []
        for user in self.list_users():
            row: dict[str, Any] = {"name": user.name, "group": user.group, "weight_override": user.weight_override}
            row["proxy_for"] = user.forwards_to
            if user.proxy and user.person_from != "header":
                row["person_from"] = user.person_from
            if user.owner_id is not None:
                row.update(person_of=user.person_of, identity=user.identity)
            users.append(_no_nulls(row | user.quota.to_dict()))
        out = {
            "version": 1,
            "groups": [_no_nulls(g.to_dict()) for g in self.list_groups()],
            "users": users,
            "backends": [_no_nulls(b.to_dict()) for b in self.list_backends()],
        }
        if aliases := self.list_aliases():
            out["aliases"] = [{"name": name, "target": target} for name, target in aliases.items()]
        return out

    def import_(self, data: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Create or replace, by name, every group, user and backend in ``data``; nothing else is touched.

        Each entry describes the whole thing: a field it leaves out takes its default. Derived
        fields that ``export`` or ``to_dict`` write (a backend's ``id``, a user's ``weight``) are
        ignored. Everything is validated before anything is written, then written in one
        transaction. Returns how many of each were imported, and under ``changes`` what changed
        (``changes.pool_changes``).

        Args:
            dry_run: write in the transaction, then roll it back: the changes it would make.

        Raises:
            InvalidValue: naming the first bad entry; the database is unchanged.
        """
        before = self.export()
        try:
            with transaction(self._db):
                counts = self._import(data)
                changes = pool_changes(before, self.export())
                if dry_run:
                    raise _RolledBack
        except _RolledBack:
            pass
        return {**counts, "changes": changes}

    def _import(self, data: Mapping[str, Any]) -> dict[str, int]:
        rest = {k: v for k, v in data.items() if k != "aliases"} if isinstance(data, Mapping) else data
        groups, users, backends = _validate_import(rest, {g.name for g in self.list_groups()})
        for name, fields in backends:
            row = self.backend_at(fields[0])
            if row is not None and row.name.lower() != name.lower():
                raise InvalidValue(
                    f"backend {name!r} ({fields[0]}) is already in the pool as {row.name!r}; "
                    f"name it {row.name!r} in the file or remove that one first"
                )
        db = self._db
        for name, weight, quotas in groups:
            db.execute(
                f"INSERT INTO groups (name, scheduler_weight, {_QUOTA_COLUMNS}) VALUES (?, ?, ?, ?, ?)"
                f" ON CONFLICT (name) DO UPDATE SET scheduler_weight = excluded.scheduler_weight, {_QUOTA_SET}",
                (name, weight, *quotas),
            )
        for name, group, override, quotas, proxy_for, person_from, _ in users:
            group_id = db.execute("SELECT id FROM groups WHERE name = ?", (group,)).fetchone()[0]
            people = proxy_for and db.execute("SELECT id FROM groups WHERE name = ?", (proxy_for,)).fetchone()[0]
            db.execute(
                f"INSERT INTO users (name, group_id, weight_override, created, {_QUOTA_COLUMNS}, proxy,"
                " proxy_group_id, person_from) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE"
                f" SET group_id = excluded.group_id, weight_override = excluded.weight_override, {_QUOTA_SET},"
                " proxy = excluded.proxy, proxy_group_id = excluded.proxy_group_id,"
                " person_from = excluded.person_from, owner_id = NULL, identity = NULL",
                (name, group_id, override, self._clock(), *quotas, int(people is not None), people, person_from),
            )
        for name, *_, person in users:
            if person is not None:
                self._import_person(name, *person)
        for name, fields in backends:
            db.execute(
                f"INSERT INTO backends (name, {_BACKEND_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET url = excluded.url,"
                " engine = excluded.engine, max_concurrent = excluded.max_concurrent,"
                " gpus = excluded.gpus, node = excluded.node, priority = excluded.priority,"
                " state = excluded.state, parallel = excluded.parallel, max_loaded = excluded.max_loaded",
                (name, *fields),
            )
        counts = {"groups": len(groups), "users": len(users), "backends": len(backends)}
        if "aliases" in data:
            counts["aliases"] = self.import_aliases(data["aliases"])
        return counts
