"""Whole (non-streaming) answers, from the engine's dialect to the client's, and the backend's token counts.

The streaming counterpart is relay.py; both read a :class:`~mindrouter.backends.translate.Plan`.
"""

from __future__ import annotations

import base64
import json
import sys
import time
import uuid
from array import array
from typing import Any

from ._shapes import (
    OLLAMA_USAGE,
    OPENAI_USAGE,
    RESPONSES_USAGE,
    Usage,
    dumps,
    ollama_done,
    ollama_logprobs,
    ollama_tool_call,
    ollama_usage,
    openai_finish,
    openai_logprobs,
    openai_tool_calls,
    openai_usage,
    scan_usage,
    usage_json,
)
from .translate import Plan

__all__ = ["convert_body"]


def convert_body(plan: Plan, body: bytes | bytearray, elapsed_ns: int = 0) -> tuple[bytes | bytearray, Usage]:
    """The client's answer for a non-streaming plan, and the backend's token counts.

    Args:
        elapsed_ns: time the backend took, for the durations an Ollama client
            expects (upper bounds: OpenAI engines do not time the phases).

    Raises:
        ValueError: the backend's body is not the JSON its dialect promises.
    """
    if plan.responses:
        usage, out = scan_usage(body, RESPONSES_USAGE), body
    elif plan.passthrough:
        usage = scan_usage(body, OPENAI_USAGE if plan.upstream == "openai" else OLLAMA_USAGE)
        out = body
    else:
        obj = json.loads(body)
        if not isinstance(obj, dict):
            raise ValueError("expected a JSON object")
        usage = Usage()
        if plan.upstream == "ollama":
            ollama_usage(obj, usage)
            out = dumps(_openai_answer(plan, obj, usage))
        else:
            if obj.get("usage"):
                openai_usage(obj["usage"], usage)
            out = dumps(_ollama_answer(plan, obj, usage, max(1, elapsed_ns)))
    if plan.client_kind == "embeddings" and usage.completion_tokens is None:
        usage.completion_tokens = 0
    return out, usage


def _openai_answer(plan: Plan, obj: dict[str, Any], usage: Usage) -> dict[str, Any]:
    created = int(time.time())
    if plan.client_kind == "embeddings":
        data = []
        for i, vec in enumerate(obj.get("embeddings") or ()):
            if plan.base64_embeddings:
                floats = array("f", vec)
                if sys.byteorder != "little":
                    floats.byteswap()
                vec = base64.b64encode(floats.tobytes()).decode()
            data.append({"object": "embedding", "index": i, "embedding": vec})
        p = usage.prompt_tokens or 0
        return {"object": "list", "data": data, "model": plan.model, "usage": {"prompt_tokens": p, "total_tokens": p}}
    finish = openai_finish(obj, len((obj.get("message") or {}).get("tool_calls") or ()))
    if plan.client_kind == "completion":
        choice = {"text": obj.get("response") or "", "index": 0, "logprobs": None, "finish_reason": finish}
        head = {"id": "cmpl-" + uuid.uuid4().hex[:24], "object": "text_completion"}
    else:
        m = obj.get("message") or {}
        message: dict[str, Any] = {"role": "assistant", "content": m.get("content") or ""}
        if m.get("thinking"):
            message["reasoning_content"] = m["thinking"]
        if m.get("tool_calls"):
            message["tool_calls"] = openai_tool_calls(m["tool_calls"])
        choice = {
            "index": 0,
            "message": message,
            "logprobs": openai_logprobs(obj.get("logprobs")),
            "finish_reason": finish,
        }
        head = {"id": "chatcmpl-" + uuid.uuid4().hex[:24], "object": "chat.completion"}
    return dict(head, created=created, model=plan.model, choices=[choice], usage=usage_json(usage))


def _ollama_answer(plan: Plan, obj: dict[str, Any], usage: Usage, elapsed_ns: int) -> dict[str, Any]:
    if plan.client_kind == "embeddings":
        vectors = [d.get("embedding") for d in sorted(obj.get("data") or (), key=lambda d: d.get("index", 0))]
        if plan.legacy_embeddings:
            return {"embedding": vectors[0] if vectors else []}
        return {
            "model": plan.model,
            "embeddings": vectors,
            "total_duration": elapsed_ns,
            "load_duration": 0,
            "prompt_eval_count": usage.prompt_tokens or 0,
        }
    choice = (obj.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    text = (message.get("content") if plan.upstream_kind == "chat" else choice.get("text")) or ""
    out = ollama_done(plan.model, plan.client_kind, text, choice.get("finish_reason"), usage)
    if message.get("tool_calls") and plan.client_kind == "chat":
        out["message"]["tool_calls"] = [
            ollama_tool_call(c["function"]["name"], c["function"].get("arguments")) for c in message["tool_calls"]
        ]
    thinking = message.get("reasoning_content") or message.get("reasoning")
    if thinking and plan.client_kind == "chat":
        out["message"]["thinking"] = thinking
    if ollama_logprobs(choice):
        out["logprobs"] = ollama_logprobs(choice)
    out.update(total_duration=elapsed_ns, load_duration=0, prompt_eval_duration=elapsed_ns, eval_duration=elapsed_ns)
    return out
