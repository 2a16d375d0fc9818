"""Calendar periods in the server's local time: the days, weeks and months reports and quotas count in.

Usage reports and quotas both count "a day" and "a month" as the calendar on
the machine that runs the daemon (its ``TZ``), so an admin reading
`mr usage --by day` and a user refused for today's quota see the same day.
"""

from __future__ import annotations

import re
import time
from datetime import date, datetime, timedelta

__all__ = [
    "day_key",
    "day_start",
    "iso_local",
    "month_key",
    "month_start",
    "next_day",
    "next_month",
    "parse_when",
    "zone_label",
]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_AGO = re.compile(r"(\d+(?:\.\d+)?)([smhdw])\Z")


def _midnight(day: date) -> float:
    return datetime(day.year, day.month, day.day).timestamp()


def day_start(ts: float) -> float:
    """Local midnight at or before ``ts``."""
    return _midnight(datetime.fromtimestamp(ts).date())


def next_day(ts: float) -> float:
    """The local midnight after ``ts``: when today's quota resets."""
    return _midnight(datetime.fromtimestamp(ts).date() + timedelta(days=1))


def month_start(ts: float) -> float:
    """Local midnight of the first day of ``ts``'s month."""
    return _midnight(datetime.fromtimestamp(ts).date().replace(day=1))


def next_month(ts: float) -> float:
    """Local midnight of the first day of the month after ``ts``: when a monthly quota resets."""
    d = datetime.fromtimestamp(ts).date()
    return _midnight(date(d.year + d.month // 12, d.month % 12 + 1, 1))


def day_key(ts: float) -> str:
    """``2026-11-03``: the local date, as SQLite's ``date(at, 'unixepoch', 'localtime')`` writes it."""
    return time.strftime("%Y-%m-%d", time.localtime(ts))


def month_key(ts: float) -> str:
    return time.strftime("%Y-%m", time.localtime(ts))


class Periods:
    """``(day_key(ts), month_key(ts))``, remembered for the rest of ``ts``'s local day.

    The daemon's quota counters ask for both on every request; a day's keys are the same until
    its local midnight (``next_day``), so the zone is read once a day instead of four times a
    request. Only for a process whose zone does not change while it runs.
    """

    __slots__ = ("_end", "_keys", "_start")

    def __init__(self) -> None:
        self._start = self._end = 0.0
        self._keys = ("", "")

    def __call__(self, ts: float) -> tuple[str, str]:
        if not self._start <= ts < self._end:
            self._start, self._end, self._keys = day_start(ts), next_day(ts), (day_key(ts), month_key(ts))
        return self._keys


def iso_local(ts: float) -> str:
    """``2026-11-01T08:00:00+09:00``: a time in this machine's zone, offset included, so that a reader
    elsewhere (the CLI on another machine) shows the server's time and not its own."""
    return datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")


def zone_label(ts: float) -> str:
    """The local zone at ``ts``, such as ``CET, UTC+01:00``."""
    local = datetime.fromtimestamp(ts).astimezone()
    offset = local.strftime("%z")
    return f"{local.tzname()}, UTC{offset[:3]}:{offset[3:]}"


def parse_when(spec: str, now: float) -> float:
    """``7d`` (ago; units s, m, h, d, w), ``2026-11-01`` (local midnight) or ``2026-11-01T08:00`` (local).

    Raises:
        ValueError: naming the accepted forms.
    """
    text = spec.strip()
    ago = _AGO.match(text)
    if ago:
        return now - float(ago.group(1)) * _UNITS[ago.group(2)]
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{spec!r} is not a time; give an age such as 7d or 12h, a date such as 2026-11-01, "
            "or a local time such as 2026-11-01T08:00"
        ) from None
    return when.timestamp()  # a time without an offset is the server's local time
