"""Durable state in one SQLite file: groups, users, API keys, backends, usage and decisions.

The daemon owns the file and calls the store from its event loop, so every
call is one or two indexed statements on one long-lived connection (the
sqlite3 module caches the prepared statements). WAL with ``synchronous=NORMAL``
makes each call's commit survive a SIGKILL of the process once it returns
(not a power cut, which may lose the last commits but never corrupts).

Invariants:
    - API keys are stored only as SHA-256 hex plus a short display prefix.
    - User and backend ids are never reused (AUTOINCREMENT), because usage
      rows and decision records refer to them after a removal.
    - Decision records are pruned as a prefix of ids, in batches, so an
      insert is O(1) amortized and at most ``max_decisions + batch`` are kept.
    - ``import_`` validates everything before it writes, then writes in one
      transaction: bad input changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from .errors import MindRouterError
from .scheduler.settings import DEFAULT_GROUP_WEIGHTS, check_weight

__all__ = [
    "ENGINES",
    "SCHEMA_VERSION",
    "STATES",
    "AlreadyExists",
    "ApiKeyInfo",
    "BackendRow",
    "Group",
    "InUse",
    "InvalidValue",
    "NotFound",
    "Store",
    "StoreError",
    "UsageRow",
    "UsageTotal",
    "User",
    "migrate",
]

ENGINES = ("ollama", "vllm", "llamacpp", "openai")
STATES = ("enabled", "draining", "disabled")
KEY_PREFIX = "mr-"
DAY = 86_400.0


class StoreError(MindRouterError):
    """A state change that cannot be made; ``status`` is the HTTP status the admin API answers."""

    status = 500
    code = "internal_error"


class NotFound(StoreError, LookupError):
    """The named group, user or backend does not exist."""

    status = 404
    code = "not_found"


class AlreadyExists(StoreError):
    """A group, user or backend of that name exists already."""

    status = 409
    code = "conflict"


class InUse(StoreError):
    """The thing is still referenced (a group that has users)."""

    status = 409
    code = "conflict"


class InvalidValue(StoreError, ValueError):
    """A value (weight, name, URL, engine, import file) that cannot be stored."""

    status = 400
    code = "bad_request"


# ---------------------------------------------------------------- rows


@dataclass(frozen=True, slots=True)
class Group:
    id: int
    name: str
    scheduler_weight: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "scheduler_weight": self.scheduler_weight}


@dataclass(frozen=True, slots=True)
class User:
    id: int
    name: str
    group: str
    weight_override: float | None
    group_weight: float
    created: float
    """Wall-clock epoch seconds."""

    @property
    def weight(self) -> float:
        """The scheduler weight: the override if set, else the group's weight."""
        return self.group_weight if self.weight_override is None else self.weight_override

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "group": self.group, "weight_override": self.weight_override, "weight": self.weight}


@dataclass(frozen=True, slots=True)
class ApiKeyInfo:
    """What may be shown about a key: never the key itself."""

    id: int
    user: str
    prefix: str
    created: float

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "user": self.user, "prefix": self.prefix, "created": self.created}


@dataclass(frozen=True, slots=True)
class BackendRow:
    id: int
    name: str
    url: str
    engine: str
    max_concurrent: int
    gpus: tuple[int, ...]
    node: str
    """URL of the ``mr agent`` that reports this backend's GPUs; empty for this machine."""
    priority: float
    state: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "url": self.url,
            "engine": self.engine,
            "max_concurrent": self.max_concurrent,
            "gpus": list(self.gpus),
            "node": self.node,
            "priority": self.priority,
            "state": self.state,
        }


class UsageRow(NamedTuple):
    user_id: int
    tokens: int
    at: float


@dataclass(frozen=True, slots=True)
class UsageTotal:
    user_id: int
    user: str | None
    """None once the user has been removed."""
    requests: int
    prompt_tokens: int
    completion_tokens: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id,
            "user": self.user,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "tokens": self.tokens,
        }


# ---------------------------------------------------------------- schema

