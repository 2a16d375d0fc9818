"""The Store: groups, users, API keys and backends on the daemon's one connection (SQLite, or PostgreSQL).

Backends are in ``backends.py``, API keys in ``keys.py``, usage in ``usage.py``, decision records in
``decisions.py``, export and import in ``transfer.py``, the schema in ``schema.py``.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ..scheduler.settings import DEFAULT_GROUP_WEIGHTS
from . import postgres
from .aliases import Aliases
from .backends import Backends
from .checkpoint import Checkpointer
from .decisions import Decisions
from .errors import AlreadyExists, InUse, InvalidValue, NotFound, StoreError
from .keys import ApiKeys
from .people import USER_SELECT as _USER_SELECT
from .people import People
from .people import user_of_row as _user
from .rows import QUOTA_FIELDS, Group, Quota, User
from .schema import migrate, transaction
from .sessions import UiSessions
from .transfer import Transfer
from .usage import UsageLog
from .validate import _name, _person_from, _quota, _weight

DAY = 86_400.0

_QUOTAS = ", ".join(f"{{t}}.{f}" for f in QUOTA_FIELDS)
_GROUP_SELECT = f"SELECT id, name, scheduler_weight, {_QUOTAS.format(t='groups')} FROM groups"


def _group(row: tuple[Any, ...]) -> Group:
    return Group(row[0], row[1], row[2], Quota(row[3], row[4], row[5]))


class Store(Backends, UsageLog, Decisions, People, ApiKeys, Aliases, UiSessions, Transfer):
    """The daemon's durable state, on one connection; not for use from several threads.

    Args:
        path: the SQLite file; parent folders are created (mode 0700). Unused with ``url``.
        max_decisions: decision records kept at most (newest first); 0: no cap (the daemon deletes them by
            age, ``StoreWorker``). Defaults to 100,000.
        usage_retention: seconds of usage kept; older rows are pruned as new ones arrive.
            Defaults to 30 days.
        prune_inline: prune old usage rows as new ones are added; the daemon leaves it to its
            ``StoreWorker``, off the event loop.
        clock: wall-clock seconds for ``created`` times. Defaults to ``time.time``.
        url: a ``postgresql://`` url keeps everything in that database instead (``postgres.py``).
            Defaults to empty: the SQLite file.

    Raises:
        StoreError: the file was written by a newer schema, or the database cannot be reached.
    """

    def __init__(
        self,
        path: Path,
        *,
        max_decisions: int = 100_000,
        usage_retention: float = 30 * DAY,
        prune_inline: bool = True,
        clock: Callable[[], float] = time.time,
        url: str = "",
    ) -> None:
        if max_decisions < 0:
            raise InvalidValue(f"max_decisions {max_decisions!r} must be 0 (no cap) or more")
        self.path = Path(path)
        self.max_decisions = max_decisions
        self.usage_retention = usage_retention
        self.prune_inline = prune_inline
        self._clock = clock
        self.url = url
        if url:
            self._db = postgres.connect(url)
        else:
            self._db = self._open_sqlite()
        self._decision_batch = max(1, min(1000, max_decisions // 10))
        low = self._db.execute("SELECT min(id) FROM decisions").fetchone()[0]
        self._decisions_below = 0 if low is None else low - 1
        self._usage_inserts = 0
        self._checkpointer: Checkpointer | None = None

    def _open_sqlite(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fresh = not self.path.exists()
            # isolation_level=None: every statement commits on its own unless we BEGIN.
            db = sqlite3.connect(self.path, isolation_level=None, cached_statements=256)
            if fresh:
                os.chmod(self.path, 0o600)  # key hashes and usage; SQLite gives -wal/-shm the same mode
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            db.execute("PRAGMA foreign_keys = ON")
            migrate(db)
        except OSError as exc:
            raise StoreError(
                f"cannot use the state folder {self.path.parent} ({exc.strerror or exc}); "
                "make it writable for this user or set [server] state_dir"
            ) from None
        except sqlite3.Error as exc:
            raise StoreError(
                f"the state database {self.path} cannot be opened ({exc}); if it is damaged, move it aside "
                "and restore a backup (`mr import` takes an `mr export` file), or set [server] state_dir"
            ) from None
        return db

    # ------------------------------------------------------------ lifecycle

    def checkpoint_in_background(self, *, interval: float = 1.0) -> None:
        """Leave WAL checkpoints to a thread of their own (the daemon: no commit on its loop waits for fsync)."""
        if self._checkpointer is None and not self.url:
            self.checkpoint_elsewhere()
            self._checkpointer = Checkpointer(self.path, interval=interval)
            self._checkpointer.start()

    def checkpoint_elsewhere(self) -> None:
        """No commit on this connection checkpoints the WAL (with its fsyncs): another thread does (SQLite only)."""
        if not self.url:
            self._db.execute("PRAGMA wal_autocheckpoint = 0")

    def fence(self, epoch: int) -> None:
        """Lead in ``epoch`` from now on: the database refuses this store's writes once a later leader took over.

        Only on PostgreSQL (a router on SQLite has the state to itself)."""
        postgres.fence(self._db, epoch)

    def close(self) -> None:
        """Close the connection (idempotent); WAL content is checkpointed into the main file."""
        if self._db is None:
            return
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        try:
            self._db.execute("PRAGMA optimize")
        finally:
            self._db.close()
            self._db = None  # type: ignore[assignment]

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    # ------------------------------------------------------------ groups

    def ensure_default_groups(self, weights: Mapping[str, float] = DEFAULT_GROUP_WEIGHTS) -> list[str]:
        """Create the given groups on the first start only, so later admin edits and removals stick.

        Returns the names created (empty on every later start).
        """
        checked = {_name("group", name).lower(): _weight(f"group {name!r}", w) for name, w in weights.items()}
        created: list[str] = []
        with transaction(self._db) as db:
            if db.execute("SELECT 1 FROM meta WHERE key = 'default_groups'").fetchone():
                return created
            for name, weight in checked.items():
                if db.execute(
                    "INSERT INTO groups (name, scheduler_weight) VALUES (?, ?) ON CONFLICT DO NOTHING", (name, weight)
                ).rowcount:
                    created.append(name)
            # ON CONFLICT: routers starting at once on one PostgreSQL all get here; the groups are made once.
            db.execute("INSERT INTO meta (key, value) VALUES ('default_groups', '1') ON CONFLICT DO NOTHING")
        return created

    def _group_id(self, name: object) -> int:
        row = self._db.execute("SELECT id FROM groups WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"group {name!r} does not exist; create it with `mr group add {name} --weight 1`")
        return row[0]

    def add_group(self, name: object, weight: float) -> Group:
        """Names arrive as the admin API received them; they are checked here, at the store's boundary."""
        name = _name("group", name).lower()
        weight = _weight(f"group {name!r}", weight)
        if self._db.execute("SELECT 1 FROM groups WHERE name = ?", (name,)).fetchone():
            raise AlreadyExists(
                f"group {name!r} already exists; change its weight with `mr group set-weight {name} {weight:g}`"
            )
        cur = self._db.execute("INSERT INTO groups (name, scheduler_weight) VALUES (?, ?)", (name, weight))
        return Group(cur.lastrowid, name, weight)  # type: ignore[arg-type]

    def set_group_weight(self, name: str, weight: float) -> Group:
        weight = _weight(f"group {name!r}", weight)
        if not self._db.execute("UPDATE groups SET scheduler_weight = ? WHERE name = ?", (weight, name)).rowcount:
            self._group_id(name)
        return self.get_group(name)

    def remove_group(self, name: str) -> None:
        """Remove an empty group; one that still has users is refused (InUse)."""
        group_id = self._group_id(name)
        users = [
            r[0]
            for r in self._db.execute("SELECT name FROM users WHERE group_id = ? ORDER BY name LIMIT 4", (group_id,))
        ]
        if users:
            count = self._db.execute("SELECT count(*) FROM users WHERE group_id = ?", (group_id,)).fetchone()[0]
            shown = ", ".join(users[:3]) + (", ..." if count > 3 else "")
            raise InUse(
                f"group {name!r} still has {count} user{'s' * (count != 1)} ({shown}); move them to another "
                "group or remove them with `mr user rm NAME` first"
            )
        self._db.execute("DELETE FROM groups WHERE id = ?", (group_id,))

    def get_group(self, name: str) -> Group:
        row = self._db.execute(_GROUP_SELECT + " WHERE name = ?", (name,)).fetchone()
        if row is None:
            self._group_id(name)
        return _group(row)

    def list_groups(self) -> list[Group]:
        return [_group(r) for r in self._db.execute(_GROUP_SELECT + " ORDER BY name")]

    def set_group_quota(self, name: str, changes: Mapping[str, int | None]) -> Group:
        """Set the given limits (None removes one) for the group as a whole; the others stay."""
        self._set_quota("groups", name, f"group {name!r}", changes, self._group_id)
        return self.get_group(name)

    def _set_quota(
        self, table: str, name: str, what: str, changes: Mapping[str, int | None], missing: Callable[[str], int]
    ) -> None:
        unknown = set(changes) - set(QUOTA_FIELDS)
        if unknown:
            raise InvalidValue(f"{sorted(unknown)[0]!r} is not a quota; use {', '.join(QUOTA_FIELDS)}")
        values = {f: _quota(what, f, v) for f, v in changes.items()}
        if not values:
            return
        assignments = ", ".join(f"{f} = ?" for f in values)
        if not self._db.execute(f"UPDATE {table} SET {assignments} WHERE name = ?", (*values.values(), name)).rowcount:
            missing(name)

    # ------------------------------------------------------------ users

    def _user_id(self, name: str) -> int:
        row = self._db.execute("SELECT id FROM users WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"user {name!r} does not exist; create it with `mr user add {name} --group student`")
        return row[0]

    def add_user(
        self,
        name: object,
        group: object,
        weight: float | None = None,
        *,
        proxy: bool = False,
        proxy_group: str | None = None,
        person_from: str = "header",
    ) -> User:
        """A regular user, or with ``proxy``/``proxy_group`` a proxy (see ``People.set_user_proxy``)."""
        name = _name("user", name)
        person_from = _person_from(person_from)
        override = None if weight is None else _weight(f"user {name!r}", weight)
        group_id = self._group_id(group)
        people = None if proxy_group is None else self._group_id(proxy_group)
        if self._db.execute("SELECT 1 FROM users WHERE name = ?", (name,)).fetchone():
            raise AlreadyExists(f"user {name!r} already exists; give it a new key with `mr user key {name}`")
        self._db.execute(
            "INSERT INTO users (name, group_id, weight_override, created, proxy, proxy_group_id, person_from)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (name, group_id, override, self._clock(), int(proxy or people is not None), people, person_from),
        )
        return self.get_user(name)

    def set_user_weight(self, name: str, weight: float | None) -> User:
        """Set the user's own weight; None clears it so the group's weight applies."""
        override = None if weight is None else _weight(f"user {name!r}", weight)
        if not self._db.execute("UPDATE users SET weight_override = ? WHERE name = ?", (override, name)).rowcount:
            self._user_id(name)
        return self.get_user(name)

    def set_user_group(self, name: str, group: str) -> User:
        group_id = self._group_id(group)
        if not self._db.execute("UPDATE users SET group_id = ? WHERE name = ?", (group_id, name)).rowcount:
            self._user_id(name)
        return self.get_user(name)

    def remove_user(self, name: str) -> None:
        """Remove the user and all its keys; its usage rows stay for accounting."""
        if not self._db.execute("DELETE FROM users WHERE name = ?", (name,)).rowcount:
            self._user_id(name)

    def get_user(self, name: str) -> User:
        row = self._db.execute(_USER_SELECT + " WHERE u.name = ?", (name,)).fetchone()
        if row is None:
            self._user_id(name)
        return _user(row)

    def set_user_quota(self, name: str, changes: Mapping[str, int | None]) -> User:
        """Set the given limits of the user's own (None removes one); the others stay."""
        self._set_quota("users", name, f"user {name!r}", changes, self._user_id)
        return self.get_user(name)

    def count_users(self) -> int:
        """How many users there are (`mr status`), without reading them."""
        return int(self._db.execute("SELECT count(*) FROM users").fetchone()[0])

    def users_per_group(self) -> dict[str, int]:
        """How many users each group has (`mr group list`, the Groups page), counted without reading them."""
        sql = "SELECT g.name, count(u.id) FROM groups g LEFT JOIN users u ON u.group_id = g.id GROUP BY g.name"
        return dict(self._db.execute(sql).fetchall())

    def users_by_id(self, ids: Iterable[Hashable]) -> list[User]:
        """The users with these ids, by name: the few a listing of the people active now shows."""
        wanted = sorted({int(i) for i in ids})  # type: ignore[call-overload]
        found: list[User] = []
        for first in range(0, len(wanted), 10_000):  # under either database's limit on parameters
            chunk = wanted[first : first + 10_000]
            marks = ", ".join("?" * len(chunk))
            found += [_user(r) for r in self._db.execute(_USER_SELECT + f" WHERE u.id IN ({marks})", chunk)]
        return sorted(found, key=lambda user: user.name.lower())

    def list_users(self, group: str | None = None) -> list[User]:
        if group is None:
            return [_user(r) for r in self._db.execute(_USER_SELECT + " ORDER BY u.name")]
        group_id = self._group_id(group)
        return [_user(r) for r in self._db.execute(_USER_SELECT + " WHERE u.group_id = ? ORDER BY u.name", (group_id,))]
