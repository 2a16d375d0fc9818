"""Decision records: an append-only table, pruned by age (``prune_decisions``) and, where set, by count."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .schema import transaction
from .validate import DecisionRow, decision_row

_FILTERABLE = ("model", "selected_backend", "outcome")
"""The decision record's fields a listing may be narrowed by (the web UI's Decisions filters)."""
_INSERT = "INSERT INTO decisions (request_id, user, at, record) VALUES (?, ?, ?, ?)"


class Decisions:
    """The decision-record half of ``Store``; it shares the store's connection and settings."""

    _db: sqlite3.Connection
    max_decisions: int
    _decision_batch: int
    _decisions_below: int
    """Every decision id at or below this has been pruned."""

    def add_decision(self, record: Mapping[str, Any], *, at: float | None = None) -> None:
        """Store a decision record (it needs a ``request_id``); the oldest are pruned past ``max_decisions``.

        The user comes from ``record["user"]``; the time from ``at``, else ``record["wall_time"]``.
        """
        self._insert_decision(decision_row(record, at=at))

    def add_decisions(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Store several records in one commit: the cheap way for a daemon that buffers them briefly."""
        self.add_decision_rows([decision_row(r) for r in records])  # all checked before any is written

    def add_decision_rows(self, rows: Sequence[DecisionRow]) -> None:
        """Store records already checked and encoded by ``decision_row``, in one commit.

        The daemon encodes its records a few at a time between requests (the JSON costs more
        than the insert), then writes them here at once.
        """
        if not rows:
            return
        with transaction(self._db) as db:
            db.executemany(_INSERT, rows)
            self._prune_decisions(db.execute("SELECT last_insert_rowid()").fetchone()[0])

    def _insert_decision(self, params: DecisionRow) -> None:
        cur = self._db.execute(_INSERT, params)
        self._prune_decisions(cur.lastrowid)  # type: ignore[arg-type]

    def _prune_decisions(self, last_id: int) -> None:
        if not self.max_decisions:
            return
        cutoff = last_id - self.max_decisions
        if cutoff - self._decisions_below >= self._decision_batch:
            self._db.execute("DELETE FROM decisions WHERE id <= ?", (cutoff,))
            self._decisions_below = cutoff

    def prune_decisions(self, before: float, *, limit: int) -> int:
        """Delete up to ``limit`` of the oldest records made before ``before``; returns how many.

        Ids follow time, so the oldest are the first ``limit`` ids: a range of the primary key, read and
        deleted without a scan or an index on the time.
        """
        with transaction(self._db) as db:
            return db.execute(
                "DELETE FROM decisions WHERE id IN (SELECT id FROM decisions ORDER BY id LIMIT ?)"
                " AND coalesce(at, 0) < ?",
                (limit, before),
            ).rowcount

    def recent_decisions(
        self, limit: int = 100, user: str | None = None, fields: Mapping[str, str] | None = None, searched: int = 0
    ) -> list[dict[str, Any]]:
        """The newest ``limit`` records (of ``user``, if given), oldest first.

        ``fields``: only records whose top-level field (``model``, ``selected_backend``, ``outcome``) has that
        value, among the newest ``searched`` records (of ``user``); matched in SQLite, so only the records
        shown are decoded.
        """
        where: list[str] = []
        params: list[Any] = []
        if fields and searched:  # the window: from the ``searched``-th newest record (of ``user``) on
            among = "SELECT id FROM decisions" + (" WHERE user = ?" if user is not None else "")
            where.append(f"id >= (SELECT min(id) FROM ({among} ORDER BY id DESC LIMIT ?) AS newest)")
            params += [*([user] if user is not None else []), searched]
        if user is not None:
            where.append("user = ?")
            params.append(user)
        for key, value in (fields or {}).items():
            if key not in _FILTERABLE:
                raise ValueError(f"cannot filter decisions by {key!r}")
            if value.isascii():  # its JSON text looked for first, so only the records that may match are parsed
                where.append("instr(record, ?) > 0")
                params.append(json.dumps(value))
            where.append(f"json_extract(record, '$.{key}') = ?")
            params.append(value)
        sql = "SELECT record FROM decisions" + (" WHERE " + " AND ".join(where) if where else "")
        rows = self._db.execute(sql + " ORDER BY id DESC LIMIT ?", (*params, max(0, limit)))
        return [json.loads(r[0]) for r in rows][::-1]

    def get_decision(self, request_id: str) -> dict[str, Any] | None:
        """The newest record for ``request_id`` (a retried request has one per attempt), or None."""
        row = self._db.execute(
            "SELECT record FROM decisions WHERE request_id = ? ORDER BY id DESC LIMIT 1", (request_id,)
        ).fetchone()
        return None if row is None else json.loads(row[0])
