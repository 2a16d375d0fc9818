"""The SQLite schema and its migrations: the database's ``user_version`` is the step reached."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from ..names import person_identity
from .errors import Busy, StoreError

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

_QUOTA_COLUMNS = tuple(
    f"ALTER TABLE {table} ADD COLUMN {column} INTEGER CHECK ({column} IS NULL OR {column} >= 0)"
    for table in ("users", "groups")
    for column in ("tokens_per_day", "tokens_per_month", "requests_per_minute")
)

#: The per-request usage columns that daily totals sum, in ``usage_daily``'s order after the key.
_DAILY_KEY = "day, user_id, group_name, model, backend_id"
_DAILY_OF_ROW = (
    "date({r}.at, 'unixepoch', 'localtime'), {r}.user_id, {r}.group_name, {r}.model, coalesce({r}.backend_id, 0)"
)

_ACCOUNTING = (
    # GPU-seconds: how long the request held a backend slot. group_name: the user's group when it ran,
    # so a group's report and quota do not change when a member moves.
    "ALTER TABLE usage ADD COLUMN gpu_seconds REAL NOT NULL DEFAULT 0",
    "ALTER TABLE usage ADD COLUMN group_name TEXT NOT NULL DEFAULT ''",
    "UPDATE usage SET group_name = coalesce((SELECT g.name FROM users u JOIN groups g ON g.id = u.group_id"
    " WHERE u.id = usage.user_id), '')",
    # Daily totals in the server's local calendar, kept up to date by a trigger, so reports over a year
    # read a few rows per day and old per-request rows can be deleted without losing what reports need.
    f"CREATE TABLE usage_daily (day TEXT NOT NULL, user_id INTEGER NOT NULL, group_name TEXT NOT NULL,"
    f" model TEXT NOT NULL, backend_id INTEGER NOT NULL, requests INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL,"
    f" completion_tokens INTEGER NOT NULL, gpu_seconds REAL NOT NULL, PRIMARY KEY ({_DAILY_KEY})) WITHOUT ROWID",
    f"INSERT INTO usage_daily SELECT {_DAILY_OF_ROW.format(r='usage')}, count(*), sum(prompt_tokens),"
    f" sum(completion_tokens), sum(gpu_seconds) FROM usage GROUP BY 1, 2, 3, 4, 5",
    f"CREATE TRIGGER usage_daily_add AFTER INSERT ON usage BEGIN INSERT INTO usage_daily VALUES"
    f" ({_DAILY_OF_ROW.format(r='NEW')}, 1, NEW.prompt_tokens, NEW.completion_tokens, NEW.gpu_seconds)"
    f" ON CONFLICT ({_DAILY_KEY}) DO UPDATE SET requests = requests + 1,"
    f" prompt_tokens = prompt_tokens + excluded.prompt_tokens,"
    f" completion_tokens = completion_tokens + excluded.completion_tokens,"
    f" gpu_seconds = gpu_seconds + excluded.gpu_seconds; END",
    *_QUOTA_COLUMNS,
)

_MONTHLY_KEY = "month, user_id, group_name, model, backend_id"

_MONTHLY = (
    # Monthly totals beside the daily ones, so a report over a year reads twelve rows per
    # user, group, model and backend rather than 365.
    f"CREATE TABLE usage_monthly (month TEXT NOT NULL, user_id INTEGER NOT NULL, group_name TEXT NOT NULL,"
    f" model TEXT NOT NULL, backend_id INTEGER NOT NULL, requests INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL,"
    f" completion_tokens INTEGER NOT NULL, gpu_seconds REAL NOT NULL, PRIMARY KEY ({_MONTHLY_KEY})) WITHOUT ROWID",
    "INSERT INTO usage_monthly SELECT substr(day, 1, 7), user_id, group_name, model, backend_id, sum(requests),"
    " sum(prompt_tokens), sum(completion_tokens), sum(gpu_seconds) FROM usage_daily GROUP BY 1, 2, 3, 4, 5",
    f"CREATE TRIGGER usage_monthly_add AFTER INSERT ON usage BEGIN INSERT INTO usage_monthly VALUES"
    " (substr(date(NEW.at, 'unixepoch', 'localtime'), 1, 7), NEW.user_id, NEW.group_name, NEW.model,"
    " coalesce(NEW.backend_id, 0), 1, NEW.prompt_tokens, NEW.completion_tokens, NEW.gpu_seconds)"
    f" ON CONFLICT ({_MONTHLY_KEY}) DO UPDATE SET requests = requests + 1,"
    f" prompt_tokens = prompt_tokens + excluded.prompt_tokens,"
    f" completion_tokens = completion_tokens + excluded.completion_tokens,"
    f" gpu_seconds = gpu_seconds + excluded.gpu_seconds; END",
)

_ADD_SUMS = (
    "requests = {t}.requests + excluded.requests, prompt_tokens = {t}.prompt_tokens + excluded.prompt_tokens,"
    " completion_tokens = {t}.completion_tokens + excluded.completion_tokens,"
    " gpu_seconds = {t}.gpu_seconds + excluded.gpu_seconds"
)
"""The totals' upsert, each sum named with its table ``{t}`` (PostgreSQL finds a bare name ambiguous)."""
_ROWS_TO_ROLL = (
    "count(*), sum(prompt_tokens), sum(completion_tokens), sum(gpu_seconds) FROM usage WHERE id > ? AND id <= ?"
)

