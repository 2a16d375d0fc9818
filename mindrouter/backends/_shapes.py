"""The two dialects' shapes: errors, usage, finish reasons, tool calls and Ollama's final line.

Shared by translate.py (requests) and relay.py (answers), so each rule about
a wire format is written once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Literal

from ..reported import count, distrust, shown

__all__ = [
    "DONE",
    "OLLAMA_USAGE",
    "OPENAI_USAGE",
    "PROMPT_SLACK",
    "RESPONSES_USAGE",
    "Dialect",
    "Family",
    "Fault",
    "Kind",
    "StreamCut",
    "StreamFailed",
    "Usage",
    "dumps",
    "error_body",
    "error_message",
    "error_tail",
    "in_band_error",
    "not_supported",
    "ollama_done",
    "ollama_logprobs",
    "ollama_timestamp",
    "ollama_tool_call",
    "ollama_usage",
    "openai_finish",
    "openai_logprobs",
    "openai_tool_calls",
    "openai_usage",
    "scan_usage",
    "usage_json",
]

Dialect = Literal["openai", "ollama"]
"""What a client speaks: OpenAI's /v1 API or Ollama's /api."""
Family = Dialect
"""What an engine speaks: Ollama, or OpenAI for the openai, vllm and llamacpp engines."""
Kind = Literal["chat", "completion", "embeddings"]


PROMPT_SLACK = 8192
"""Prompt tokens a backend may add to what the request's bytes could hold (templates, a model's system
prompt, image tokens): a count beyond ``bytes sent + PROMPT_SLACK`` is not believed."""


@dataclass(slots=True)
class Usage:
    """Token counts as the backend reported them; ``None`` where it reported none, or none believable."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    load_seconds: float | None = None
    """Ollama's ``load_duration``, ``prompt_eval_duration`` and ``eval_duration``: what routing learns rates from."""
    prefill_seconds: float | None = None
    decode_seconds: float | None = None
    cached_tokens: int | None = None
    """OpenAI usage's ``prompt_tokens_details.cached_tokens``: prompt tokens the engine's prompt cache held, which
    corrects what routing expects it to hold (``scheduler/routing/prefixes.py``)."""
    dropped: list[tuple[str, Any]] = field(default_factory=list)
    """(field, value) the backend reported that failed its check; logged once per backend by :meth:`vet`."""

    @property
    def total_tokens(self) -> int | None:
        if self.prompt_tokens is None and self.completion_tokens is None:
            return None
        return (self.prompt_tokens or 0) + (self.completion_tokens or 0)

    def read(self, obj: dict[str, Any], prompt_field: str, completion_field: str) -> None:
        """Take both counts from a backend's object: each a whole number in range, else None (and noted)."""
        for attr, name in (("prompt_tokens", prompt_field), ("completion_tokens", completion_field)):
            value = obj.get(name)
            checked = count(value)
            if checked is None and value is not None:
                self.dropped.append((name, value))
            setattr(self, attr, checked)

    def vet(self, source: str, prompt_ceiling: int, completion_ceiling: int) -> None:
        """Drop counts above what the request and the answer's bytes could hold, and log what was dropped.

        A backend that says it read a million tokens of a 2 kB request, or wrote more
        tokens than it sent bytes, is not believed: the daemon's estimate stands.
        """
        if self.prompt_tokens is not None and self.prompt_tokens > prompt_ceiling:
            self.dropped.append(("prompt_tokens", self.prompt_tokens))
            self.prompt_tokens = None
        if self.completion_tokens is not None and self.completion_tokens > completion_ceiling:
            self.dropped.append(("completion_tokens", self.completion_tokens))
            self.completion_tokens = None
        for name, value in self.dropped:
            distrust(source, name, value)
        self.dropped.clear()


