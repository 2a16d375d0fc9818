"""Decision records: an append-only table pruned by count, newest kept."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

from .schema import transaction
from .validate import _decision_params


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
        self._insert_decision(_decision_params(record, at))

    def add_decisions(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Store several records in one commit: the cheap way for a daemon that buffers them briefly."""
        params = [_decision_params(r, None) for r in records]  # all checked before any is written
        with transaction(self._db):
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
