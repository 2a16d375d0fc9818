"""Usage: one row per finished request, daily and monthly totals rolled up from them, and the reports.

Per-request rows are kept for ``usage_retention`` seconds (the fairness window
replays them after a restart; reports use them for partial days). Rows are
added to ``usage_daily`` and ``usage_monthly`` (local calendar) in batches:
before a report or a restart's quota count reads the totals, and before old
rows are deleted, so deleting them loses nothing a report needs and a
request's own commit writes its row alone. A report reads
monthly totals for whole months (unless grouped by day or week), daily totals
for the other whole days and per-request rows only for the partial days at
its ends.
Where those rows are already gone, the report widens to whole days and says so.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sqlite3
from collections.abc import Sequence
from typing import Any

from ..localtime import day_key, day_start, month_key, month_start, next_day, next_month
from ..reported import count
from .errors import Busy, InvalidValue
from .rows import UsageReport, UsageRow, UsageTotal
from .schema import ROLL_USAGE, ROLLED_KEY, transaction
from .worker import sorted_in_slices

log = logging.getLogger(__name__)

DIMENSIONS = ("user", "group", "model", "backend", "day", "week", "month")
"""What a report can group by; ``week`` starts on Monday and is named by that Monday's date."""

_DIMENSION_SQL = {
    "user": "user_id",
    "group": "group_name",
    "model": "model",
    "backend": "backend_id",
    "day": "day",
    "week": "date(day, '-6 days', 'weekday 1')",
    "month": "substr(day, 1, 7)",
}
_TIME_DIMENSIONS = ("day", "week", "month")

UsageArgs = tuple[Any, str, str, Any, int, int, float, float, str]
"""One usage row as ``record_usages`` takes it (``record_usage``'s arguments in order)."""
_PRUNED_KEY = "usage_pruned_through"
_COLUMNS = "(at, user_id, request_id, model, backend_id, prompt_tokens, completion_tokens, gpu_seconds, group_name)"
_INSERT = f"INSERT INTO usage {_COLUMNS} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
_OPEN = (
    f"INSERT INTO usage_open {_COLUMNS} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (request_id) DO UPDATE SET "
    + (", ".join(f"{c} = excluded.{c}" for c in _COLUMNS[1:-1].split(", ") if c != "request_id"))
)
"""What a running stream has delivered so far (one row per request, replaced as it grows)."""
_CLOSE_OPEN = "DELETE FROM usage_open WHERE request_id = ?"