class Fault(str, Enum):
    """Whose fault a failed answer was, for the circuit breaker (``daemon/pollers/breaker.py``)."""

    DOWN = "down"
    """No connection: refused or reset, a stream cut off. Always the backend's."""
    ERROR = "error"
    """A 5xx, an error event, a timeout or an unreadable answer: the backend's only once more than one
    user meets it (or a probe fails), since one client's body can cause it."""
    UNSUPPORTED = "unsupported"
    """The backend lacks what the request needs (501, llama-server without --embeddings): never counted."""
    CUT = "cut"
    """The daemon cut an answer past its limits (line, max_tokens, total time): charged, not counted."""


class StreamFailed(Exception):
    """A stream broke, or carried an error event, after the backend said 200."""

    fault = Fault.DOWN

    def __init__(self, message: str, fault: Fault | None = None) -> None:
        super().__init__(message)
        if fault is not None:
            self.fault = fault


class StreamCut(StreamFailed):
    """The daemon ended a stream that broke a limit: a line too long, too many tokens, too long in total."""

    fault = Fault.CUT


DONE = b"data: [DONE]\n\n"
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
_VALUE = rb'"\s*:\s*("[^"]{0,64}"?|[^,}\]\s]{1,64})'
"""A JSON value as it stands after a key (a number, a short string, a literal), for :func:`scan_usage`."""
OPENAI_USAGE = ("prompt_tokens", "completion_tokens")
RESPONSES_USAGE = ("input_tokens", "output_tokens")
OLLAMA_USAGE = ("prompt_eval_count", "eval_count")
_OLLAMA_DURATIONS = ("load_duration", "prompt_eval_duration", "eval_duration")
"""Read with Ollama's counts (``ollama_usage``): routing learns a backend's rates from them."""
_SCANS = {
    names: tuple(
        (name, re.compile(b'"' + name.encode() + _VALUE))
        for name in names + (_OLLAMA_DURATIONS if names == OLLAMA_USAGE else ())
    )
    for names in (OPENAI_USAGE, RESPONSES_USAGE, OLLAMA_USAGE)
}


_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
"""One encoder for every answer: ``json.dumps`` with options builds a new one each call."""


def dumps(obj: Any) -> bytes:
    return _encode(obj).encode()


def ollama_timestamp() -> str:
    """Now, as Ollama writes ``created_at`` (RFC 3339, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _scanned(raw: bytes) -> Any:
    """A value :func:`scan_usage` found: a plain count (the usual value) read at once, anything else as JSON."""
    if raw.isdigit() and (len(raw) == 1 or raw[0] != 0x30):  # JSON allows no leading zero
        return int(raw)
    return json.loads(raw)


def scan_usage(body: bytes | bytearray, names: tuple[str, str]) -> Usage:
    """Token counts (and Ollama's durations) found in a JSON body without decoding it, each checked.

    Escaped text cannot match: a key inside a string is preceded and followed by a backslash.
    """
    found: dict[str, Any] = {}
    for name, pattern in _SCANS[names]:
        m = pattern.search(body)
        if m is not None:
            try:
                found[name] = _scanned(m.group(1))
            except ValueError:
                found[name] = m.group(1).decode(errors="replace")
    usage = Usage()
    if names == OLLAMA_USAGE:
        ollama_usage(found, usage)
    else:
        usage.read(found, *names)
    return usage


def error_message(body: bytes, status: int) -> str:
    """The message of an error body in any engine's shape, or a sentence about ``status``; safe to show."""
    try:
        obj = json.loads(body)
    except ValueError:
        text = body.decode(errors="replace").strip()
        return shown(text, 300) if text else f"HTTP {status}"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, str):
            return shown(err, 300)
        if isinstance(err, dict):
            for key in ("message", "detail"):
                if isinstance(err.get(key), str):
                    return shown(err[key], 300)
    return shown(str(obj), 300)


def not_supported(status: int, body: bytes) -> bool:
    """The backend answered that it lacks what was asked, not that it failed: HTTP 501, or an error of
    type ``not_supported_error`` (llama-server without ``--embeddings``, whatever its status)."""
    if status == 501:
        return True
    if b"not_supported_error" not in body:
        return False
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return False
    return isinstance(err, dict) and err.get("type") == "not_supported_error"


