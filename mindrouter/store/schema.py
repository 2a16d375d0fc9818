"""The SQLite schema and its migrations: the database's ``user_version`` is the step reached."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence

from .errors import StoreError

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
_MIGRATIONS: list[Sequence[str] | Callable[[sqlite3.Connection], None]] = [
    _SCHEMA_V1,
    ("ALTER TABLE api_keys ADD COLUMN last_used REAL",),
]
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
