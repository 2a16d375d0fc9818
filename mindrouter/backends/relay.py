"""Answers, from the engine's dialect to the client's, chunk by chunk.

A relay is a small pure object: ``feed(event)`` takes one upstream event (an
SSE ``data:`` payload, or one NDJSON line) and returns the bytes to send to
the client (possibly none); ``end()`` is called at the upstream's EOF. Both
raise :class:`StreamFailed` when the upstream reported an error or stopped
early. Relays keep ``usage`` current as events pass, so the daemon can charge
the backend's own token counts. Only ``events.py``, which reads the upstream's
lines into a relay, does I/O. Whole (non-streaming) answers are converted in whole.py.

Passthrough relays look inside an event only when its bytes say it may carry
usage or an error, so a matching stream costs one substring test per chunk.
"""

from __future__ import annotations

import abc
import json
import time
import uuid
from typing import Any

from ._shapes import (
    DONE,
    RESPONSES_USAGE,
    Fault,
    StreamFailed,
    Usage,
    dumps,
    in_band_error,
    ollama_done,
    ollama_logprobs,
    ollama_timestamp,
    ollama_tool_call,
    ollama_usage,
    openai_finish,
    openai_logprobs,
    openai_tool_calls,
    openai_usage,
    usage_json,
)
from .translate import Plan

__all__ = [
    "NdjsonPassthrough",
    "OllamaToOpenAI",
    "OpenAIToOllama",
    "Relay",
    "ResponsesPassthrough",
    "SsePassthrough",
    "make_relay",
]


class Relay(abc.ABC):
    """Base of the four relays: one per (client dialect, engine family) pair."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.usage = Usage()
        self.finished = False
        """The upstream's end marker passed ([DONE], or Ollama's done line)."""
        self.started_ns = time.monotonic_ns()
        self.first_ns: int | None = None
        self.fed = 0
        """Upstream events read so far (about one token each)."""
        self.bytes = 0
        """Upstream bytes read so far: a ceiling on the answer tokens a backend may claim."""

    event_lines = False
    """Pass SSE ``event:`` lines through to the client (the Responses API names its events)."""

    @abc.abstractmethod
    def feed(self, event: bytes) -> bytes:
        """The client's bytes for one upstream event (maybe none)."""

    def end(self) -> bytes:
        """Called at the upstream's EOF: a stream without its end marker was cut short."""
        if not self.finished:
            raise StreamFailed("the backend ended the stream early")
        return b""


def _sse(event: bytes) -> bytes:
    """An upstream SSE event as sent on: each of its lines (an event may have several) a ``data:`` line."""
    if b"\n" in event:
        event = event.replace(b"\n", b"\ndata: ")
    return b"data: " + event + b"\n\n"


class SsePassthrough(Relay):
    """OpenAI SSE to an OpenAI client: unchanged, but the usage-only chunk is hidden unless asked for."""

    def feed(self, event: bytes) -> bytes:
        if self.finished:
            return b""
        if event == b"[DONE]":
            self.finished = True
            return DONE
        in_band_error(event)
        if b'"usage"' in event and b'"usage":null' not in event and b'"usage": null' not in event:
            obj = json.loads(event)
            if obj.get("usage"):
                openai_usage(obj["usage"], self.usage)
                if not self.plan.wants_usage:
                    if not obj.get("choices"):
                        return b""
                    del obj["usage"]
                    event = dumps(obj)
        return _sse(event)


class NdjsonPassthrough(Relay):
    """Ollama NDJSON to an Ollama client: unchanged; the final line gives the counts."""

    def feed(self, event: bytes) -> bytes:
        if self.finished:
            return b""
        in_band_error(event)
        if b'"done":true' in event or b'"done": true' in event:
            ollama_usage(json.loads(event), self.usage)
            self.finished = True
        return event + b"\n"


_RESPONSE_ENDS = (b'"response.completed"', b'"response.incomplete"', b'"response.failed"')


class ResponsesPassthrough(Relay):
    """Responses API events to a Responses client: unchanged; the last event's ``response.usage`` gives the counts.

    Only ``*.delta`` events count in ``fed``: the others (created, item added...) carry no tokens.
    """

    event_lines = True

    def feed(self, event: bytes) -> bytes:
        if self.finished:
            return b""
        if b'.delta"' not in event:  # escaped text cannot match
            self.fed -= 1
        if event == b"[DONE]":
            self.finished = True
            return DONE
        in_band_error(event)
        if any(end in event for end in _RESPONSE_ENDS):  # escaped text cannot match
            obj = json.loads(event)
            usage = (obj.get("response") or {}).get("usage") or {}
            if isinstance(usage, dict):
                self.usage.read(usage, *RESPONSES_USAGE)
            self.finished = True
        return _sse(event)