def _seconds(value: Any) -> float:
    """A finite, non-negative number of seconds, else 0 (one bad row must not fail its batch)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return 0.0
    return float(value)


def _params(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """One usage row's SQL parameters, every count held to the core's token range (else 0, logged)."""
    uid, rid, model, bid, prompt, completion, at, gpu, group = row
    checked = [count(prompt), count(completion)]
    if None in checked:
        log.warning("usage row %s had token counts %r and %r; stored as 0 where out of range", rid, prompt, completion)
    return (_seconds(at), uid, rid, model, bid, checked[0] or 0, checked[1] or 0, _seconds(gpu), group)


def _roll(db: sqlite3.Connection) -> None:
    """Add the usage rows past the rolled-up mark to the daily and monthly totals (in the caller's transaction)."""
    mark = int(db.execute("SELECT value FROM meta WHERE key = ?", (ROLLED_KEY,)).fetchone()[0])
    top = db.execute("SELECT max(id) FROM usage").fetchone()[0]
    if top is None or top <= mark:
        return
    for sql in ROLL_USAGE:
        db.execute(sql, (mark, top))
    db.execute("UPDATE meta SET value = ? WHERE key = ?", (str(top), ROLLED_KEY))


class UsageLog:
    """The usage half of ``Store``; it shares the store's connection and settings."""

    _ROLL_USAGE_EVERY = 256
    """Rows between roll-ups into the daily and monthly totals: about 0.5 ms each, so no report waits long."""
    _PRUNE_USAGE_EVERY = 1024
    _PRUNE_USAGE_BATCH = 8192

    _db: sqlite3.Connection
    usage_retention: float
    prune_inline: bool
    _usage_inserts: int

    def record_usage(
        self,
        user_id: int,
        request_id: str,
        model: str,
        backend_id: int | None,
        prompt_tokens: int,
        completion_tokens: int,
        at: float,
        *,
        gpu_seconds: float = 0.0,
        group: str = "",
    ) -> None:
        """Record one finished request; durable once this returns.

        Args:
            at: wall-clock epoch seconds when it ended.
            gpu_seconds: how long it held a backend slot.
            group: the user's group when it ran (a group's report and quota count it).
        """
        self.record_usages(
            [(user_id, request_id, model, backend_id, prompt_tokens, completion_tokens, at, gpu_seconds, group)]
        )

    def record_usages(
        self,
        rows: Sequence[UsageArgs],
        *,
        streaming: Sequence[UsageArgs] = (),
        ended: Sequence[str] = (),
        wait: bool = True,
    ) -> None:
        """Record finished requests in one transaction (one commit for all); durable once this returns.

        Each row is ``record_usage``'s arguments in order: user id, request id, model, backend id,
        prompt and completion tokens, ``at``, GPU-seconds, group.

        Args:
            streaming: rows of streams still running, what each has delivered so far (replacing the
                last such row of that request); ``recover_open_usage`` makes them usage after a kill.
            ended: request ids whose streaming row is done with (their usage row is in ``rows``).
            wait: False: if another thread of this process is writing, raise ``Busy`` at once, nothing
                written (the event loop's writes: it tries again when that write ends).
        """
        if not (rows or streaming or ended):
            return
        params = [_params(row) for row in rows]
        writes = [
            *((_INSERT, one) for one in params),
            *((_CLOSE_OPEN, (rid,)) for rid in ended),
            *((_OPEN, _params(row)) for row in streaming),
        ]
        try:
            with transaction(self._db, wait=wait) as db:
                for sql, one in writes:
                    db.execute(sql, one)
        except (sqlite3.Error, OverflowError, ValueError, TypeError):  # one bad row: write the others one by one
            for sql, one in writes:
                try:
                    with transaction(self._db) as db:
                        db.execute(sql, one)
                except (sqlite3.Error, OverflowError, ValueError, TypeError) as exc:
                    log.error("could not store the usage row of request %s: %s", one[2 if len(one) > 2 else 0], exc)
        if not rows:
            return
        before, self._usage_inserts = self._usage_inserts, self._usage_inserts + len(rows)
        if before // self._ROLL_USAGE_EVERY != self._usage_inserts // self._ROLL_USAGE_EVERY:
            with contextlib.suppress(Busy):  # the next roll, or the next report, takes these rows too
                self.roll_usage(wait=wait)
        if self.prune_inline and before // self._PRUNE_USAGE_EVERY != self._usage_inserts // self._PRUNE_USAGE_EVERY:
            self.prune_usage(params[-1][0], limit=self._PRUNE_USAGE_BATCH)

    def roll_usage(self, *, wait: bool = True) -> None:
        """Bring the daily and monthly totals up to date with every usage row (reports do it first)."""
        with transaction(self._db, wait=wait) as db:
            _roll(db)

    def open_streams(self) -> dict[int, int]:
        """Streaming rows per backend id: the generations a leader that was cut may still have running."""
        return dict(
            self._db.execute(
                "SELECT backend_id, count(*) FROM usage_open WHERE backend_id IS NOT NULL GROUP BY backend_id"
            ).fetchall()
        )

    def recover_open_usage(self) -> int:
        """Turn the streaming rows left by a daemon that was killed into usage rows; returns how many."""
        with transaction(self._db) as db:
            moved = db.execute(f"INSERT INTO usage {_COLUMNS} SELECT {_COLUMNS[1:-1]} FROM usage_open").rowcount
            db.execute("DELETE FROM usage_open")
        return moved

    def recent_usage(self, since: float) -> list[UsageRow]:
        """Usage at or after ``since``, oldest first: what the daemon replays into the fairness window."""
        return [
            UsageRow(*r)
            for r in self._db.execute(
                "SELECT user_id, prompt_tokens, completion_tokens, at, model FROM usage WHERE at >= ? ORDER BY at",
                (since,),
            )
        ]

    def recent_requests(self, since: float) -> list[tuple[int, str, float]]:
        """(user id, group, ``at``) of each request that ended at or after ``since``, oldest first:
        what requests-per-minute quotas count again after a restart."""
        return self._db.execute(
            "SELECT user_id, group_name, at FROM usage WHERE at >= ? ORDER BY at", (since,)
        ).fetchall()

    def usage_totals(self, since: float) -> dict[int, UsageTotal]:
        """Requests and tokens per user id since ``since``."""
        rows = self._db.execute(
            "SELECT s.user_id, u.name, s.n, s.p, s.c FROM (SELECT user_id, count(*) AS n, sum(prompt_tokens) AS p,"
            " sum(completion_tokens) AS c FROM usage WHERE at >= ? GROUP BY user_id) s"
            " LEFT JOIN users u ON u.id = s.user_id",
            (since,),
        )
        return {r[0]: UsageTotal(*r) for r in rows}

    def daily_tokens(self, since: float) -> list[tuple[str, int, str, int]]:
        """(day, user id, group, tokens) from the local day of ``since`` on: what quotas count after a restart."""
        self.roll_usage()
        return self._db.execute(
            "SELECT day, user_id, group_name, sum(prompt_tokens + completion_tokens) FROM usage_daily"
            " WHERE day >= ? GROUP BY day, user_id, group_name ORDER BY day, user_id, group_name",
            (day_key(since),),
        ).fetchall()

    def prune_usage(self, now: float, *, limit: int | None = None) -> int:
        """Delete per-request rows older than ``usage_retention`` before ``now`` (at most ``limit``, oldest first).

        Their daily totals stay. Returns how many rows were deleted.
        """
        cutoff = now - self.usage_retention
        oldest = "SELECT id, at FROM usage WHERE at < ? ORDER BY at" + ("" if limit is None else " LIMIT ?")
        params = (cutoff,) if limit is None else (cutoff, limit)
        with transaction(self._db) as db:
            through = db.execute(f"SELECT max(at) FROM ({oldest}) AS o", params).fetchone()[0]
            if through is None:
                return 0
            _roll(db)
            deleted = db.execute(f"DELETE FROM usage WHERE id IN (SELECT id FROM ({oldest}) AS o)", params).rowcount
            # SQLite gives the next row the highest id left plus one: were the newest ids deleted, the
            # mark must come down with them, or rows given those ids again would never be rolled up.
            db.execute(
                "UPDATE meta SET value = CAST((SELECT coalesce(max(id), 0) FROM usage) AS TEXT) WHERE key = ?",
                (ROLLED_KEY,),
            )
            db.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = CASE"
                " WHEN CAST(excluded.value AS REAL) > CAST(meta.value AS REAL) THEN excluded.value ELSE meta.value END",
                (_PRUNED_KEY, repr(float(through))),
            )
        return deleted

    def _report_query(
        self, by: Sequence[str], since: float, until: float, user_id: int | None
    ) -> tuple[str, tuple[Any, ...]]:
        """The report's SQL: monthly totals for whole months, daily totals for the other whole days,
        per-request rows for the partial days at the ends."""
        tail = not self._db.execute("SELECT 1 FROM usage WHERE at >= ? LIMIT 1", (until,)).fetchone()
        # With nothing after ``until`` yet (a report up to now), its day's and month's totals are exact.
        day_from = since if since == day_start(since) else next_day(since)
        day_to = next_day(until) if tail and until > day_start(until) else day_start(until)
        raw: list[tuple[float, float]] = [(since, until)]
        days: list[tuple[str, str]] = []
        months: tuple[str, str] = ("", "")
        if day_from < day_to:
            raw = [(since, day_from), (day_to, max(day_to, until))]
            days = [(day_key(day_from), day_key(day_to))]
            month_from = since if since == month_start(since) else next_month(since)
            month_to = next_month(until) if tail and until > month_start(until) else month_start(until)
            if month_from < month_to and not {"day", "week"} & set(by):
                months = (month_key(month_from), month_key(month_to))
                days = [(day_key(day_from), day_key(month_from)), (day_key(month_to), day_key(day_to))]
        only = "" if user_id is None else " AND user_id = ?"
        who = () if user_id is None else (user_id,)
        sums = "requests AS n, prompt_tokens AS p, completion_tokens AS c, gpu_seconds AS g"
        monthly = f"SELECT month || '-01' AS day, user_id, group_name, model, backend_id, {sums} FROM usage_monthly"
        daily = f"SELECT day, user_id, group_name, model, backend_id, {sums} FROM usage_daily"
        per_request = (
            "SELECT date(at, 'unixepoch', 'localtime') AS day, user_id, group_name, model,"
            " coalesce(backend_id, 0) AS backend_id, 1 AS n, prompt_tokens AS p, completion_tokens AS c,"
            " gpu_seconds AS g FROM usage"
        )
        sources = [
            (f"{monthly} WHERE month >= ? AND month < ?{only}", (*months, *who)),
            *((f"{daily} WHERE day >= ? AND day < ?{only}", (*r, *who)) for r in days),
            *((f"{per_request} WHERE at >= ? AND at < ?{only}", (*r, *who)) for r in dict.fromkeys(raw)),
        ]
        sources = [(sql, ps) for sql, ps in sources if ps[0] < ps[1]] or sources[-1:]
        # Each source is summed on its own first (the daily totals grouped by day need no sort: their key
        # starts with the day), then the three partial sums are added up.
        keys = [f"d{i}" for i in range(len(by))]
        named = ", ".join([*(f"{_DIMENSION_SQL[d]} AS {k}" for d, k in zip(by, keys, strict=True)), ""])
        group = f" GROUP BY {', '.join(keys)}" if keys else ""
        parts = " UNION ALL ".join(
            f"SELECT {named}sum(n) AS n, sum(p) AS p, sum(c) AS c, sum(g) AS g FROM ({sql}) AS s{group}"
            for sql, _ in sources
        )
        sql = f"SELECT {', '.join([*keys, 'sum(n)', 'sum(p)', 'sum(c)', 'sum(g)'])} FROM ({parts}) AS t{group}"
        params = tuple(p for _, ps in sources for p in ps)
        return sql, params

    def _pruned_through(self) -> float | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (_PRUNED_KEY,)).fetchone()
        return None if row is None else float(row[0])

    def usage_report(self, by: Sequence[str], since: float, until: float, *, user_id: int | None = None) -> UsageReport:
        """Requests, tokens and GPU-seconds in ``[since, until)`` grouped by ``by`` (see ``DIMENSIONS``).

        With ``user_id``, only that user's usage.

        Days, weeks and months are the server's local calendar. Rows come sorted by time
        (when grouped by one), then by tokens, most first.

        Raises:
            InvalidValue: an unknown dimension, or ``until`` not after ``since``.
        """
        by = list(dict.fromkeys(by))
        unknown = [d for d in by if d not in DIMENSIONS]
        if unknown:
            raise InvalidValue(f"cannot group usage by {unknown[0]!r}; use any of {', '.join(DIMENSIONS)}")
        if until <= since:
            raise InvalidValue("the report's end must be after its start; check --since and --until")
        pruned = self._pruned_through()
        day_resolution_before = None
        if pruned is not None and since <= pruned:  # those rows are gone: whole days from the daily totals
            since = day_start(since)
            day_resolution_before = pruned
        if pruned is not None and until <= pruned and until != day_start(until):
            until = next_day(until)
        self.roll_usage()
        sql, params = self._report_query(by, since, until, user_id)
        users = dict(self._db.execute("SELECT id, name FROM users")) if "user" in by else {}
        backends = dict(self._db.execute("SELECT id, name FROM backends")) if "backend" in by else {}
        rows = []
        for r in self._db.execute(sql, params):
            if r[len(by)] is None:  # no usage at all: the ungrouped sums are NULL
                continue
            row: dict[str, Any] = {}
            for dim, value in zip(by, r, strict=False):
                if dim == "user":
                    value = users.get(value, f"#{value}")
                elif dim == "backend":
                    value = backends.get(value, f"#{value}") if value else "-"
                row[dim] = value
            row.update(requests=r[-4], prompt_tokens=r[-3], completion_tokens=r[-2], gpu_seconds=round(r[-1], 3))
            rows.append(row)
        # Keys of strings and ints, never lists: the rows and their keys are then no garbage collector's
        # business (30,000 rows' list keys set off 137 collections, each walking the heap with the GIL held).
        # NUL sorts before any other character, so joined keys sort as the lists of their parts.
        times = [d for d in by if d in _TIME_DIMENSIONS]
        others = [d for d in by if d not in _TIME_DIMENSIONS]
        rows = sorted_in_slices(rows, lambda row: "\0".join(str(row[d]) for d in others))
        rows = sorted_in_slices(rows, lambda row: -(row["prompt_tokens"] + row["completion_tokens"]))
        rows = sorted_in_slices(rows, lambda row: "\0".join(row[d] for d in times))
        total = {key: sum(row[key] for row in rows) for key in ("requests", "prompt_tokens", "completion_tokens")} | {
            "gpu_seconds": round(sum(row["gpu_seconds"] for row in rows), 3)
        }
        return UsageReport(list(by), rows, total, since, until, day_resolution_before)
