"""Copy one store's whole state into another, empty one: SQLite to PostgreSQL (``mr store migrate``) and back.

Both ends are brought to the same schema first (opening a ``Store`` migrates it),
so every table is copied column for column with its ids, which usage rows and
decision records refer to. A user's ``owner_id`` names another user, so users go
in without it and get it once all are in. PostgreSQL's identity counters are then
moved past the copied ids, so no id is given twice.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from .db import Store
from .errors import InvalidValue

__all__ = ["copy_store"]

_FIRST = ("meta", "groups", "users", "api_keys", "backends")
"""Tables whose rows others refer to, in the order they go in; the rest follow by name."""
_BATCH = 5000
_OWN = ("mindrouter_", "sqlite_")
"""Tables that belong to one database's own machinery, not to the state."""


def _tables(db: sqlite3.Connection, postgres: bool) -> list[str]:
    sql = (
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        if postgres
        else "SELECT name FROM sqlite_master WHERE type = 'table'"
    )
    names = {r[0] for r in db.execute(sql) if not r[0].startswith(_OWN)}
    return [t for t in _FIRST if t in names] + sorted(names - set(_FIRST))


def _columns(db: sqlite3.Connection, table: str, postgres: bool) -> list[str]:
    sql = (
        "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()"
        " AND table_name = ? ORDER BY ordinal_position"
        if postgres
        else "SELECT name FROM pragma_table_info(?)"
    )
    return [r[0] for r in db.execute(sql, (table,))]


def copy_store(
    source: Store, target: Store, progress: Callable[[str, int], None] = lambda table, rows: None
) -> dict[str, int]:
    """Copy every row of ``source`` into ``target``, which must hold no groups, users, backends or usage yet.

    Returns the rows copied per table; ``progress`` hears of each table as it is done.

    Raises:
        InvalidValue: ``target`` is not empty.
    """
    src, dst = source._db, target._db
    counts: dict[str, int] = {}
    tables = _tables(src, bool(source.url))
    dst.execute("BEGIN IMMEDIATE")
    try:
        for table in ("groups", "users", "backends", "usage"):  # checked in the transaction that writes
            if dst.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone():
                raise InvalidValue(
                    f"the target database already has {table}; copy into an empty database (create a new one) "
                    "so that nothing in it is overwritten"
                )
        missing = set(tables) - set(_tables(dst, bool(target.url)))
        if missing:
            raise InvalidValue(f"the target database lacks the table {sorted(missing)[0]!r}; upgrade mindrouter there")
        for table in tables:
            columns = _columns(src, table, bool(source.url))
            counts[table] = _copy_table(src, dst, table, columns)
            progress(table, counts[table])
        owners = src.execute("SELECT id, owner_id FROM users WHERE owner_id IS NOT NULL").fetchall()
        dst.executemany("UPDATE users SET owner_id = ? WHERE id = ?", [(owner, uid) for uid, owner in owners])
        given = _ids_given(src, bool(source.url))
        if target.url:  # every identity counter moves past the copied ids
            given = {t: given.get(t, 0) for t in tables if "id" in _columns(dst, t, True)}
        _carry_ids(given, dst, bool(target.url))
    except BaseException:
        dst.execute("ROLLBACK")
        raise
    dst.execute("COMMIT")
    return counts


def _ids_given(db: sqlite3.Connection, postgres: bool) -> dict[str, int]:
    """The highest id each table has given (a removed row's too): AUTOINCREMENT's or the identity's counter."""
    sql = (
        "SELECT substr(sequencename, 1, length(sequencename) - 7), coalesce(last_value, 0) FROM pg_sequences"
        " WHERE schemaname = current_schema() AND sequencename LIKE '%_id_seq'"
        if postgres
        else "SELECT name, seq FROM sqlite_sequence"
    )
    return {table: int(seq) for table, seq in db.execute(sql)}


def _carry_ids(given: dict[str, int], dst: sqlite3.Connection, postgres: bool) -> None:
    """Let the target give no id the source has given, so old usage rows never name a new user."""
    for table, seq in given.items():
        if postgres:
            dst.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), greatest(coalesce(max(id), 0), ?, 1))"
                f" FROM {table}",
                (seq,),
            )
        elif not dst.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?", (seq, table)).rowcount:
            dst.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table, seq))


def _copy_table(src: sqlite3.Connection, dst: sqlite3.Connection, table: str, columns: list[str]) -> int:
    names = ", ".join(columns)
    if table == "meta":  # the target's own migrations wrote some keys: the source's values win
        insert = "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
    else:
        placeholders = ", ".join("NULL" if (table, c) == ("users", "owner_id") else "?" for c in columns)
        insert = f"INSERT INTO {table} ({names}) VALUES ({placeholders})"
    picked = [c for c in columns if (table, c) != ("users", "owner_id")]
    cursor = src.execute(f"SELECT {', '.join(picked)} FROM {table}")
    copied = 0
    while True:
        rows = cursor.fetchmany(_BATCH)
        if not rows:
            return copied
        dst.executemany(insert, rows)
        copied += len(rows)
