"""Usage rows and decision records: the two append-only tables, pruned by age and by count."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from .rows import UsageRow, UsageTotal
from .validate import _decision_params


class Records:
    """The append-only half of ``Store``; it shares the store's connection and settings."""

    _PRUNE_USAGE_EVERY = 1024
    _PRUNE_USAGE_BATCH = 8192

    _db: sqlite3.Connection
    usage_retention: float
    max_decisions: int
    _decision_batch: int
    _decisions_below: int
    """Every decision id at or below this has been pruned."""
    _usage_inserts: int

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

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