ROLLED_KEY = "usage_rolled_through"
"""The ``meta`` key holding the highest usage id already added to the daily and monthly totals."""

ROLL_USAGE = (
    f"INSERT INTO usage_daily SELECT {_DAILY_OF_ROW.format(r='usage')}, {_ROWS_TO_ROLL} GROUP BY 1, 2, 3, 4, 5"
    f" ON CONFLICT ({_DAILY_KEY}) DO UPDATE SET {_ADD_SUMS.format(t='usage_daily')}",
    "INSERT INTO usage_monthly SELECT substr(date(at, 'unixepoch', 'localtime'), 1, 7), user_id, group_name, model,"
    f" coalesce(backend_id, 0), {_ROWS_TO_ROLL} GROUP BY 1, 2, 3, 4, 5"
    f" ON CONFLICT ({_MONTHLY_KEY}) DO UPDATE SET {_ADD_SUMS.format(t='usage_monthly')}",
)
"""Add the usage rows with ids in ``(?, ?]`` to the daily and monthly totals (the local calendar)."""

_ROLLED_UP = (
    # The totals are rolled up from per-request rows in batches (before a report reads them, and before
    # old rows are deleted) rather than by a trigger on every insert: the triggers doubled what
    # committing a request's usage row cost the daemon (docs/performance.md). Everything so far is in.
    "DROP TRIGGER usage_daily_add",
    "DROP TRIGGER usage_monthly_add",
    f"INSERT INTO meta (key, value) SELECT '{ROLLED_KEY}', CAST(coalesce(max(id), 0) AS TEXT) FROM usage",
)

#: The proxy whose people group a user is in, when exactly one proxy's people go there.
_ONLY_PROXY_OF_GROUP = (
    "SELECT p.id, p.created FROM users p WHERE p.proxy = 1 AND coalesce(p.proxy_group_id, p.group_id) = ?"
)


def _people_keyed_by_identity(db: sqlite3.Connection) -> None:
    """Give people a proxy of their own and an exact identity, so no proxy reaches anybody else.

    Earlier releases kept no owner: a person was any user a proxy named. A user is taken to be a
    proxy's person when it has no key, is no proxy, sits in the people group of exactly one proxy and
    was created after that proxy; its identity is its stored name (case-folded if an e-mail address).
    Everyone else is nobody's person, and no proxy can name them.
    """
    for statement in (
        "ALTER TABLE users ADD COLUMN owner_id INTEGER REFERENCES users(id) ON DELETE SET NULL",
        "ALTER TABLE users ADD COLUMN identity TEXT",
        "ALTER TABLE users ADD COLUMN person_from TEXT NOT NULL DEFAULT 'header'"
        " CHECK (person_from IN ('header', 'user-field'))",
    ):
        db.execute(statement)
    candidates = db.execute(
        "SELECT u.id, u.name, u.group_id, u.created FROM users u WHERE u.proxy = 0"
        " AND NOT EXISTS (SELECT 1 FROM api_keys k WHERE k.user_id = u.id)"
    ).fetchall()
    for user_id, name, group_id, created in candidates:
        proxies = db.execute(_ONLY_PROXY_OF_GROUP, (group_id,)).fetchall()
        identity = person_identity(name)
        if len(proxies) == 1 and proxies[0][1] <= created and identity is not None:
            db.execute("UPDATE users SET owner_id = ?, identity = ? WHERE id = ?", (proxies[0][0], identity, user_id))
    db.execute("CREATE UNIQUE INDEX users_identity ON users(owner_id, identity) WHERE owner_id IS NOT NULL")


