"""``mr usage`` and the ``set-quota`` commands: who used what, and how much each may use.

Reports come from the daemon (``GET /admin/usage``), which sums in SQLite and
counts days, weeks and months in the server's local time; the table says
which zone that is.
"""

from __future__ import annotations

import csv
import sys
import time
from collections.abc import Mapping
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from ..errors import UsageError
from ..formats import fmt_duration, fmt_num, fmt_tokens
from ..store import DIMENSIONS, QUOTA_FIELDS
from . import _validate
from ._app import ConfigOption, JsonOption, get_app
from ._client import quote_name
from ._fit import fitted
from ._output import Column, console, print_changed, print_json, print_table, table

__all__ = ["quota_text", "register", "set_quota"]

_SUMS = ("requests", "prompt_tokens", "completion_tokens", "gpu_seconds", "service_units")
_SHORT = {"tokens_per_day": "day", "tokens_per_month": "month", "requests_per_minute": "req/min"}


def quota_text(limits: list[dict[str, Any]] | None) -> str:
    """``1.2M/2M day`` for each quota, or "-" for none: what user, group and share tables show."""
    if not limits:
        return "-"
    return ", ".join(f"{fmt_tokens(q['used'])}/{fmt_tokens(q['limit'])} {_SHORT[q['kind']]}" for q in limits)


def _columns(by: list[str]) -> list[Column]:
    columns = [Column(d, d, style="bold" if i == 0 else None) for i, d in enumerate(by)]
    return [
        *columns,
        Column("requests", "requests", fmt=fmt_num, justify="right"),
        Column("prompt_tokens", "prompt tokens", fmt=fmt_tokens, justify="right"),
        Column("completion_tokens", "completion tokens", fmt=fmt_tokens, justify="right"),
        Column("gpu_seconds", "GPU time", fmt=_gpu_time, justify="right"),
        Column("service_units", "service units", fmt=fmt_tokens, justify="right"),
    ]


def _gpu_time(seconds: Any) -> str:
    """GPU time as people read it: 850ms, 3m 05s, up to hours (``1,234.5 h``) for a month of a lab."""
    hours = float(seconds or 0) / 3600
    return f"{hours:,.1f} h" if hours >= 10 else fmt_duration(seconds or 0)


def _server_time(data: Mapping[str, Any], name: str) -> str:
    """``2026-11-01 08:00`` in the server's zone (its ISO ``NAME_at``), which the report names; not the CLI's."""
    iso = data.get(f"{name}_at")
    if isinstance(iso, str) and len(iso) >= 16:
        return iso[:16].replace("T", " ")
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(float(data[name])))  # an older daemon: epoch seconds only


