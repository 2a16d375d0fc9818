"""The store on PostgreSQL: a psycopg connection that speaks the part of ``sqlite3``'s DB-API the store uses.

Statements are translated by ``dialect.py``. psycopg's errors surface as ``sqlite3``'s
(``IntegrityError`` for a broken constraint, else ``OperationalError``), so the store
handles one family of errors whichever database it is on.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, cast

from .dialect import local_zone, translate
from .errors import StoreError
from .schema import migrate

__all__ = ["PgConnection", "connect", "fence"]


def fence(conn: sqlite3.Connection, epoch: int) -> None:
    """``PgConnection.fence`` on a connection typed as sqlite3's (see ``connect``)."""
    cast(PgConnection, conn).fence(epoch)


def _sqlite_error(exc: Exception) -> sqlite3.Error:
    import psycopg

    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, psycopg.errors.IntegrityError):
        return sqlite3.IntegrityError(message)
    return sqlite3.OperationalError(message)


class _Cursor:
    """What ``execute`` returns: rows to fetch or iterate, ``rowcount``, and ``lastrowid`` on demand.

    A write inside a transaction is sent later (``PgConnection``): its cursor gets its result then,
    or at once when its ``rowcount`` is asked for."""

    def __init__(self, conn: PgConnection, cursor: Any, *, pending: bool = False) -> None:
        self._conn = conn
        self._cursor = cursor
        self._pending = pending

    @property
    def rowcount(self) -> int:
        if self._pending:
            self._conn._send_pending()
        return -1 if self._cursor is None else int(self._cursor.rowcount)

    @property
    def lastrowid(self) -> int:
        return int(self._conn.execute("SELECT last_insert_rowid()").fetchone()[0])

    def fetchone(self) -> Any:
        return None if self._cursor is None or self._cursor.description is None else self._cursor.fetchone()

    def fetchmany(self, size: int) -> list[Any]:
        return [] if self._cursor is None or self._cursor.description is None else self._cursor.fetchmany(size)

    def fetchall(self) -> list[Any]:
        return [] if self._cursor is None or self._cursor.description is None else self._cursor.fetchall()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())


_WRITES = ("INSERT", "UPDATE", "DELETE")
_ROWS = re.compile(r"(INSERT INTO .*? VALUES )(\([^()]*\))", re.DOTALL)
_MAX_PARAMS = 30_000
"""Parameters one fused INSERT may carry (PostgreSQL's limit is 65,535)."""
_WRITE_LOCK = 0x6D72_0003
_BEGIN = f"BEGIN; SELECT pg_advisory_xact_lock({_WRITE_LOCK})"
"""A transaction of more than one statement, as SQLite's BEGIN IMMEDIATE: one writer at a time, across
routers too (a standby's report rolls the usage totals up as the leader does). One round trip."""
_Write = tuple[str, Any, bool, _Cursor]
"""A write held back: statement, parameters (a list of rows when ``many``), many, its cursor."""


def _rows_of(write: _Write) -> list[Any]:
    return list(write[1]) if write[2] else [write[1]]


def _many_rows(query: str, count: int) -> str:
    """``INSERT ... VALUES (?, ?)`` made to insert ``count`` rows at once."""
    match = _ROWS.match(query)
    assert match is not None
    return f"{match[1]}{', '.join([match[2]] * count)}{query[match.end() :]}"


