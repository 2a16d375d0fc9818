"""``mr simulate``'s table and summary: a run's JSON object (``report.build``) as a person reads it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich import box
from rich.console import Console, RenderableType
from rich.table import Table

from .figures import render_pool

__all__ = ["render"]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _sec(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def render(
    result: dict[str, Any],
    console: Console,
    *,
    wall_seconds: float | None = None,
    fit: Callable[[Table], RenderableType] | None = None,
) -> None:
    """Print ``result`` as a rich table and a summary (what ``mr simulate`` shows without --json).

    Args:
        fit: wraps the table to fit the terminal (the CLI's ``Fitted``); defaults to printing it as it is.
    """
    title = f"{result['scenario']}: {result['duration']:g} s simulated, seed {result['seed']}"
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
    )
    table.add_column("user", no_wrap=True)
    table.add_column("group (w)", no_wrap=True)
    for header in ("target", "share", "tokens", "reqs", "wait p50", "p95", "max", "starved", "passed", "timeouts"):
        table.add_column(header, justify="right", no_wrap=True)
    for row in result["users"]:
        group = f"{row['group']} ({row['weight']:g})" if row["group"] else f"({row['weight']:g})"
        table.add_row(
            row["name"],
            group,
            _pct(row["target_share"]),
            _pct(row["service_share"]),
            f"{row['tokens']:,}",
            f"{row['requests']:,}",
            _sec(row["wait_p50"]),
            _sec(row["wait_p95"]),
            _sec(row["wait_max"]),
            _sec(row["max_starved_s"]),
            _sec(row["max_passed_over_s"]),
            f"{row['timeouts']:,}",
        )
    console.print(table if fit is None else fit(table))
    gap = result["max_service_gap"]
    bound = result["gap_bound"]
    jain_index = result["jain_index"]
    console.print(
        f"Service gap {gap:,.0f} (bound: 2 x max request cost"
        + (" = " if bound == 2 * result["max_request_cost"] else " / smallest entitlement = ")
        + f"{bound:,.0f}; {result['max_service_gap_beyond_head_start']:,.0f} beyond work already running"
        f" when both waited; {result['max_dispatch_gap']:,.0f} counting requests whole at dispatch)."
    )
    line = "Jain index " + ("-" if jain_index is None else f"{jain_index:.4f}")
    worst = result["worst_window"]
    if worst is not None:
        line += (
            f"; worst 60 s window {100 * worst['deviation']:.1f} points off ({worst['user']} at t={worst['start']:g})"
        )
    console.print(line + ". Shares and targets in service units; tokens count as generated.")
    console.print(
        "Token shares, service units and GPU time (seconds holding a slot): "
        + "; ".join(
            f"{r['name']} {_pct(r['share'])} of tokens, {r['service_units']:,} units ({_pct(r['service_share'])}), "
            f"{r['gpu_seconds']:,.0f} s ({_pct(r['gpu_share'])})"
            for r in result["users"]
        )
        + "."
    )
    if len(result["pools"]) > 1:
        for pool in result["pools"]:
            shares = ", ".join(
                f"{n} {_pct(pool['unit_shares'][n])} (target {_pct(pool['target_shares'][n])})" for n in pool["users"]
            )
            console.print(f"Pool {' + '.join(pool['backends'])}: {shares or 'unused'}.")
    backends = ", ".join(f"{b['name']} {100 * b['utilization']:.0f}% busy" for b in result["backends"])
    console.print(f"Backends: {backends}.")
    console.print(
        "Starved: longest wait with a request queued and none starting. Passed: the part of such a wait"
        " after a slot it could use was left free or went to someone whose turn was later (docs/simulate.md)."
    )
    skipped = [r for r in result["users"] if r["waited_requests"]]
    if skipped:
        console.print(
            "Slots that went to others while a request waited (most, per user): "
            + ", ".join(f"{r['name']} {r['max_slots_skipped']}" for r in skipped)
            + "."
        )
    dep = result["deprioritization"]
    if dep["in_play"]:
        heavy = ", ".join(f"{n} {s:.0f} s" for n, s in dep["seconds"].items() if s)
        line = f"Heavy-user deprioritization was in play ({heavy})"
        without = dep["without"]
        if without is not None:
            line += (
                f"; without it shares move by at most {100 * without['max_share_shift']:.2f} points"
                f" and the service gap is {without['max_service_gap']:,.0f}"
            )
        console.print(line + ".")
    models = result["models"].values()
    if (
        any(b["loads"] for b in result["backends"])
        or any(m["kind"] != "chat" for m in models)
        or result["prompt_cache"]["computed"] < result["prompt_cache"]["sent"]
    ):
        render_pool(result, console)
    if wall_seconds is not None:
        console.print(f"[dim]Simulated in {wall_seconds:.2f} s ({result['events']:,} events).[/dim]")
