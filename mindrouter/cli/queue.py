"""``mr queue``: what waits right now, by user and model (the seed's queue statistics)."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..formats import fmt_duration, fmt_num, fmt_tokens
from ._app import ConfigOption, JsonOption, get_app
from ._fit import fitted
from ._output import Column, console, print_json, table

__all__ = ["queue_view", "register", "user_model_rows"]


def user_model_rows(queue: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of (user, model, queued, oldest wait), oldest first, from ``by_user_model``.

    The daemon sends ``by_user_model`` as ``{user: {model: count}}`` and, when it
    has them, the oldest wait of each pair in ``oldest_wait_by_user_model``
    (same nesting); a list of row objects is read as well.
    """
    pairs = queue.get("by_user_model")
    waits = queue.get("oldest_wait_by_user_model") or {}
    rows: list[dict[str, Any]] = []
    if isinstance(pairs, dict):
        for user, models in pairs.items():
            if not isinstance(models, dict):
                continue
            for model, count in models.items():
                wait = (waits.get(user) or {}).get(model) if isinstance(waits.get(user), dict) else None
                rows.append({"user": user, "model": model, "queued": count, "oldest_wait_seconds": wait})
    elif isinstance(pairs, list):
        rows = [dict(r) for r in pairs if isinstance(r, dict)]
    return sorted(
        rows,
        key=lambda r: (
            -float(r.get("oldest_wait_seconds") or 0),
            -float(r.get("queued") or 0),
            str(r.get("user")),
            str(r.get("model")),
        ),
    )


def queue_view(data: dict[str, Any]) -> Group:
    """The queue as people read it: totals, then by user and model, then fair-share state."""
    q = data.get("queue", {})
    fair = data.get("fair_share", {})
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("queued", fmt_num(q.get("total")))
    summary.add_row("running", fmt_num(q.get("running")))
    waiting = bool(q.get("total"))
    summary.add_row("average wait", fmt_duration(q.get("average_wait_seconds")) if waiting else "-")
    summary.add_row("oldest wait", fmt_duration(q.get("oldest_wait_seconds")) if waiting else "-")
    parts: list[Any] = [summary]
    pairs = user_model_rows(q)
    if pairs:
        parts.append(
            table(
                pairs,
                [
                    Column("user", "user", style="bold"),
                    Column("model", "model"),
                    Column("queued", "queued", fmt=fmt_num, justify="right"),
                    Column("oldest_wait_seconds", "oldest wait", fmt=fmt_duration, justify="right"),
                ],
                title="by user and model",
            )
        )
    else:
        by_user = q.get("by_user_name") or q.get("by_user") or {}
        parts.append(
            table(
                [{"user": k, "queued": v} for k, v in sorted(by_user.items(), key=lambda kv: -kv[1])],
                [Column("user", "user", style="bold"), Column("queued", "queued", fmt=fmt_num, justify="right")],
                title="by user",
                empty="nothing queued",
            )
        )
        by_model = q.get("by_model") or {}
        parts.append(
            table(
                [{"model": k, "queued": v} for k, v in sorted(by_model.items(), key=lambda kv: -kv[1])],
                [Column("model", "model", style="bold"), Column("queued", "queued", fmt=fmt_num, justify="right")],
                title="by model",
                empty="nothing queued",
            )
        )
    stats = fair.get("user_stats") or []
    if stats:
        parts.append(
            table(
                stats,
                [
                    Column("name", "user", getter=lambda r: r.get("name") or r.get("user_id"), style="bold"),
                    Column("group", "group"),
                    Column("weight", "weight", fmt=fmt_num, justify="right"),
                    Column("recent_tokens", "recent tokens", fmt=fmt_tokens, justify="right"),
                    Column("deficit", "deficit", fmt=lambda v: fmt_num(v, 0), justify="right"),
                ],
                title=(
                    f"fair share ({fmt_tokens(fair.get('global_recent_tokens'))} recent tokens, "
                    f"{fmt_num(fair.get('total_users'))} users)"
                ),
            )
        )
    spaced: list[Any] = []
    for part in parts:
        spaced += [part, Text()]
    return Group(*spaced[:-1])


def queue(ctx: typer.Context, json: JsonOption = False, config: ConfigOption = None) -> None:
    """Show the queue: totals and waits, queued requests by user and by model, and fair-share state.

    Example: mr queue --json
    """
    data = get_app(ctx, config).client.get("/admin/queue")
    if json:
        print_json(data)
        return
    out = console()
    out.print(*(fitted(part, out)[0] if isinstance(part, Table) else part for part in queue_view(data).renderables))


def register(app: typer.Typer) -> None:
    app.command("queue")(queue)