def error_body(dialect: Dialect, status: int, message: str) -> bytes:
    """A whole error answer in the client's shape (OpenAI's object, or Ollama's string)."""
    if dialect == "ollama":
        return dumps({"error": message})
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})


def error_tail(dialect: Dialect, message: str) -> bytes:
    """The clean end of a stream that broke after its first byte."""
    if dialect == "ollama":
        return dumps({"error": message}) + b"\n"
    err = {"error": {"message": message, "type": "server_error", "param": None, "code": "backend_error"}}
    return b"data: " + dumps(err) + b"\n\n" + DONE


def in_band_error(event: bytes) -> None:
    if event.startswith((b'{"error"', b'{"object":"error"', b'{"object": "error"')):
        raise StreamFailed(f"the backend reported: {error_message(event, 500)}", Fault.ERROR)


def openai_usage(usage: Any, into: Usage) -> None:
    """OpenAI's ``usage`` object into ``into``, each count checked (a usage that is not an object is noted)."""
    if isinstance(usage, dict):
        into.read(usage, *OPENAI_USAGE)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            into.cached_tokens = count(details.get("cached_tokens"))
    else:
        into.dropped.append(("usage", usage))


def ollama_usage(obj: dict[str, Any], into: Usage) -> None:
    """Ollama's final-line counts into ``into``, each checked."""
    into.read(obj, *OLLAMA_USAGE)
    into.load_seconds = _seconds(obj.get("load_duration"))
    into.prefill_seconds = _seconds(obj.get("prompt_eval_duration"))
    into.decode_seconds = _seconds(obj.get("eval_duration"))


#: Ollama reports durations in nanoseconds; more than a day is not a reading.
_MAX_NS = 86_400 * 10**9


def _seconds(ns: Any) -> float | None:
    """Nanoseconds as Ollama reports them, in seconds; None for anything that is not a sane duration."""
    if isinstance(ns, bool) or not isinstance(ns, (int, float)) or not 0 <= ns <= _MAX_NS:
        return None
    return ns / 1e9


def usage_json(u: Usage) -> dict[str, int]:
    p, c = u.prompt_tokens or 0, u.completion_tokens or 0
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def ollama_done(model: str, kind: Kind, text: str, finish: str | None, usage: Usage) -> dict[str, Any]:
    obj: dict[str, Any] = {"model": model, "created_at": ollama_timestamp()}
    if kind == "chat":
        obj["message"] = {"role": "assistant", "content": text}
    else:
        obj["response"] = text
    obj.update(done=True, done_reason="length" if finish == "length" else "stop")
    obj["prompt_eval_count"] = usage.prompt_tokens or 0
    obj["eval_count"] = usage.completion_tokens or 0
    return obj


def ollama_tool_call(name: str, arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            arguments = {"arguments": arguments}
    return {"function": {"name": name, "arguments": arguments}}


def openai_tool_calls(calls: list[dict[str, Any]], start: int = 0) -> list[dict[str, Any]]:
    out = []
    for i, c in enumerate(calls, start):
        fn = c.get("function") or {}
        args = fn.get("arguments")
        out.append(
            {
                "id": f"call_{i + 1}",
                "type": "function",
                "function": {
                    "name": fn.get("name", ""),
                    "arguments": args if isinstance(args, str) else json.dumps(args or {}),
                },
            }
        )
    return out


def openai_finish(obj: dict[str, Any], tool_calls: int) -> str:
    if tool_calls:
        return "tool_calls"
    return "length" if obj.get("done_reason") == "length" else "stop"


def openai_logprobs(entries: Any) -> dict[str, Any] | None:
    """Ollama's ``logprobs`` list as an OpenAI choice's: the entries have the same fields."""
    return {"content": entries} if isinstance(entries, list) and entries else None


def ollama_logprobs(choice: dict[str, Any]) -> list[Any] | None:
    """An OpenAI chat choice's token logprobs as Ollama's top-level ``logprobs`` list."""
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    return content if isinstance(content, list) and content else None
