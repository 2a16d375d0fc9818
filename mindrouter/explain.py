"""A decision record in words: the terms of a job's priority and of a backend's estimate, and how a request ended.

``mr why`` and the web UI's decision page both explain a record with these, so
they say the same thing; plain strings, no rich, so the daemon can use them
without importing the terminal's modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .formats import fmt_num, fmt_pct, fmt_tokens

__all__ = [
    "ENDINGS",
    "PRIORITY_TERMS",
    "RECENT_TERMS",
    "SCORE_TERMS",
    "backend_label",
    "busy_is_cache",
    "ended",
    "lost_by",
]

#: (record key, header, meaning) of each term of a candidate's estimate (docs/routing.md), in seconds from the decision.
SCORE_TERMS = [
    ("start", "start s", "until it could start: the rest of a load, a whole load, or a slot to free"),
    ("prefill", "prefill s", "reading the prompt, but for what its prompt cache holds"),
    ("cached_tokens", "cached tok", "prompt tokens expected in its prompt cache (sent there before): not read again"),
    ("decode", "decode s", "writing the expected answer"),
    ("finish", "finish s", "start + prefill + decode"),
    ("eviction", "evict s", "reload time of the idle models it would evict"),
    ("delay", "delay s", "time it would take, in all, from the streams already there"),
    ("scarcity", "scarce s", "time it would take from work that can run only there"),
    ("decode_rate", "tok/s", "tokens a second the answer is expected to get there"),
    ("streams", "streams", "streams already running there"),
    ("priority", "priority", "the backend's own --priority, in seconds"),
    ("penalty", "penalty", "it already failed this request (subtracted)"),
]
#: The terms a loser can have lost by, and how to say so.
_LOST_BY = [
    ("start", "it would have to load the model or wait for a slot"),
    ("eviction", "it would evict idle models"),
    ("delay", "it would slow the streams already there"),
    ("scarcity", "work that can run only there needs it"),
    ("prefill", "it reads prompts more slowly"),
    ("decode", "it writes answers more slowly"),
    ("penalty", "it already failed this request"),
]
_LESS_CACHED = "less of the prompt is in its prompt cache"


def lost_by(row: Mapping[str, Any], best: Mapping[str, Any]) -> str:
    """The term that cost this candidate the most seconds against the chosen one."""
    cache = float(best.get("cached_tokens") or 0) > float(row.get("cached_tokens") or 0)
    gaps = [
        (float(row.get(k) or 0) - float(best.get(k) or 0), _LESS_CACHED if cache and k == "prefill" else why)
        for k, why in _LOST_BY
    ]
    gap, reason = max(gaps)
    return f"{reason} (+{gap:.1f} s)" if gap > 0.05 else ""


#: (record key, label, meaning, formatter) of each priority term.
PRIORITY_TERMS = [
    ("weight", "weight", "the user's (or group's) fair-share weight", fmt_num),
    (
        "deficit",
        "deficit",
        "service units owed next to the most-owed waiting user of this pool (0 = them), running requests charged",
        lambda v: fmt_num(v, 1),
    ),
    ("inflight_charge", "in-flight charge", "charged so far for their requests still running", lambda v: fmt_num(v, 1)),
    ("credit", "credit", "one typical request here: the most an arrival stands ahead or behind", fmt_tokens),
    (
        "usage_fraction",
        "usage fraction",
        "their recent service units per unit of weight, as a part of this pool's",
        lambda v: fmt_pct(v, 1),
    ),
    ("factor", "factor", "below 1: heavy use moves them back, by one credit at most", lambda v: fmt_num(v, 3)),
    ("wait_bonus", "wait bonus", "added for time spent waiting", lambda v: fmt_num(v, 3)),
    ("priority", "priority", "deficit / weight, lowered by the factor, + wait bonus", lambda v: fmt_num(v, 3)),
]


#: (record key, label, meaning) of the user's recent use, shown after the priority terms.
RECENT_TERMS = [
    ("user_recent_usage", "recent tokens", "prompt and answer tokens they completed here in the fairness window"),
    (
        "user_recent_units",
        "recent units",
        "the same in service units (prompt_token_cost and completion_token_cost): what fair share counts",
    ),
]


#: How a request ended, in words, by the outcome in its decision record.
ENDINGS = {
    "ok": "it was answered in full",
    "client_gone": "the client went away before the answer was complete",
    "backend_failed": "the backend failed",
    "timeout": "it timed out",
    "rejected": "it was refused",
    "error": "the daemon failed while serving it (see its log)",
    "shutdown": "the router shut down before it was answered",
}


def ended(record: Mapping[str, Any]) -> str:
    """One sentence on how the request (or this attempt of it) ended and why."""
    outcome = record.get("outcome")
    if outcome is None:
        return "Ended: not recorded (a record from before outcomes were kept)."
    text = f"Ended: {outcome}: {ENDINGS.get(str(outcome), str(outcome))}"
    status = record.get("status")
    if status is not None:
        text += f" (HTTP {status})"
    reason = record.get("reason")
    return text + (f"; {reason}." if reason and outcome != "ok" else ".")


#: What a request that reached no backend shows where its backend would be, by how it ended.
_NO_BACKEND = {"rejected": "refused", "timeout": "timed out", "client_gone": "left queue", "shutdown": "shut down"}


def backend_label(record: Mapping[str, Any]) -> str:
    """The backend a decision record went to, by name (``#id`` once removed); for one that reached none,
    why: refused, timed out, left queue."""
    name = record.get("selected_backend")
    if name is not None:
        return str(name)
    if record.get("selected_backend_id") is not None:
        return f"#{record['selected_backend_id']}"
    return _NO_BACKEND.get(str(record.get("outcome")), "none")


def busy_is_cache(row: Mapping[str, Any]) -> bool:
    """Whether a backend row's ``utilization`` is its engine's KV-cache fill, not a GPU's: a vLLM or llama-server
    with no GPUs or node named reports only that (``mr top`` and the web UI's Live label it so)."""
    return row.get("engine") in ("vllm", "llamacpp") and not row.get("gpus") and not row.get("node")
