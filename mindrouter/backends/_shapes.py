"""The two dialects' shapes: errors, usage, finish reasons, tool calls and Ollama's final line.

Shared by translate.py (requests) and relay.py (answers), so each rule about
a wire format is written once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = [
    "DONE",
    "OLLAMA_USAGE",
    "OPENAI_USAGE",
    "RESPONSES_USAGE",
    "Dialect",
    "Family",
    "Kind",
    "StreamFailed",
    "Usage",
    "dumps",
    "error_body",
    "error_message",
    "error_tail",
    "in_band_error",
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


@dataclass(slots=True)
class Usage:
    """Token counts as the backend reported them; ``None`` where it reported none."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    load_seconds: float | None = None
    """Ollama's ``load_duration``, ``prompt_eval_duration`` and ``eval_duration``: what routing learns rates from."""
    prefill_seconds: float | None = None
    decode_seconds: float | None = None

    @property
    def total_tokens(self) -> int | None:
        if self.prompt_tokens is None and self.completion_tokens is None:
            return None
        return (self.prompt_tokens or 0) + (self.completion_tokens or 0)


class StreamFailed(Exception):
    """A stream broke, or carried an error event, after the backend said 200."""


DONE = b"data: [DONE]\n\n"
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
OPENAI_USAGE = (re.compile(rb'"prompt_tokens"\s*:\s*(\d+)'), re.compile(rb'"completion_tokens"\s*:\s*(\d+)'))
RESPONSES_USAGE = (re.compile(rb'"input_tokens"\s*:\s*(\d+)'), re.compile(rb'"output_tokens"\s*:\s*(\d+)'))
OLLAMA_USAGE = (re.compile(rb'"prompt_eval_count"\s*:\s*(\d+)'), re.compile(rb'"eval_count"\s*:\s*(\d+)'))


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def ollama_timestamp() -> str:
    """Now, as Ollama writes ``created_at`` (RFC 3339, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def scan_usage(body: bytes, patterns: tuple[re.Pattern[bytes], re.Pattern[bytes]]) -> Usage:
    """Token counts found in a JSON body without decoding it (escaped text cannot match)."""
    found = [p.search(body) for p in patterns]
    return Usage(*(int(m.group(1)) if m else None for m in found))


def error_message(body: bytes, status: int) -> str:
    """The message of an error body in any engine's shape, or a sentence about ``status``."""
    try:
        obj = json.loads(body)
    except ValueError:
        text = body.decode(errors="replace").strip()
        return text[:300] if text else f"HTTP {status}"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, str):
            return err
        if isinstance(err, dict):
            for key in ("message", "detail"):
                if isinstance(err.get(key), str):
                    return err[key]
    return str(obj)[:300]


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
        raise StreamFailed(f"the backend reported: {error_message(event, 500)}")


def openai_usage(usage: dict[str, Any], into: Usage) -> None:
    into.prompt_tokens = usage.get("prompt_tokens")
    into.completion_tokens = usage.get("completion_tokens")


def ollama_usage(obj: dict[str, Any], into: Usage) -> None:
    into.prompt_tokens = obj.get("prompt_eval_count")
    into.completion_tokens = obj.get("eval_count")
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
