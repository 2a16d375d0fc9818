"""``mr why REQUEST_ID``: explain one routing decision, like Slurm's ``sprio``.

Two halves, both read from the daemon's decision record: the job's priority
terms at the moment it was picked (why it went before others), and every
backend's score term by term or the reasons it was refused (why it went
where it went). Backend ids are turned into names with ``/admin/backends``;
a backend removed since then keeps its id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.text import Text

from ..errors import RequestError
from ..explain import PRIORITY_TERMS, RECENT_TERMS, SCORE_TERMS, ended, lost_by
from ..formats import fmt_duration, fmt_num, fmt_time, fmt_tokens
from ._app import ConfigOption, JsonOption, get_app
from ._client import quote_name
from ._fit import Fitted
from ._output import console, print_json, titled_table

__all__ = ["register", "why_view"]


def _names(backends: list[Mapping[str, Any]]) -> dict[str, str]:
    return {str(b.get("id")): str(b.get("name")) for b in backends if b.get("id") is not None}


#: The candidates' columns a narrow terminal hides first, after those that are 0 or n/a for every backend.
_DROP = ("streams", "tok/s", "penalty", "priority", "scarce", "delay", "evict", "cached tok", "prefill", "decode")


def _header(header: str) -> str:
    """A term's column header without its unit: the title says the times are seconds."""
    return header.removesuffix(" s")


def _says(value: Any) -> bool:
    """Whether a term's value tells something: not missing, not 0."""
    return value is not None and value != 0


def why_view(record: Mapping[str, Any], names: Mapping[str, str]) -> Group:
    """The explanation of one decision record as a rich renderable."""
    chosen = str(record.get("selected_backend_id"))

    def label(bid: str) -> str:
        return names.get(bid) or (
            str(record.get("selected_backend")) if bid == chosen and record.get("selected_backend") else f"#{bid}"
        )

    user = str(record.get("user") or record.get("user_id") or "n/a")
    group = record.get("user_group")
    head = Text()
    head.append(f"request {record.get('request_id')}", style="bold")
    head.append(f": {user}" + (f" ({group})" if group else "") + f" asked for {record.get('model', 'n/a')}")
    head.append(f" at {fmt_time(record.get('wall_time'))}" if record.get("wall_time") is not None else "")
    head.append(f", waited {fmt_duration(record.get('queue_wait'))}")
    if record.get("slot_held"):
        head.append(" (a slot there was held briefly for a user about to send again)", style="dim")
    head.append(", ")
    if record.get("selected_backend_id") is None:
        head.append("never reached a backend", style="bold")
    else:
        head.append("went to ")
        head.append(label(chosen), style="bold cyan")
    if (record.get("attempt") or 1) > 1:
        head.append(f" (attempt {record['attempt']})", style="yellow")
    head.append("\n" + ended(record))
    if record.get("selected_backend_id") is None and not record.get("priority") and not record.get("scores"):
        return Group(head)  # refused before any pick (a quota, an unknown model): no terms to show

    raw_terms = record.get("priority")
    terms: Mapping[str, Any] = raw_terms if isinstance(raw_terms, Mapping) else {}
    prio = titled_table("priority terms (the highest priority is served first)")
    prio.add_column("term")
    prio.add_column("value", justify="right")
    prio.add_column("meaning", style="dim")
    for key, term, meaning, fmt in PRIORITY_TERMS:
        value = terms.get(key)
        if key == "weight" and value is None:
            value = record.get("user_weight")
        if key == "deficit" and value is None:
            value = record.get("user_deficit")
        prio.add_row(Text(term, style="bold") if key == "priority" else term, fmt(value), meaning)
    for key, term, meaning in RECENT_TERMS:
        prio.add_row(term, fmt_tokens(record.get(key)), meaning)

    components = record.get("score_components") or {}
    scores = record.get("scores") or {}
    ids = [str(b) for b in record.get("candidate_backends") or []] or list(components) or list(scores)
    ids.sort(key=lambda b: -float((components.get(b) or {}).get("score", scores.get(b, 0)) or 0))
    cand = titled_table("backends that could serve it (the highest score wins: priority - expected seconds)")
    cand.add_column("backend", no_wrap=True)  # the winner's ✓ stays beside its name
    cand.add_column("score", justify="right")
    # Records from before the prompt cache was priced have no cached tokens: the column is left out, not n/a.
    cached = any("cached_tokens" in (components.get(b) or {}) for b in ids)
    shown = [t for t in SCORE_TERMS if cached or t[0] != "cached_tokens"]
    for _, header, _ in shown:
        cand.add_column(_header(header), justify="right")
    best = components.get(str(chosen)) or {}
    lost: list[str] = []
    for bid in ids:
        row = components.get(bid) or {}
        total = row.get("score", scores.get(bid))
        cell = Text(label(bid), style="bold cyan" if bid == chosen else "")
        if bid == chosen:
            cell.append(" ✓", style="green")
        cells = [
            fmt_num(row.get(key), 1) if key != "penalty" or not row.get(key) else f"-{fmt_num(row.get(key), 1)}"
            for key, _, _ in shown
        ]
        cand.add_row(cell, Text(fmt_num(total, 1), style="bold"), *cells)
        reason = lost_by(row, best) if bid != chosen and row and best else ""
        if reason:
            lost.append(f"{label(bid)} lost: {reason}")
        if row.get("evicts"):
            lost.append(f"{label(bid)} would evict {', '.join(map(str, row['evicts']))}")
    if not ids:
        cand.add_row(Text("none", style="dim"), *[""] * (len(shown) + 1))

    silent = [_header(h) for key, h, _ in shown if not any(_says((components.get(b) or {}).get(key)) for b in ids)]
    silent.sort(key=lambda h: _DROP.index(h) if h in _DROP else len(_DROP))  # the least telling of them first
    parts: list[Any] = [head, Text(), Fitted(prio), Text(), Fitted(cand, drop=[*silent, *_DROP])]
    if lost:
        parts.append(Text("\n".join(lost)))
    rejected = record.get("rejected") or {}
    if rejected:
        refused = titled_table("backends refused")
        refused.add_column("backend")
        refused.add_column("why not")
        for bid, reasons in sorted(rejected.items(), key=lambda kv: label(str(kv[0]))):
            refused.add_row(
                label(str(bid)), "; ".join(map(str, reasons)) if isinstance(reasons, list) else str(reasons)
            )
        parts += [Text(), Fitted(refused)]
    legend = Text("estimate (times in seconds): " + "; ".join(f"{_header(h)} = {m}" for _, h, m in shown), style="dim")
    parts += [Text(), legend]
    return Group(*parts)


def why(
    ctx: typer.Context,
    request_id: Annotated[
        str,
        typer.Argument(
            metavar="REQUEST_ID",
            help="The request's id, from `mr decisions` or the X-Request-Id response header.",
            show_default=False,
        ),
    ],
    json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Explain why a request went where it went: its priority terms and every backend's score or refusal.

    Example: mr why req-3f2a9c
    """
    client = get_app(ctx, config).client
    record = client.get(f"/admin/decisions/{quote_name(request_id)}")
    try:
        names = _names(client.get("/admin/backends"))
    except RequestError:
        names = {}
    if json:
        out = dict(record)
        out.setdefault("backend_names", {bid: names[bid] for bid in names})
        print_json(out)
        return
    console().print(why_view(record, names))


def register(app: typer.Typer) -> None:
    app.command("why")(why)