def _merged(held: list[_Write]) -> list[tuple[str, Any, bool, list[_Cursor]]]:
    """The held writes as statements to send: runs of one plain INSERT (no ON CONFLICT) become one
    multi-row INSERT (one statement per 30,000 parameters); each statement with the cursors it answers."""
    out: list[tuple[str, Any, bool, list[_Cursor]]] = []
    run: list[_Write] = []

    def close_run() -> None:
        rows = [row for write in run for row in _rows_of(write)]
        per = max(1, _MAX_PARAMS // max(1, len(rows[0]))) if rows else 1
        for start in range(0, len(rows), per):
            chunk = rows[start : start + per]
            out.append((_many_rows(run[0][0], len(chunk)), [p for row in chunk for p in row], False, []))
        if out:
            out[-1][3].extend(write[3] for write in run)
        run.clear()

    for write in held:
        plain = (match := _ROWS.match(write[0])) is not None and not write[0][match.end() :].strip()
        if run and not (plain and write[0] == run[0][0]):
            close_run()
        if plain and _rows_of(write):
            run.append(write)
        else:
            out.append((write[0], write[1], write[2], [write[3]]))
    if run:
        close_run()
    return out


class PgConnection:
    """One psycopg connection in autocommit mode, as sqlite3's; the store BEGINs its own transactions.

    Each statement costs a round trip and about 25 µs of Python in psycopg, so a transaction's
    writes are held until something needs them: at COMMIT a lone write is sent alone (one statement
    is atomic by itself: no BEGIN or COMMIT), several in one transaction; a read, or a
    write's ``rowcount``, sends BEGIN and what is held first. An INSERT of many rows followed by
    ``last_insert_rowid()`` (the decision records) is one statement, ``WITH ... RETURNING``. A
    request's usage and decision commits thus cost two statements rather than seven.
    """

    def __init__(self, conn: Any, reopen: Callable[[], Any]) -> None:
        self._conn = conn
        self._reopen = reopen
        """A new session, for when the server ended this one (a restart, a failover of the database)."""
        self._epoch: str | None = None
        self._held: list[_Write] | None = None
        """Writes of the open transaction not yet sent; None outside a transaction or once BEGIN went out."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Cursor:
        query = translate(sql)
        if not query:
            return _Cursor(self, None)
        if query == "BEGIN":
            self._held = []
            return _Cursor(self, None)
        try:
            if self._held is not None:
                if query == "COMMIT":
                    self._commit_held()
                    return _Cursor(self, None)
                if query == "ROLLBACK":
                    self._held = None
                    return _Cursor(self, None)
                if query.startswith(_WRITES):
                    cursor = _Cursor(self, None, pending=True)
                    self._held.append((query, tuple(params), False, cursor))
                    return cursor
                if query == "SELECT lastval()" and self._fusible():
                    return self._insert_returning()
                self._send_pending()
            return _Cursor(self, self._conn.execute(query, tuple(params) or None))
        except Exception as exc:
            raise self._mapped(exc) from exc

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> _Cursor:
        query = translate(sql)
        rows = [tuple(r) for r in rows]
        if self._held is not None:
            cursor = _Cursor(self, None, pending=True)
            self._held.append((query, rows, True, cursor))
            return cursor
        try:
            return self._send(query, rows, True)
        except Exception as exc:
            raise self._mapped(exc) from exc

    def _send(self, query: str, params: Any, many: bool) -> _Cursor:
        if not many:
            return _Cursor(self, self._conn.execute(query, params or None))
        with self._conn.cursor() as cursor:
            cursor.executemany(query, params)
            return _Cursor(self, cursor)

    def _send_pending(self) -> None:
        """Open the transaction for real: BEGIN, then the writes held so far (their cursors get results)."""
        held, self._held = self._held, None
        if held is None:
            return
        self._conn.execute(_BEGIN)
        self._send_all(_merged(held))

    def _send_all(self, statements: list[tuple[str, Any, bool, list[_Cursor]]]) -> None:
        for query, params, many, cursors in statements:
            sent = self._send(query, params, many)._cursor
            for cursor in cursors:
                cursor._cursor, cursor._pending = sent, False

    def _commit_held(self) -> None:
        held, self._held = self._held or [], None
        statements = _merged(held)
        if len(statements) == 1 and not statements[0][2]:  # one statement is a transaction of its own
            self._send_all(statements)
            return
        if not statements:
            return
        try:
            self._conn.execute(_BEGIN)
            self._send_all(statements)
            self._conn.execute("COMMIT")
        except Exception:
            with contextlib.suppress(Exception):
                self._conn.execute("ROLLBACK")
            raise

    def _fusible(self) -> bool:
        if self._held is None or len(self._held) != 1:
            return False
        query, params, many, _ = self._held[0]
        rows = params if many else [params]
        return bool(rows) and _ROWS.match(query) is not None and len(rows) * len(rows[0]) <= _MAX_PARAMS

    def _insert_returning(self) -> _Cursor:
        """The one held INSERT as one statement that answers its last id (``last_insert_rowid()``)."""
        assert self._held is not None
        query, params, many, cursor = self._held[0]
        self._held = []
        rows = params if many else [params]
        fused = f"WITH added AS ({_many_rows(query, len(rows))} RETURNING id) SELECT max(id) FROM added"
        cursor._pending = False
        return _Cursor(self, self._conn.execute(fused, [p for row in rows for p in row]))

    def fence(self, epoch: int) -> None:
        """Lead in ``epoch``: from now on the server refuses this session's writes once a later epoch exists."""
        self._epoch = str(epoch)
        self._conn.execute("SELECT set_config('mindrouter.epoch', %s, false)", (self._epoch,))

    def _mapped(self, exc: Exception) -> Exception:
        """The error as sqlite3's; a session the server ended is replaced for the next call (this one fails)."""
        import psycopg

        if self._conn.broken:
            self._held = None
            with contextlib.suppress(StoreError, psycopg.Error):
                self._conn = self._reopen()
                if self._epoch is not None:
                    self.fence(int(self._epoch))
        return _sqlite_error(exc) if isinstance(exc, psycopg.Error) else exc

    @property
    def raw(self) -> Any:
        """The psycopg connection itself (leader election and notifications use it)."""
        return self._conn

    def close(self) -> None:
        self._conn.close()


_SETUP = (
    "CREATE TABLE IF NOT EXISTS mindrouter_schema (one BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),"
    " version BIGINT NOT NULL)",
    "INSERT INTO mindrouter_schema (version) VALUES (0) ON CONFLICT DO NOTHING",
    "DO $$ BEGIN CREATE COLLATION nocase (provider = icu, locale = 'und-u-ks-level2', deterministic = false);"
    " EXCEPTION WHEN duplicate_object THEN NULL; END $$",
)
_NOTIFY = (
    "CREATE OR REPLACE FUNCTION mindrouter_notify() RETURNS trigger LANGUAGE plpgsql AS"
    " $$ BEGIN PERFORM pg_notify('mindrouter_changes', TG_TABLE_NAME); RETURN NULL; END $$",
    *(
        f"CREATE OR REPLACE TRIGGER mindrouter_notify AFTER {events} ON {table}"
        " FOR EACH STATEMENT EXECUTE FUNCTION mindrouter_notify()"
        for table, events in (
            ("groups", "INSERT OR UPDATE OR DELETE"),
            ("users", "INSERT OR UPDATE OR DELETE"),
            ("backends", "INSERT OR UPDATE OR DELETE"),
            ("api_keys", "INSERT OR DELETE"),  # not a key's last use
            ("model_aliases", "INSERT OR UPDATE OR DELETE"),
        )
    ),
    "CREATE TABLE IF NOT EXISTS mindrouter_leader (one BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),"
    " epoch BIGINT NOT NULL)",
    "INSERT INTO mindrouter_leader (epoch) VALUES (0) ON CONFLICT DO NOTHING",
    "ALTER TABLE mindrouter_leader ADD COLUMN IF NOT EXISTS leader TEXT NOT NULL DEFAULT ''",
)
"""After the migrations: change notices for the routers' memory, and the leader epoch (daemon/pollers/leader.py)."""
_FENCE = (
    # A statement trigger on every table: a session that leads (mindrouter.epoch set) may write only while
    # its epoch is the latest. A new leader raises the epoch before it writes, and a leader that resumes
    # after a freeze does so after that raise, so each of its statements sees it and fails.
    "CREATE OR REPLACE FUNCTION mindrouter_fence() RETURNS trigger LANGUAGE plpgsql AS $$"
    " DECLARE mine text := current_setting('mindrouter.epoch', true); latest bigint; BEGIN"
    " IF coalesce(mine, '') <> '' THEN SELECT epoch INTO latest FROM mindrouter_leader;"
    " IF latest <> mine::bigint THEN RAISE EXCEPTION 'this router''s leadership (epoch %) has passed to another"
    " (epoch %); it writes nothing more', mine, latest; END IF; END IF; RETURN NULL; END $$"
)
_STATE_TABLES = (
    "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
    " AND table_type = 'BASE TABLE' AND table_name NOT LIKE 'mindrouter%'"
)
_SETUP_LOCK = 0x6D72_0001
"""The advisory lock two routers starting at once take around the schema's setup and migrations."""


def _numeric_as_number(conn: Any) -> None:
    """``sum()`` of BIGINTs is NUMERIC: read it as an int (a float if fractional), as SQLite gives it."""
    from psycopg.adapt import Loader

    class _Number(Loader):
        def load(self, data: Any) -> int | float:
            text = bytes(data).decode()
            return float(text) if "." in text or "e" in text.lower() or text == "NaN" else int(text)

    conn.adapters.register_loader("numeric", _Number)


def connect(url: str, *, application: str = "mindrouter") -> sqlite3.Connection:
    """A connection to the database at ``url``, its schema migrated; typed as sqlite3's, which it stands in for.

    Routers starting at once take turns (an advisory lock), so each migration step runs once.

    Raises:
        StoreError: psycopg is not installed, or the database cannot be reached.
    """
    try:
        import psycopg
    except ImportError:
        raise StoreError(
            "[store] url names PostgreSQL but psycopg is not installed; install mindrouter[postgres]"
        ) from None

    def session() -> Any:
        try:
            raw = psycopg.connect(url, autocommit=True, application_name=application)
        except psycopg.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreError(
                f"cannot reach the PostgreSQL database of [store] url ({first}); "
                "check that it runs and the url is right"
            ) from None
        _numeric_as_number(raw)
        raw.execute("SELECT set_config('TimeZone', %s, false)", (local_zone(),))
        # A leader frozen inside a transaction would hold its row locks, and a new leader's writes with them.
        raw.execute("SET idle_in_transaction_session_timeout = '3s'")
        return raw

    raw = session()
    conn = cast(sqlite3.Connection, PgConnection(raw, session))
    raw.execute("SELECT pg_advisory_lock(%s)", (_SETUP_LOCK,))
    try:
        for statement in _SETUP:
            raw.execute(statement)
        migrate(conn)
        for statement in _NOTIFY:
            raw.execute(statement)
        raw.execute(_FENCE)
        for (table,) in raw.execute(_STATE_TABLES).fetchall():
            raw.execute(
                f"CREATE OR REPLACE TRIGGER mindrouter_fence BEFORE INSERT OR UPDATE OR DELETE ON {table}"
                " FOR EACH STATEMENT EXECUTE FUNCTION mindrouter_fence()"
            )
    finally:
        raw.execute("SELECT pg_advisory_unlock(%s)", (_SETUP_LOCK,))
    return conn