class OllamaToOpenAI(Relay):
    """Ollama /api/chat or /api/generate lines to OpenAI chat or text_completion chunks."""

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        self.chat = plan.client_kind == "chat"
        self.head: dict[str, Any] = {
            "id": ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24],
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": int(time.time()),
            "model": plan.model,
        }
        self.role_sent = False
        self.tools = 0

    def _chunk(self, choice: dict[str, Any], usage: dict[str, int] | None = None) -> bytes:
        obj = dict(self.head, choices=[choice] if choice else [])
        if usage is not None:
            obj["usage"] = usage
        return b"data: " + dumps(obj) + b"\n\n"

    def _choice(self, text: str, message: dict[str, Any], finish: str | None, logprobs: Any = None) -> dict[str, Any]:
        if not self.chat:
            return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
        delta: dict[str, Any] = {}
        if not self.role_sent:
            delta["role"] = "assistant"
            self.role_sent = True
        if text or finish is None:
            delta["content"] = text
        if message.get("thinking"):
            delta["reasoning_content"] = message["thinking"]
        if message.get("tool_calls"):
            delta["tool_calls"] = [
                dict(c, index=self.tools + i)
                for i, c in enumerate(openai_tool_calls(message["tool_calls"], self.tools))
            ]
            self.tools += len(delta["tool_calls"])
        return {"index": 0, "delta": delta, "logprobs": openai_logprobs(logprobs), "finish_reason": finish}

    def feed(self, event: bytes) -> bytes:
        if self.finished:
            return b""
        obj = json.loads(event)
        if "error" in obj:
            raise StreamFailed(f"the backend reported: {obj['error']}", Fault.ERROR)
        message = obj.get("message") or {}
        text = (message.get("content") if self.chat else obj.get("response")) or ""
        out = b""
        if text or message.get("tool_calls") or message.get("thinking"):
            out = self._chunk(self._choice(text, message, None, obj.get("logprobs")))
        if obj.get("done"):
            self.finished = True
            ollama_usage(obj, self.usage)
            out += self._chunk(self._choice("", {}, openai_finish(obj, self.tools)))
            if self.plan.wants_usage:
                out += self._chunk({}, usage_json(self.usage))
            out += DONE
        return out


class OpenAIToOllama(Relay):
    """OpenAI chat or text_completion chunks to Ollama /api/chat or /api/generate lines."""

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        self.chat_in = plan.upstream_kind == "chat"
        self.key = "message" if plan.client_kind == "chat" else "response"
        self.finish: str | None = None
        self.calls: dict[int, dict[str, Any]] = {}

    def _line(self, text: str, thinking: str | None = None, logprobs: Any = None) -> bytes:
        if self.first_ns is None:
            self.first_ns = time.monotonic_ns()
        obj: dict[str, Any] = {"model": self.plan.model, "created_at": ollama_timestamp()}
        if self.key == "message":
            obj["message"] = {"role": "assistant", "content": text}
            if thinking:
                obj["message"]["thinking"] = thinking
        else:
            obj["response"] = text
        if logprobs:
            obj["logprobs"] = logprobs
        obj["done"] = False
        return dumps(obj) + b"\n"

    def feed(self, event: bytes) -> bytes:
        if self.finished:
            return b""
        if event == b"[DONE]":
            self.finished = True
            return dumps(self._final()) + b"\n"
        in_band_error(event)
        obj = json.loads(event)
        if obj.get("usage"):
            openai_usage(obj["usage"], self.usage)
        out = b""
        for choice in obj.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            self.finish = choice.get("finish_reason") or self.finish
            delta = (choice.get("delta") or {}) if self.chat_in else {}
            for c in delta.get("tool_calls") or ():
                acc = self.calls.setdefault(c.get("index", 0), {"name": "", "arguments": ""})
                fn = c.get("function") or {}
                acc["name"] += fn.get("name") or ""
                acc["arguments"] += fn.get("arguments") or ""
            text = delta.get("content") if self.chat_in else choice.get("text")
            thinking = delta.get("reasoning_content") or delta.get("reasoning")
            if text or thinking:
                out += self._line(text or "", thinking, ollama_logprobs(choice))
        return out

    def _final(self) -> dict[str, Any]:
        now = time.monotonic_ns()
        first = self.first_ns or now
        obj = ollama_done(self.plan.model, self.plan.client_kind, "", self.finish, self.usage)
        if self.calls and self.key == "message":
            obj["message"]["tool_calls"] = [
                ollama_tool_call(c["name"], c["arguments"]) for _, c in sorted(self.calls.items())
            ]
        obj.update(
            total_duration=now - self.started_ns,
            load_duration=0,
            prompt_eval_duration=first - self.started_ns,
            eval_duration=now - first,
        )
        return obj


def make_relay(plan: Plan) -> Relay:
    """The relay for a streaming plan."""
    if plan.responses:
        return ResponsesPassthrough(plan)
    if plan.passthrough:
        return SsePassthrough(plan) if plan.client == "openai" else NdjsonPassthrough(plan)
    return OllamaToOpenAI(plan) if plan.client == "openai" else OpenAIToOllama(plan)
