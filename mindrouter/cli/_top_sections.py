"""The sections of the ``mr top`` screen: each a pure function from ``/admin/top`` JSON to a ``Section``.

A section names its columns (with the minimum width each needs and how soon it
is dropped on a narrow terminal) and its rows; ``_top_view`` lays them out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.text import Text

from ..explain import backend_label, busy_is_cache
from ..formats import fmt_duration, fmt_list, fmt_num, fmt_pct, fmt_speeds, fmt_tokens
from ._output import bar, factor_text, status_text
from ._pictures import share_bar, sparkline
from .queue import user_model_rows

__all__ = ["GPU_RANK", "Cell", "Col", "Section", "clock", "sections"]

Cell = str | Text


@dataclass
class Col:
    header: str
    cell: Callable[[Mapping[str, Any]], Cell]
    min_width: int
    """Columns are dropped, least important first, until the minimum widths fit."""
    justify: str = "left"
    drop: int = 0
    """Higher is dropped sooner on a narrow terminal; 0 is never dropped. No value is ever cut: a column is as
    wide as its widest value (``_top_view``), or the section's rows become blocks."""


@dataclass
class Section:
    """One block of the screen: a title line, a header line, then one line per row (or a block of lines per row,
    ``_top_view._blocks``, where a row cannot fit whole)."""

    title: Text
    columns: list[Col]
    rows: Sequence[Mapping[str, Any]]
    empty: str
    rank: int
    """Which section goes first when the terminal is too short (lower stays longer)."""
    shown: int = field(default=0)


# -- cells --------------------------------------------------------------------------------


def _busy(row: Mapping[str, Any], bars: int) -> Text:
    """The gpu column: a GPU's utilization, or "kv" and the engine's KV-cache fill where no GPU is named."""
    shown = bar(row.get("utilization"), bars)
    return Text.assemble(("kv ", "dim"), shown) if busy_is_cache(row) else shown


def _vram_fraction(free: Any, total: Any) -> float | None:
    try:
        total_f = float(total)
        return (total_f - float(free)) / total_f if total_f > 0 else None
    except (TypeError, ValueError):
        return None


def _gpu_util(row: Mapping[str, Any]) -> float | None:
    value = row.get("utilization_gpu")
    return None if value is None else float(value) / 100.0