def usage(
    ctx: typer.Context,
    by: Annotated[
        str,
        typer.Option(
            "--by", metavar="DIMS", help=f"Group by any of {', '.join(DIMENSIONS)}, comma-separated (day|week|month)."
        ),
    ] = "user",
    since: Annotated[
        str, typer.Option("--since", metavar="WHEN", help="Start: an age (7d, 12h) or a date (2026-11-01).")
    ] = "30d",
    until: Annotated[
        str | None,
        typer.Option("--until", metavar="WHEN", help="End, not included: an age or a date. Defaults to now."),
    ] = None,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV (a header, then one line per row).")] = False,
    json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Show requests, tokens and GPU time, grouped and totalled, like Slurm's sreport.

    Days, weeks (from Monday) and months are the server's local calendar.
    GPU time is how long requests held a backend slot. Service units are the
    tokens at the [scheduler] prompt_token_cost and completion_token_cost in
    effect now: what fair share counts (quotas count tokens).

    Example: mr usage --by group,model --since 2026-11-01 --until 2026-12-01 --csv
    """
    dims = [d.strip() for d in by.split(",") if d.strip()]
    unknown = [d for d in dims if d not in DIMENSIONS]
    if unknown or not dims:
        raise UsageError(f"--by {by!r} is not known; use any of {', '.join(DIMENSIONS)}, such as --by user,model")
    query = {"by": ",".join(dims), "since": _validate.when(since, "--since")}
    if until is not None:
        query["until"] = _validate.when(until, "--until")
    data = get_app(ctx, config).client.get("/admin/usage", **query)
    rows = data.get("rows") or []
    if json:
        print_json(rows)
        return
    if as_csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow([*dims, *_SUMS])
        for row in rows:
            writer.writerow([row.get(k) for k in (*dims, *_SUMS)])
        return
    title = (
        f"usage from {_server_time(data, 'since')} to {_server_time(data, 'until')}"
        f" (server time, {data.get('timezone')})"
    )
    t = table(rows, _columns(dims), empty="no usage in this period")
    if rows:
        t.show_footer = True
        t.columns[0].footer = Text("total", style="bold")
        for column, key in zip(t.columns[len(dims) :], _SUMS, strict=True):
            total = (data.get("total") or {}).get(key)
            column.footer = (
                _gpu_time(total) if key == "gpu_seconds" else fmt_num(total) if key == "requests" else fmt_tokens(total)
            )
    out = console()
    out.print(Text(title, style="bold"))
    out.print(fitted(t, out)[0])
    if data.get("day_resolution_before"):
        out.print(
            f"[dim]before {_server_time(data, 'day_resolution_before')} only daily totals are kept "
            "(\\[server] usage_retention_days), so the start is rounded to the day[/]"
        )
    quotas = data.get("quotas") or []
    if quotas:
        print_table(table(quotas, _QUOTA_COLUMNS, title="quotas"))


_QUOTA_COLUMNS = [
    Column("name", "who", getter=lambda q: f"{q['subject']} {q['name']}", style="bold"),
    Column("kind", "quota", fmt=lambda k: _SHORT.get(k, k)),
    Column("used", "used", fmt=fmt_tokens, justify="right"),
    Column("limit", "limit", fmt=fmt_tokens, justify="right"),
    Column(
        "used",
        "%",
        getter=lambda q: q["used"] / q["limit"] if q["limit"] else 1.0,
        fmt=lambda f: f"{f:.0%}",
        justify="right",
    ),
    Column("resets", "resets", getter=lambda q: _server_time(q, "resets")),
]


def set_quota(
    ctx: typer.Context, subject: str, name: str, limits: dict[str, str | None], clear: bool, json: bool, config: Any
) -> None:
    """``mr user set-quota`` / ``mr group set-quota``: send the given limits, or clear them all."""
    given = {f: _validate.amount(v, "--" + f.replace("_", "-")) for f, v in limits.items() if v is not None}
    if clear and given:
        raise UsageError("give limits or --clear, not both")
    if not clear and not given:
        raise UsageError(
            f"give at least one limit, such as `mr {subject} set-quota {name} --tokens-per-day 2M`, or --clear"
        )
    body: dict[str, Any] = {"clear": True} if clear else given
    row = get_app(ctx, config).client.put(f"/admin/{subject}s/{quote_name(name)}/quota", body)
    shown = ", ".join(f"{_SHORT[f]} {fmt_tokens(row.get(f))}" for f in QUOTA_FIELDS if row.get(f) is not None)
    print_changed(
        row, json, f"{subject} [bold]{escape(name)}[/] now has " + (f"quotas {shown}" if shown else "no quota")
    )


TokensPerDay = Annotated[
    str | None,
    typer.Option("--tokens-per-day", metavar="N", help="Tokens a day (such as 2M); resets at local midnight."),
]
TokensPerMonth = Annotated[
    str | None, typer.Option("--tokens-per-month", metavar="N", help="Tokens a month (such as 50M); resets on the 1st.")
]
RequestsPerMinute = Annotated[
    str | None, typer.Option("--requests-per-minute", metavar="N", help="Requests in any 60 seconds.")
]
ClearOption = Annotated[bool, typer.Option("--clear", help="Remove every limit.")]


def register(app: typer.Typer) -> None:
    app.command("usage")(usage)