#: ``_MIGRATIONS[n]`` takes a database at version n to n + 1. Append; never edit a shipped entry.
_MIGRATIONS: list[Sequence[str] | Callable[[sqlite3.Connection], None]] = [
    _SCHEMA_V1,
    ("ALTER TABLE api_keys ADD COLUMN last_used REAL",),
    _ACCOUNTING,
    # A proxy (a front end such as Open WebUI) may name the person it forwards for; they are
    # created in proxy_group_id, or in the proxy's own group when it is NULL.
    (
        "ALTER TABLE users ADD COLUMN proxy INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE users ADD COLUMN proxy_group_id INTEGER REFERENCES groups(id) ON DELETE SET NULL",
    ),
    _MONTHLY,
    _people_keyed_by_identity,
    # Ollama serves OLLAMA_NUM_PARALLEL requests per loaded model and holds at most
    # OLLAMA_MAX_LOADED_MODELS; NULL where the engine has per-server slots only.
    (
        "ALTER TABLE backends ADD COLUMN parallel INTEGER CHECK (parallel IS NULL OR parallel > 0)",
        "ALTER TABLE backends ADD COLUMN max_loaded INTEGER CHECK (max_loaded IS NULL OR max_loaded > 0)",
    ),
    # What each running stream has delivered so far, written as it streams (once a second); a row
    # still here at start is a stream the daemon was killed in, and becomes its usage row.
    (
        "CREATE TABLE usage_open (request_id TEXT PRIMARY KEY, at REAL NOT NULL, user_id INTEGER NOT NULL,"
        " model TEXT NOT NULL, backend_id INTEGER, prompt_tokens INTEGER NOT NULL,"
        " completion_tokens INTEGER NOT NULL, gpu_seconds REAL NOT NULL, group_name TEXT NOT NULL)",
    ),
    _ROLLED_UP,
    # A key's label, so an admin tells a user's keys apart ("laptop", "open-webui") before revoking one.
    ("ALTER TABLE api_keys ADD COLUMN label TEXT NOT NULL DEFAULT ''",),
    # Key ids never come back: a revoked key's id was given to the next key made (SQLite reuses the
    # largest rowid without AUTOINCREMENT), so "key 3" in a log or an admin's note could be two keys.
    (
        "CREATE TABLE api_keys_new (id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " user_id INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE, hash TEXT NOT NULL UNIQUE,"
        " prefix TEXT NOT NULL, created REAL NOT NULL, last_used REAL, label TEXT NOT NULL DEFAULT '')",
        "INSERT INTO api_keys_new SELECT id, user_id, hash, prefix, created, last_used, label FROM api_keys",
        "DROP TABLE api_keys",
        "ALTER TABLE api_keys_new RENAME TO api_keys",
        "CREATE INDEX api_keys_user ON api_keys(user_id)",
    ),
    # mr model alias: one model served under different names by different engines (issue 31).
    ("CREATE TABLE model_aliases (name TEXT PRIMARY KEY, target TEXT NOT NULL)",),
    # Web UI sessions outlive a restart and a failover: the token's SHA-256, never the token (issue 33).
    # owner: the user's name, '' for the admin key's session.
    (
        "CREATE TABLE ui_sessions (id INTEGER PRIMARY KEY AUTOINCREMENT, hash TEXT NOT NULL UNIQUE,"
        " owner TEXT NOT NULL, admin INTEGER NOT NULL, key_hash TEXT NOT NULL, csrf TEXT NOT NULL,"
        " expires REAL NOT NULL)",
        "CREATE INDEX ui_sessions_owner ON ui_sessions(owner, id)",
        "CREATE INDEX ui_sessions_expires ON ui_sessions(expires)",
    ),
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
        with transaction(conn):
            if callable(step):
                step(conn)
            else:
                for statement in step:
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version + 1}")
    return found


_WRITING = threading.RLock()
"""Held through each write transaction of this process. The daemon's loop and its store worker
(``worker.py``) write the same file; SQLite's busy handler, were they to meet there, lets the loser
sleep 1, 2, 5, 10 ms... and try again (10-22 ms waits for the loop behind 2 ms deletes), while this
lock hands the write over the moment the other transaction ends. Reentrant: a transaction begun inside
another fails at its BEGIN, as it always did, rather than waiting for itself."""


@contextmanager
def transaction(db: sqlite3.Connection, *, wait: bool = True) -> Iterator[sqlite3.Connection]:
    """One write transaction on a connection in autocommit mode: all of it commits, or none.

    Raises:
        Busy: with ``wait`` False, another thread's transaction is under way (nothing was done).
    """
    if not _WRITING.acquire(blocking=wait):
        raise Busy("another write of this process is under way; try again when it ends")
    try:
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
    finally:
        _WRITING.release()