def _gpu_mem(row: Mapping[str, Any]) -> float | None:
    try:
        return float(row["memory_used"]) / float(row["memory_total"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def _load(row: Mapping[str, Any]) -> Text:
    text = Text(f"{fmt_num(row.get('in_flight'))}/{fmt_num(row.get('max_concurrent'))}")
    try:
        if int(row.get("in_flight") or 0) >= int(row.get("max_concurrent") or 1):
            text.stylize("yellow")
    except (TypeError, ValueError):
        pass
    return text


def clock(value: Any) -> str:
    try:
        return time.strftime("%H:%M:%S", time.localtime(float(value)))
    except (TypeError, ValueError, OverflowError):
        return "n/a"


def _selected_score(record: Mapping[str, Any]) -> Any:
    return (record.get("scores") or {}).get(str(record.get("selected_backend_id")))


# -- sections --------------------------------------------------------------------------------


def one_name_per_model(models: Any) -> list[str]:
    """``name`` and ``name:latest`` are one model: show it once, without the tag."""
    seen: dict[str, None] = {}
    for model in models or []:
        seen.setdefault(str(model).removesuffix(":latest"), None)
    return list(seen)


def _backends(data: Mapping[str, Any], bars: int) -> Section:
    rows = sorted(data.get("backends") or [], key=lambda b: str(b.get("name")))
    throughput = (data.get("throughput") or {}).get("backends") or {}
    peak = max((max(v, default=0.0) for v in throughput.values()), default=0.0)
    spark = 30 if bars >= 10 else 12
    minutes = spark * float((data.get("throughput") or {}).get("bucket_seconds") or 10) / 60
    cols = [
        Col("backend", lambda r: Text(str(r.get("name")), style="bold"), 7),
        Col("status", lambda r: status_text(r.get("status")), 9),
        Col("load", _load, 4, "right"),
        Col("gpu", lambda r: _busy(r, bars), bars + 5, drop=3),
        Col("vram", lambda r: bar(_vram_fraction(r.get("vram_free"), r.get("vram_total")), bars), bars + 5, drop=4),
        Col(
            f"tok/s, last {minutes:g} min",
            lambda r: sparkline(throughput.get(r.get("name"), []), spark, peak),
            spark,
            drop=5,
        ),
        Col("latency", lambda r: fmt_duration(r.get("latency_ema")), 7, "right", drop=6),
        Col("stream tok/s", lambda r: fmt_num(r.get("tokens_per_second"), 1), 5, "right", drop=2),
        Col("tok/s by model", lambda r: fmt_speeds(r.get("model_speeds")), 14, drop=8),
        Col(
            "loaded models",
            lambda r: Text(fmt_list(one_name_per_model(r.get("loaded_models"))), style="green"),
            13,
            drop=7,  # a list of names, never cut: it goes before the numbers
        ),
    ]
    healthy = sum(1 for r in rows if r.get("status") == "healthy")
    title = Text("Backends", style="bold")
    title.append(f"  {healthy} of {len(rows)} healthy", style="dim")
    return Section(title, cols, rows, "no backends; add one with `mr backend add NAME URL --engine ollama`", rank=0)


def _gpus(data: Mapping[str, Any], bars: int) -> Section:
    rows: list[dict[str, Any]] = []
    for node in data.get("gpus") or []:
        for gpu in node.get("gpus") or []:
            rows.append({**gpu, "_node": node.get("node"), "_stale": node.get("stale")})
    cols = [
        Col("node", lambda r: Text(str(r.get("_node")), style="dim" if r.get("_stale") else ""), 6),
        Col("gpu", lambda r: f"{fmt_num(r.get('index'))} {r.get('name') or ''}".strip(), 5),
        Col("util", lambda r: bar(_gpu_util(r), bars), bars + 5),
        Col("memory", lambda r: bar(_gpu_mem(r), bars), bars + 5, drop=2),
        Col(
            "temp", lambda r: "n/a" if r.get("temperature_c") is None else f"{r['temperature_c']}°C", 5, "right", drop=3
        ),
        Col("", lambda r: Text("stale", style="yellow") if r.get("_stale") else "", 5, drop=1),
    ]
    return Section(Text("GPUs", style="bold"), cols, rows, "no GPU readings", rank=GPU_RANK)


GPU_RANK = 4


def _queue(data: Mapping[str, Any]) -> Section:
    q = (data.get("queue") or {}).get("queue") or {}
    rows = user_model_rows(q)
    cols = [
        Col("user", lambda r: Text(str(r.get("user")), style="bold"), 6),
        Col("model", lambda r: str(r.get("model")), 6),
        Col("queued", lambda r: fmt_num(r.get("queued")), 6, "right"),
        Col("oldest wait", lambda r: fmt_duration(r.get("oldest_wait_seconds")), 11, "right", drop=1),
    ]
    title = Text("Queue", style="bold")
    title.append(
        f"  {fmt_num(q.get('total', 0))} queued · {fmt_num(q.get('running', 0))} running"
        + (
            f" · avg wait {fmt_duration(q.get('average_wait_seconds'))}"
            f" · oldest {fmt_duration(q.get('oldest_wait_seconds'))}"
            if q.get("total")
            else ""
        ),
        style="dim",
    )
    return Section(title, cols, rows, "nothing queued", rank=3)


def _pools_of(user: Mapping[str, Any]) -> str:
    """The backends of the pools a user has a target in, named; pools apart with "; "."""
    pools = [p for p in user.get("pools") or [] if p.get("target_share") is not None]
    return "; ".join(", ".join(map(str, p.get("names") or p.get("backends") or [])) for p in pools)


def _share(data: Mapping[str, Any], bars: int) -> Section:
    share = data.get("share") or {}
    rows = sorted(share.get("users") or [], key=lambda u: (-float(u.get("actual_share") or 0), str(u.get("name"))))
    scale = max([0.05] + [float(u.get(k) or 0) for u in rows for k in ("actual_share", "target_share")])
    width = 2 * bars
    cols = [
        Col("user", lambda r: Text(str(r.get("name")), style="bold"), 6),
        Col("group", lambda r: str(r.get("group")), 6, drop=4),
        Col("weight", lambda r: fmt_num(r.get("weight")), 6, "right"),
        Col("target", lambda r: fmt_pct(r.get("target_share"), 1), 6, "right"),
        Col("actual", lambda r: fmt_pct(r.get("actual_share"), 1), 6, "right"),
        Col(
            "actual vs │target",
            lambda r: share_bar(r.get("actual_share"), r.get("target_share"), scale, width),
            width,
            drop=5,
        ),
        Col("deficit", lambda r: fmt_num(r.get("deficit"), 0), 8, "right", drop=2),
        Col("factor", lambda r: factor_text(r.get("factor")), 6, "right", drop=1),
    ]
    if len({_pools_of(r) for r in rows} - {""}) > 1:  # each target is of its own pool: say which
        cols.insert(5, Col("pool", _pools_of, 4, drop=6))
    title = Text("Fair share", style="bold")
    title.append(
        f"  last {fmt_duration(share.get('window_seconds'))} · {fmt_tokens(share.get('global_recent_tokens'))} tokens",
        style="dim",
    )
    return Section(title, cols, rows, "no users yet", rank=2)


_KINDS = {"tokens_per_day": "tokens/day", "tokens_per_month": "tokens/month", "requests_per_minute": "requests/min"}


def _quota_warnings(data: Mapping[str, Any]) -> Section:
    rows = sorted(data.get("quota_warnings") or [], key=lambda q: -float(q["used"]) / max(1, float(q["limit"])))
    cols = [
        Col("user", lambda r: Text(str(r.get("name")), style="bold"), 4),
        Col("quota", lambda r: _KINDS.get(str(r.get("kind")), str(r.get("kind"))), 10),
        Col("used", lambda r: f"{fmt_tokens(r.get('used'))} of {fmt_tokens(r.get('limit'))}", 9, "right"),
        Col("", lambda r: bar(float(r["used"]) / max(1, float(r["limit"])), 10), 15, drop=2),
        Col("resets", lambda r: str(r.get("resets_at", ""))[:16].replace("T", " "), 16, drop=1),
    ]
    title = Text("Quotas", style="bold yellow")
    title.append("  users above 80% of a quota; requests past 100% get 429 until the reset", style="dim")
    return Section(title, cols, rows, "", rank=1)


def _merge_models(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Today's rows per model, with ``name`` and ``name:latest`` as one."""
    merged: dict[str, dict[str, Any]] = {}
    for row in rows:
        name = str(row.get("model")).removesuffix(":latest")
        into = merged.setdefault(name, {"model": name, "requests": 0, "tokens": 0})
        into["requests"] += row.get("requests") or 0
        into["tokens"] += (row.get("prompt_tokens") or 0) + (row.get("completion_tokens") or 0)
    return sorted(merged.values(), key=lambda r: -r["tokens"])


def _today(data: Mapping[str, Any]) -> Section:
    usage = data.get("usage_today") or {}
    users = [
        {"user": r.get("user"), "tokens": (r.get("prompt_tokens") or 0) + (r.get("completion_tokens") or 0), **r}
        for r in usage.get("users") or []
    ]
    models = _merge_models(usage.get("models") or [])
    rows = [
        {"u": users[i] if i < len(users) else None, "m": models[i] if i < len(models) else None}
        for i in range(max(len(users), len(models)))
    ]

    def cell(side: str, key: str, fmt: Callable[[Any], Cell] = str) -> Callable[[Mapping[str, Any]], Cell]:
        return lambda r: "" if r[side] is None else fmt(r[side].get(key))

    cols = [
        Col("user", cell("u", "user", lambda v: Text(str(v), style="bold")), 4),
        Col("tokens", cell("u", "tokens", fmt_tokens), 6, "right"),
        Col("requests", cell("u", "requests", fmt_num), 8, "right", drop=2),
        Col("model", cell("m", "model"), 5),
        Col("tokens", cell("m", "tokens", fmt_tokens), 6, "right"),
        Col("requests", cell("m", "requests", fmt_num), 8, "right", drop=1),
    ]
    total = sum((usage.get("total") or {}).get(k) or 0 for k in ("prompt_tokens", "completion_tokens"))
    title = Text("Today", style="bold")
    title.append(f"  {fmt_tokens(total)} tokens · top users and models since midnight, server time", style="dim")
    return Section(title, cols, rows, "no usage yet today", rank=5)


def _decisions(data: Mapping[str, Any]) -> Section:
    rows = list(reversed(data.get("decisions") or []))  # newest first
    cols = [
        Col("time", lambda r: clock(r.get("wall_time")), 8, drop=3),
        Col("request", lambda r: str(r.get("request_id")), 8),
        Col("user", lambda r: str(r.get("user") or r.get("user_id")), 6),
        Col("model", lambda r: str(r.get("model")), 6, drop=2),
        Col(
            "backend",
            lambda r: Text(backend_label(r), style="cyan"),
            7,
        ),
        Col("waited", lambda r: fmt_duration(r.get("queue_wait")), 6, "right", drop=1),
        Col("score", lambda r: fmt_num(_selected_score(r), 1), 6, "right", drop=4),
    ]
    return Section(Text("Last decisions", style="bold"), cols, rows, "no decisions yet", rank=6)


def sections(data: Mapping[str, Any], bars: int) -> list[Section]:
    """Every section there is something for, in screen order."""
    shown = [
        _backends(data, bars),
        _quota_warnings(data),
        _gpus(data, bars),
        _queue(data),
        _share(data, bars),
        _today(data),
        _decisions(data),
    ]
    if not data.get("quota_warnings"):
        shown.remove(shown[1])  # shown only while someone is near a limit
    if not any(node.get("gpus") for node in data.get("gpus") or []):
        shown = [s for s in shown if s.rank != GPU_RANK]  # no readings: the backends' bars say "n/a"
    return shown