_SCHEMA_V1 = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE groups (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE COLLATE NOCASE,"
    " scheduler_weight REAL NOT NULL CHECK (scheduler_weight > 0))",
    "CREATE TABLE users (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE COLLATE NOCASE,"
    " group_id INTEGER NOT NULL REFERENCES groups(id) ON DELETE RESTRICT,"
    " weight_override REAL CHECK (weight_override IS NULL OR weight_override > 0), created REAL NOT NULL)",
    "CREATE INDEX users_group ON users(group_id)",
    "CREATE TABLE api_keys (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,"
    " hash TEXT NOT NULL UNIQUE, prefix TEXT NOT NULL, created REAL NOT NULL)",
    "CREATE INDEX api_keys_user ON api_keys(user_id)",
    "CREATE TABLE backends (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE COLLATE NOCASE,"
    " url TEXT NOT NULL, engine TEXT NOT NULL CHECK (engine IN ('ollama','vllm','llamacpp','openai')),"
    " max_concurrent INTEGER NOT NULL CHECK (max_concurrent > 0), gpus TEXT NOT NULL DEFAULT '[]',"
    " node TEXT NOT NULL DEFAULT '', priority REAL NOT NULL DEFAULT 0,"
    " state TEXT NOT NULL DEFAULT 'enabled' CHECK (state IN ('enabled','draining','disabled')))",
    # No foreign key on usage: recording must never fail for a user removed mid-request.
    "CREATE TABLE usage (id INTEGER PRIMARY KEY, at REAL NOT NULL, user_id INTEGER NOT NULL,"
    " request_id TEXT NOT NULL, model TEXT NOT NULL, backend_id INTEGER,"
    " prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL)",
    "CREATE INDEX usage_at ON usage(at)",
    "CREATE TABLE decisions (id INTEGER PRIMARY KEY AUTOINCREMENT, request_id TEXT NOT NULL,"
    " user TEXT, at REAL, record TEXT NOT NULL)",
    "CREATE INDEX decisions_request ON decisions(request_id)",
    "CREATE INDEX decisions_user ON decisions(user, id)",
)

#: ``_MIGRATIONS[n]`` takes a database at version n to n + 1. Append; never edit a shipped entry.
_MIGRATIONS: list[Sequence[str] | Callable[[sqlite3.Connection], None]] = [_SCHEMA_V1]
SCHEMA_VERSION = len(_MIGRATIONS)


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the database to ``SCHEMA_VERSION``, one transaction per step; returns the version found."""
    found = conn.execute("PRAGMA user_version").fetchone()[0]
    if found > SCHEMA_VERSION:
        raise StoreError(
            f"the state database has schema version {found} but this mindrouter knows only "
            f"{SCHEMA_VERSION}; upgrade mindrouter or point `state_dir` elsewhere"
        )
    for version in range(found, SCHEMA_VERSION):
        step = _MIGRATIONS[version]
        conn.execute("BEGIN IMMEDIATE")
        try:
            if callable(step):
                step(conn)
            else:
                for statement in step:
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return found


# ---------------------------------------------------------------- validation

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}\Z")


def _name(kind: str, value: object) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise InvalidValue(
            f"{kind} name {value!r} is not valid; use 1 to 64 letters, digits, '.', '_', '-', "
            "'@' or '+', starting with a letter or digit"
        )
    return value


def _weight(what: str, value: object) -> float:
    try:
        return check_weight(value)
    except ValueError as exc:
        raise InvalidValue(f"cannot set the weight of {what}: {exc}") from None


def _url(what: str, value: object, *, empty_ok: bool = False) -> str:
    if empty_ok and value == "":
        return ""
    if isinstance(value, str) and not any(c.isspace() for c in value):
        parts = urlsplit(value)
        if parts.scheme in ("http", "https") and parts.netloc:
            return value.rstrip("/")
    raise InvalidValue(f"{what} {value!r} is not an http(s) URL; give one such as http://127.0.0.1:11434")


def _backend_fields(
    name: str,
    url: object,
    engine: object,
    max_concurrent: object,
    gpus: object,
    node: object,
    priority: object,
    state: object,
) -> tuple[str, str, int, str, str, float, str]:
    """Validate a backend's fields; returns (url, engine, max_concurrent, gpus_json, node, priority, state)."""
    what = f"backend {name!r}"
    url = _url(f"the URL of {what}", url)
    if engine not in ENGINES:
        raise InvalidValue(f"engine {engine!r} of {what} is not known; use one of {', '.join(ENGINES)}")
    if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or not 1 <= max_concurrent <= 100_000:
        raise InvalidValue(f"max_concurrent {max_concurrent!r} of {what} must be a whole number from 1 to 100000")
    if (
        not isinstance(gpus, (list, tuple))
        or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpus)
        or len(set(gpus)) != len(gpus)
    ):
        raise InvalidValue(f"gpus {gpus!r} of {what} must be distinct GPU indices such as [0, 1]")
    node = _url(f"the node of {what}", node, empty_ok=True)
    if isinstance(priority, bool) or not isinstance(priority, (int, float)) or not math.isfinite(priority):
        raise InvalidValue(f"priority {priority!r} of {what} must be a finite number such as 0 or 10")
    if state not in STATES:
        raise InvalidValue(f"state {state!r} of {what} is not known; use one of {', '.join(STATES)}")
    return url, engine, max_concurrent, json.dumps(list(gpus)), node, float(priority), state  # type: ignore[return-value]


def _decision_params(record: Mapping[str, Any], at: float | None) -> tuple[Any, ...]:
    request_id = record.get("request_id")
    if not isinstance(request_id, str) or not request_id:
        raise InvalidValue(f"a decision record needs a request_id string, not {request_id!r}")
    user = record.get("user")
    when = at if at is not None else record.get("wall_time")
    return (
        request_id,
        user if isinstance(user, str) else None,
        when if isinstance(when, (int, float)) and not isinstance(when, bool) else None,
        json.dumps(record, separators=(",", ":"), default=str),
    )


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


# ---------------------------------------------------------------- the store

_USER_SELECT = (
    "SELECT u.id, u.name, g.name, u.weight_override, g.scheduler_weight, u.created"
    " FROM users u JOIN groups g ON g.id = u.group_id"
)
_BACKEND_SELECT = "SELECT id, name, url, engine, max_concurrent, gpus, node, priority, state FROM backends"


def _backend(row: tuple[Any, ...]) -> BackendRow:
    return BackendRow(row[0], row[1], row[2], row[3], row[4], tuple(json.loads(row[5])), row[6], row[7], row[8])


class Store:
    """The daemon's durable state, on one connection; not for use from several threads.

    Args:
        path: the SQLite file; parent folders are created (mode 0700).
        max_decisions: decision records kept (newest first). Defaults to 100,000.
        usage_retention: seconds of usage kept; older rows are pruned as new ones arrive.
            Defaults to 30 days.
        clock: wall-clock seconds for ``created`` times. Defaults to ``time.time``.

    Raises:
        StoreError: the file was written by a newer schema.
    """

    _PRUNE_USAGE_EVERY = 1024
    _PRUNE_USAGE_BATCH = 8192

    def __init__(
        self,
        path: Path,
        *,
        max_decisions: int = 100_000,
        usage_retention: float = 30 * DAY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_decisions < 1:
            raise InvalidValue(f"max_decisions {max_decisions!r} must be at least 1")
        self.path = Path(path)
        self.max_decisions = max_decisions
        self.usage_retention = usage_retention
        self._clock = clock
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fresh = not self.path.exists()
        # isolation_level=None: every statement commits on its own unless we BEGIN.
        self._db = sqlite3.connect(self.path, isolation_level=None, cached_statements=256)
        if fresh:
            os.chmod(self.path, 0o600)  # key hashes and usage; SQLite gives -wal/-shm the same mode
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.execute("PRAGMA foreign_keys = ON")
        migrate(self._db)
        self._decision_batch = max(1, min(1000, max_decisions // 10))
        low = self._db.execute("SELECT min(id) FROM decisions").fetchone()[0]
        self._decisions_below = 0 if low is None else low - 1
        """Every decision id at or below this has been pruned."""
        self._usage_inserts = 0

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Close the connection (idempotent); WAL content is checkpointed into the main file."""
        if self._db is None:
            return
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

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # ------------------------------------------------------------ groups

    def ensure_default_groups(self, weights: Mapping[str, float] = DEFAULT_GROUP_WEIGHTS) -> list[str]:
        """Create the given groups on the first start only, so later admin edits and removals stick.

        Returns the names created (empty on every later start).
        """
        checked = {_name("group", name).lower(): _weight(f"group {name!r}", w) for name, w in weights.items()}
        created: list[str] = []
        with self._transaction() as db:
            if db.execute("SELECT 1 FROM meta WHERE key = 'default_groups'").fetchone():
                return created
            for name, weight in checked.items():
                if db.execute(
                    "INSERT OR IGNORE INTO groups (name, scheduler_weight) VALUES (?, ?)", (name, weight)
                ).rowcount:
                    created.append(name)
            db.execute("INSERT INTO meta (key, value) VALUES ('default_groups', '1')")
        return created

    def _group_id(self, name: str) -> int:
        row = self._db.execute("SELECT id FROM groups WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"group {name!r} does not exist; create it with `mr group add {name} --weight 1`")
        return row[0]

    def add_group(self, name: str, weight: float) -> Group:
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
        row = self._db.execute("SELECT id, name, scheduler_weight FROM groups WHERE name = ?", (name,)).fetchone()
        if row is None:
            self._group_id(name)
        return Group(*row)

    def list_groups(self) -> list[Group]:
        return [Group(*r) for r in self._db.execute("SELECT id, name, scheduler_weight FROM groups ORDER BY name")]

    # ------------------------------------------------------------ users

    def _user_id(self, name: str) -> int:
        row = self._db.execute("SELECT id FROM users WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"user {name!r} does not exist; create it with `mr user add {name} --group student`")
        return row[0]

    def add_user(self, name: str, group: str, weight: float | None = None) -> User:
        name = _name("user", name)
        override = None if weight is None else _weight(f"user {name!r}", weight)
        group_id = self._group_id(group)
        if self._db.execute("SELECT 1 FROM users WHERE name = ?", (name,)).fetchone():
            raise AlreadyExists(f"user {name!r} already exists; give it a new key with `mr user key {name}`")
        self._db.execute(
            "INSERT INTO users (name, group_id, weight_override, created) VALUES (?, ?, ?, ?)",
            (name, group_id, override, self._clock()),
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
        return User(*row)

    def list_users(self, group: str | None = None) -> list[User]:
        if group is None:
            return [User(*r) for r in self._db.execute(_USER_SELECT + " ORDER BY u.name")]
        group_id = self._group_id(group)
        return [User(*r) for r in self._db.execute(_USER_SELECT + " WHERE u.group_id = ? ORDER BY u.name", (group_id,))]

    # ------------------------------------------------------------ keys

    def create_key(self, user: str) -> str:
        """Make a new key for ``user`` and return it: the only time it exists outside the client."""
        user_id = self._user_id(user)
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        self._db.execute(
            "INSERT INTO api_keys (user_id, hash, prefix, created) VALUES (?, ?, ?, ?)",
            (user_id, _hash(key), key[: len(KEY_PREFIX) + 6], self._clock()),
        )
        return key

    def user_for_key(self, key: str) -> User | None:
        """The user a key belongs to, or None; the lookup is by hash, so timing says nothing about the key."""
        if not isinstance(key, str) or not key.startswith(KEY_PREFIX) or len(key) > 256:
            return None
        row = self._db.execute(
            _USER_SELECT + " JOIN api_keys k ON k.user_id = u.id WHERE k.hash = ?", (_hash(key),)
        ).fetchone()
        return None if row is None else User(*row)

    def list_keys(self, user: str | None = None) -> list[ApiKeyInfo]:
        sql = "SELECT k.id, u.name, k.prefix, k.created FROM api_keys k JOIN users u ON u.id = k.user_id"
        if user is None:
            return [ApiKeyInfo(*r) for r in self._db.execute(sql + " ORDER BY k.id")]
        user_id = self._user_id(user)
        return [ApiKeyInfo(*r) for r in self._db.execute(sql + " WHERE k.user_id = ? ORDER BY k.id", (user_id,))]

    def revoke_keys(self, user: str) -> int:
        """Delete every key of ``user``; returns how many there were."""
        return self._db.execute("DELETE FROM api_keys WHERE user_id = ?", (self._user_id(user),)).rowcount

    # ------------------------------------------------------------ backends

    def _backend_row(self, key: str | int) -> tuple[Any, ...]:
        column = "id" if isinstance(key, int) else "name"
        row = self._db.execute(f"{_BACKEND_SELECT} WHERE {column} = ?", (key,)).fetchone()
        if row is None:
            raise NotFound(f"backend {key!r} does not exist; see the configured ones with `mr backend list`")
        return row

    def add_backend(
        self,
        name: str,
        url: str,
        engine: str,
        *,
        max_concurrent: int = 4,
        gpus: Sequence[int] = (),
        node: str = "",
        priority: float = 0.0,
        state: str = "enabled",
    ) -> BackendRow:
        name = _name("backend", name)
        fields = _backend_fields(name, url, engine, max_concurrent, gpus, node, priority, state)
        if self._db.execute("SELECT 1 FROM backends WHERE name = ?", (name,)).fetchone():
            raise AlreadyExists(
                f"backend {name!r} already exists; pick another name or remove it with `mr backend rm {name}` first"
            )
        cur = self._db.execute(
            "INSERT INTO backends (name, url, engine, max_concurrent, gpus, node, priority, state)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (name, *fields),
        )
        return self.get_backend(cur.lastrowid)  # type: ignore[arg-type]

    def update_backend(
        self,
        key: str | int,
        *,
        url: str | None = None,
        engine: str | None = None,
        max_concurrent: int | None = None,
        gpus: Sequence[int] | None = None,
        node: str | None = None,
        priority: float | None = None,
        state: str | None = None,
    ) -> BackendRow:
        """Change the given fields (None leaves one as it is; ``node=""`` clears the node)."""
        old = _backend(self._backend_row(key))
        fields = _backend_fields(
            old.name,
            old.url if url is None else url,
            old.engine if engine is None else engine,
            old.max_concurrent if max_concurrent is None else max_concurrent,
            old.gpus if gpus is None else gpus,
            old.node if node is None else node,
            old.priority if priority is None else priority,
            old.state if state is None else state,
        )
        self._db.execute(
            "UPDATE backends SET url = ?, engine = ?, max_concurrent = ?, gpus = ?, node = ?,"
            " priority = ?, state = ? WHERE id = ?",
            (*fields, old.id),
        )
        return self.get_backend(old.id)

    def set_backend_state(self, key: str | int, state: str) -> BackendRow:
        return self.update_backend(key, state=state)

    def remove_backend(self, key: str | int) -> None:
        self._db.execute("DELETE FROM backends WHERE id = ?", (self._backend_row(key)[0],))

    def get_backend(self, key: str | int) -> BackendRow:
        """A backend by name, or by id (an int, as decision records show it)."""
        return _backend(self._backend_row(key))

    def list_backends(self) -> list[BackendRow]:
        return [_backend(r) for r in self._db.execute(_BACKEND_SELECT + " ORDER BY id")]

    # ------------------------------------------------------------ usage

    def record_usage(
        self,
        user_id: int,
        request_id: str,
        model: str,
        backend_id: int | None,
        prompt_tokens: int,
        completion_tokens: int,
        at: float,
    ) -> None:
        """Record one finished request (``at``: wall-clock epoch seconds); durable once this returns."""
        self._db.execute(
            "INSERT INTO usage (at, user_id, request_id, model, backend_id, prompt_tokens,"
            " completion_tokens) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (at, user_id, request_id, model, backend_id, int(prompt_tokens), int(completion_tokens)),
        )
        self._usage_inserts += 1
        if self._usage_inserts % self._PRUNE_USAGE_EVERY == 0:
            self.prune_usage(at, limit=self._PRUNE_USAGE_BATCH)

    def recent_usage(self, since: float) -> list[UsageRow]:
        """Usage at or after ``since``, oldest first: what the daemon replays into the fairness window."""
        return [
            UsageRow(*r)
            for r in self._db.execute(
                "SELECT user_id, prompt_tokens + completion_tokens, at FROM usage WHERE at >= ? ORDER BY at", (since,)
            )
        ]

    def usage_totals(self, since: float) -> dict[int, UsageTotal]:
        """Requests and tokens per user id since ``since``."""
        rows = self._db.execute(
            "SELECT s.user_id, u.name, s.n, s.p, s.c FROM (SELECT user_id, count(*) AS n, sum(prompt_tokens) AS p,"
            " sum(completion_tokens) AS c FROM usage WHERE at >= ? GROUP BY user_id) s"
            " LEFT JOIN users u ON u.id = s.user_id",
            (since,),
        )
        return {r[0]: UsageTotal(*r) for r in rows}

    def prune_usage(self, now: float, *, limit: int | None = None) -> int:
        """Delete usage older than ``usage_retention`` before ``now`` (at most ``limit`` rows); returns the count."""
        cutoff = now - self.usage_retention
        if limit is None:
            return self._db.execute("DELETE FROM usage WHERE at < ?", (cutoff,)).rowcount
        return self._db.execute(
            "DELETE FROM usage WHERE id IN (SELECT id FROM usage WHERE at < ? LIMIT ?)", (cutoff, limit)
        ).rowcount

    # ------------------------------------------------------------ decisions

    def add_decision(self, record: Mapping[str, Any], *, at: float | None = None) -> None:
        """Store a decision record (it needs a ``request_id``); the oldest are pruned past ``max_decisions``.

        The user comes from ``record["user"]``; the time from ``at``, else ``record["wall_time"]``.
        """
        self._insert_decision(_decision_params(record, at))

    def add_decisions(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Store several records in one commit: the cheap way for a daemon that buffers them briefly."""
        params = [_decision_params(r, None) for r in records]  # all checked before any is written
        with self._transaction():
            for p in params:
                self._insert_decision(p)

    def _insert_decision(self, params: tuple[Any, ...]) -> None:
        cur = self._db.execute("INSERT INTO decisions (request_id, user, at, record) VALUES (?, ?, ?, ?)", params)
        cutoff = cur.lastrowid - self.max_decisions  # type: ignore[operator]
        if cutoff - self._decisions_below >= self._decision_batch:
            self._db.execute("DELETE FROM decisions WHERE id <= ?", (cutoff,))
            self._decisions_below = cutoff

    def recent_decisions(self, limit: int = 100, user: str | None = None) -> list[dict[str, Any]]:
        """The newest ``limit`` records (of ``user``, if given), oldest first."""
        if user is None:
            rows = self._db.execute("SELECT record FROM decisions ORDER BY id DESC LIMIT ?", (max(0, limit),))
        else:
            rows = self._db.execute(
                "SELECT record FROM decisions WHERE user = ? ORDER BY id DESC LIMIT ?", (user, max(0, limit))
            )
        return [json.loads(r[0]) for r in rows][::-1]

    def get_decision(self, request_id: str) -> dict[str, Any] | None:
        """The newest record for ``request_id`` (a retried request has one per attempt), or None."""
        row = self._db.execute(
            "SELECT record FROM decisions WHERE request_id = ? ORDER BY id DESC LIMIT 1", (request_id,)
        ).fetchone()
        return None if row is None else json.loads(row[0])

    # ------------------------------------------------------------ export / import

    def export(self) -> dict[str, Any]:
        """Groups, users (never keys) and backends, in the shape ``import_`` takes and TOML can hold."""
        users = []
        for user in self.list_users():
            row: dict[str, Any] = {"name": user.name, "group": user.group}
            if user.weight_override is not None:  # TOML has no null
                row["weight_override"] = user.weight_override
            users.append(row)
        return {
            "version": 1,
            "groups": [g.to_dict() for g in self.list_groups()],
            "users": users,
            "backends": [b.to_dict() for b in self.list_backends()],
        }

    def import_(self, data: Mapping[str, Any]) -> dict[str, int]:
        """Create or replace, by name, every group, user and backend in ``data``; nothing else is touched.

        Each entry describes the whole thing: a field it leaves out takes its default. Derived
        fields that ``export`` or ``to_dict`` write (a backend's ``id``, a user's ``weight``) are
        ignored. Everything is validated before anything is written, then written in one
        transaction. Returns how many of each were imported.

        Raises:
            InvalidValue: naming the first bad entry; the database is unchanged.
        """
        groups, users, backends = _validate_import(data, {g.name for g in self.list_groups()})
        with self._transaction() as db:
            for name, weight in groups:
                db.execute(
                    "INSERT INTO groups (name, scheduler_weight) VALUES (?, ?)"
                    " ON CONFLICT (name) DO UPDATE SET scheduler_weight = excluded.scheduler_weight",
                    (name, weight),
                )
            for name, group, override in users:
                group_id = db.execute("SELECT id FROM groups WHERE name = ?", (group,)).fetchone()[0]
                db.execute(
                    "INSERT INTO users (name, group_id, weight_override, created) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (name) DO UPDATE SET group_id = excluded.group_id,"
                    " weight_override = excluded.weight_override",
                    (name, group_id, override, self._clock()),
                )
            for name, fields in backends:
                db.execute(
                    "INSERT INTO backends (name, url, engine, max_concurrent, gpus, node, priority, state)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET url = excluded.url,"
                    " engine = excluded.engine, max_concurrent = excluded.max_concurrent,"
                    " gpus = excluded.gpus, node = excluded.node, priority = excluded.priority,"
                    " state = excluded.state",
                    (name, *fields),
                )
        return {"groups": len(groups), "users": len(users), "backends": len(backends)}


_IMPORT_FIELDS = {
    "groups": ({"name", "scheduler_weight"}, {"name", "scheduler_weight"}, set()),
    "users": ({"name", "group"}, {"name", "group", "weight_override"}, {"weight"}),
    "backends": (
        {"name", "url", "engine"},
        {"name", "url", "engine", "max_concurrent", "gpus", "node", "priority", "state"},
        {"id"},
    ),
}


def _validate_import(data: Mapping[str, Any], existing_groups: set[str]) -> tuple[list[Any], list[Any], list[Any]]:
    """Check an import document completely; returns the normalized groups, users and backends."""
    if not isinstance(data, Mapping):
        raise InvalidValue("the import data must be a table with groups, users and backends lists")
    unknown = set(data) - {"version", "groups", "users", "backends"}
    if unknown:
        raise InvalidValue(
            f"the import data has unknown section {sorted(unknown)[0]!r}; use only groups, users and backends"
        )
    if data.get("version", 1) != 1:
        raise InvalidValue(f"the import data has version {data.get('version')!r}; this mindrouter reads version 1")
    sections: dict[str, list[Mapping[str, Any]]] = {}
    for section, (required, allowed, ignored) in _IMPORT_FIELDS.items():
        entries = data.get(section, [])
        if not isinstance(entries, list):
            raise InvalidValue(f"the import data's {section} must be a list of tables")
        seen: set[str] = set()
        for i, entry in enumerate(entries):
            where = f"{section}[{i}]"
            if not isinstance(entry, Mapping):
                raise InvalidValue(f"{where} must be a table with at least {', '.join(sorted(required))}")
            if missing := required - set(entry):
                raise InvalidValue(f"{where} lacks {sorted(missing)[0]!r}; give {', '.join(sorted(required))}")
            if extra := set(entry) - allowed - ignored:
                raise InvalidValue(f"{where} has unknown field {sorted(extra)[0]!r}; use {', '.join(sorted(allowed))}")
            try:
                name = _name(section[:-1], entry["name"]).lower()
            except InvalidValue as exc:
                raise InvalidValue(f"{where}: {exc}") from None
            if name in seen:
                raise InvalidValue(f"{where} repeats the name {entry['name']!r}; give each {section[:-1]} once")
            seen.add(name)
        sections[section] = entries

    def checked(where: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except InvalidValue as exc:
            raise InvalidValue(f"{where}: {exc}") from None

    groups = [
        (e["name"].lower(), checked(f"groups[{i}]", lambda e=e: _weight(f"group {e['name']!r}", e["scheduler_weight"])))
        for i, e in enumerate(sections["groups"])
    ]
    known = {g.lower() for g in existing_groups} | {name for name, _ in groups}
    users = []
    for i, e in enumerate(sections["users"]):
        group = e["group"]
        if not isinstance(group, str) or group.lower() not in known:
            raise InvalidValue(
                f"users[{i}]: group {group!r} of user {e['name']!r} does not exist; add it to the "
                "file's groups or create it with `mr group add NAME --weight 1`"
            )
        override = e.get("weight_override")
        if override is not None:
            override = checked(f"users[{i}]", lambda e=e: _weight(f"user {e['name']!r}", e["weight_override"]))
        users.append((e["name"], group.lower(), override))
    backends = [
        (
            e["name"],
            checked(
                f"backends[{i}]",
                lambda e=e: _backend_fields(
                    e["name"],
                    e["url"],
                    e["engine"],
                    e.get("max_concurrent", 4),
                    e.get("gpus", []),
                    e.get("node", ""),
                    e.get("priority", 0.0),
                    e.get("state", "enabled"),
                ),
            ),
        )
        for i, e in enumerate(sections["backends"])
    ]
    return groups, users, backends
