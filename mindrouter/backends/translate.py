"""Requests, from the client's dialect to the engine's: where each call goes upstream.

``plan(call, model, engine)`` is pure: it returns the backend path, the bytes
to send and what relay.py needs to render the answer. When the dialects match,
the client's bytes go out unchanged, except for two splices: the backend's
model name, and ``stream_options.include_usage`` on OpenAI streams, because
the scheduler charges every stream by the backend's own token counts.

Mappings (OpenAI <-> Ollama):

    /v1/chat/completions <-> /api/chat
    /v1/completions       -> /api/generate with raw=true (no chat template, as OpenAI)
    /api/generate         -> /v1/chat/completions (Ollama applies the chat template),
                             or /v1/completions when raw=true or with a suffix (fill-in-the-middle)
    /v1/embeddings       <-> /api/embed (and Ollama's older /api/embeddings)
    max_tokens / max_completion_tokens <-> options.num_predict; temperature,
    top_p, seed, stop, presence/frequency_penalty <-> options.*; top_k, min_p
    and repeat_penalty <-> the engines that take them (vLLM calls the last
    repetition_penalty; OpenAI itself takes none); num_ctx and keep_alive
    have no per-request equivalent on OpenAI-family engines;
    response_format json_object / json_schema <-> format "json" / schema;
    chat logprobs / top_logprobs <-> the same (answers: choices[].logprobs.content <-> logprobs);
    image_url data: URLs <-> message images (base64); tool calls, with
    arguments as a JSON string (OpenAI) or an object (Ollama).

So the same request gets the same kind of answer whichever engine the
scheduler picks: raw text completion on both, or chat-templated on both.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from typing import Any

from ..errors import RequestError
from ._shapes import Family, Kind, dumps, ollama_timestamp
from .call import Call

_SAMPLING = ("top_k", "min_p", "repeat_penalty")
"""Ollama options that vLLM and llama-server take too, under these names."""
_SAMPLING_NAMES: dict[str, dict[str, str]] = {
    "vllm": {"top_k": "top_k", "min_p": "min_p", "repeat_penalty": "repetition_penalty"},
    "llamacpp": {"top_k": "top_k", "min_p": "min_p", "repeat_penalty": "repeat_penalty"},
}
_TRANSLATION_BUGS = (KeyError, IndexError, TypeError, AttributeError)

__all__ = ["Plan", "plan"]

_USAGE_SPLICE = b',"stream_options":{"include_usage":true}}'
_SHARED_OPTIONS = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty")
_IMAGE_MAGIC = {"iVBOR": "image/png", "/9j/": "image/jpeg", "R0lG": "image/gif", "UklG": "image/webp"}


@dataclass(frozen=True, slots=True)
class Plan:
    """How one call goes upstream, and how its answer comes back (see translate.plan)."""

    path: str
    """Backend path to POST to."""
    data: bytes
    stream: bool
    client: Family
    client_kind: Kind
    upstream: Family
    upstream_kind: Kind
    model: str
    """The name the client used, echoed in translated answers."""
    wants_usage: bool = False
    legacy_embeddings: bool = False
    """The client used Ollama's old /api/embeddings (one ``embedding``)."""
    base64_embeddings: bool = False
    """The OpenAI client asked for ``encoding_format: base64``."""
    synthetic: bytes | None = None
    """A complete answer made without the backend (an Ollama "load model" call)."""
    responses: bool = False
    """A Responses API call passed through to an engine that serves /v1/responses."""

    @property
    def passthrough(self) -> bool:
        return self.client == self.upstream


def plan(call: Call, model: str, engine: str) -> Plan:
    """How ``call`` goes to an ``engine`` backend (ollama, vllm, llamacpp, openai) that knows it as ``model``.

    Raises:
        RequestError: 400 when the call cannot be said in the engine's dialect
            (an image by http URL or several prompts for Ollama, for example).
    """
    family: Family = "ollama" if engine == "ollama" else "openai"
    if call.path == "/v1/responses":  # only for engines that serve it (Adapter.serves_responses)
        data = call.raw if model == call.model else dumps(dict(call.body, model=model))
        return _plan(call, call.path, data, family, call.kind, responses=True)
    if call.dialect == family:
        return _passthrough(call, model)
    try:
        return _to_ollama(call, model) if family == "ollama" else _to_openai(call, model, engine)
    except _TRANSLATION_BUGS as exc:  # a shape inspect_body let through: still the client's request
        raise RequestError(
            f"the request cannot be translated for a {engine} backend ({type(exc).__name__}: {exc}); "
            "check it against the API reference"
        ) from exc


def _plan(
    call: Call, path: str, body: dict[str, Any] | bytes, family: Family, upstream_kind: str, **extra: Any
) -> Plan:
    data = body if isinstance(body, bytes) else dumps(body)
    return Plan(
        path=path,
        data=data,
        stream=call.stream,
        client=call.dialect,
        client_kind=call.kind,
        upstream=family,
        upstream_kind=upstream_kind,  # type: ignore[arg-type]
        model=call.model,
        wants_usage=call.wants_usage,
        legacy_embeddings=call.path == "/api/embeddings",
        **extra,
    )


def _passthrough(call: Call, model: str) -> Plan:
    data: bytes | dict[str, Any] = call.raw
    needs_usage = call.dialect == "openai" and call.stream and not call.wants_usage
    if model == call.model and not needs_usage:
        pass
    elif model == call.model and "stream_options" not in call.body and call.raw.rstrip().endswith(b"}"):
        data = call.raw.rstrip()[:-1] + _USAGE_SPLICE
    else:
        body = dict(call.body, model=model)
        if needs_usage:
            body["stream_options"] = dict(call.body.get("stream_options") or {}, include_usage=True)
        data = body
    return _plan(call, call.path, data, call.dialect, call.kind)


# ---- OpenAI client -> Ollama engine ---------------------------------------------------------


def _to_ollama(call: Call, model: str) -> Plan:
    b = call.body
    if b.get("n") not in (None, 1):
        raise RequestError('"n" greater than 1 is not supported by Ollama backends.')
    if call.kind == "embeddings":
        inputs = b["input"]
        if not isinstance(inputs, str) and not all(isinstance(x, str) for x in inputs):
            raise RequestError(
                'Ollama backends embed text only: send "input" as a string or a list of strings, not token '
                "arrays (LangChain's OpenAIEmbeddings: check_embedding_ctx_length=False)."
            )
        out: dict[str, Any] = {"model": model, "input": inputs}
        if b.get("dimensions"):
            out["dimensions"] = b["dimensions"]
        return _plan(
            call, "/api/embed", out, "ollama", "embeddings", base64_embeddings=b.get("encoding_format") == "base64"
        )
    out = {"model": model, "stream": call.stream}
    options = {k: b[k] for k in _SHARED_OPTIONS if b.get(k) is not None}
    if b.get("repetition_penalty") is not None:  # vLLM's name, which OpenAI clients send as an extra
        options["repeat_penalty"] = b["repetition_penalty"]
    options.update((k, b[k]) for k in _SAMPLING if b.get(k) is not None)
    limit = b.get("max_completion_tokens") or b.get("max_tokens")
    if limit is not None:
        options["num_predict"] = limit
    stop = b.get("stop")
    if stop:
        options["stop"] = [stop] if isinstance(stop, str) else stop
    if options:
        out["options"] = options
    fmt = b.get("response_format") or {}
    if fmt.get("type") == "json_object":
        out["format"] = "json"
    elif fmt.get("type") == "json_schema":
        out["format"] = (fmt.get("json_schema") or {}).get("schema") or "json"
    if call.kind == "chat":
        out["messages"] = [_ollama_message(m, i) for i, m in enumerate(b["messages"])]
        if b.get("tools") and b.get("tool_choice") != "none":  # Ollama has no tool_choice
            out["tools"] = b["tools"]
        out.update(_logprobs(b))
        return _plan(call, "/api/chat", out, "ollama", "chat")
    prompt = b["prompt"]
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise RequestError('Ollama backends take one prompt: "prompt" must be a string.')
        prompt = prompt[0]
    out["prompt"] = prompt
    if b.get("suffix"):
        out["suffix"] = b["suffix"]  # fill-in-the-middle needs the model's template
    else:
        out["raw"] = True
    return _plan(call, "/api/generate", out, "ollama", "completion")


def _image_base64(part: dict[str, Any], where: str) -> str:
    url = part.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
    if isinstance(url, str) and url.startswith("data:") and "," in url:
        return url.split(",", 1)[1]
    raise RequestError(f"{where}: Ollama backends take images as data: URLs (base64), not links.")


def _ollama_message(m: dict[str, Any], i: int) -> dict[str, Any]:
    role = "system" if m["role"] == "developer" else m["role"]
    out: dict[str, Any] = {"role": role}
    content = m.get("content")
    if isinstance(content, list):
        texts = [p["text"] for p in content if p.get("type") == "text"]
        images = [_image_base64(p, f"messages[{i}]") for p in content if p.get("type") in ("image_url", "input_image")]
        out["content"] = "\n".join(texts)
        if images:
            out["images"] = images
    else:
        out["content"] = content or ""
    calls = m.get("tool_calls")
    if calls:
        out["tool_calls"] = [
            {"function": {"name": fn["name"], "arguments": _arguments(fn.get("arguments"), i)}}
            for fn in _functions(calls, i)
        ]
    if role == "tool" and m.get("name"):
        out["tool_name"] = m["name"]
    return out


def _functions(calls: Any, i: int) -> list[dict[str, Any]]:
    """The ``function`` of each tool call in messages[i], each with a string ``name``."""
    found = [c.get("function") if isinstance(c, dict) else None for c in calls] if isinstance(calls, list) else [None]
    if not all(isinstance(fn, dict) and isinstance(fn.get("name"), str) for fn in found):
        raise RequestError(
            f'messages[{i}].tool_calls must be a list of {{"function": {{"name": ..., "arguments": ...}}}} objects.'
        )
    return found  # type: ignore[return-value]


def _arguments(arguments: Any, i: int) -> Any:
    if not isinstance(arguments, str):
        return arguments or {}
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        raise RequestError(f"messages[{i}]: tool call arguments must be a JSON object.") from None


# ---- Ollama client -> OpenAI-family engine --------------------------------------------------


def _to_openai(call: Call, model: str, engine: str) -> Plan:
    b = call.body
    if call.kind == "embeddings":
        inputs = b["prompt"] if call.path == "/api/embeddings" else b["input"]
        out: dict[str, Any] = {"model": model, "input": inputs, "encoding_format": "float"}
        if b.get("dimensions"):
            out["dimensions"] = b["dimensions"]
        return _plan(call, "/v1/embeddings", out, "openai", "embeddings")
    if (call.kind == "chat" and not b.get("messages")) or (
        call.kind == "completion" and not b.get("prompt") and not b.get("images")
    ):
        return _plan(call, "", b"", "openai", call.kind, synthetic=_load_answer(call))  # Ollama's "load the model" call
    out = {"model": model}
    o = b.get("options") or {}
    out.update((k, o[k]) for k in _SHARED_OPTIONS if o.get(k) is not None)
    names = _SAMPLING_NAMES.get(engine, {})
    out.update((names[k], o[k]) for k in _SAMPLING if k in names and o.get(k) is not None)
    if isinstance(o.get("num_predict"), int) and o["num_predict"] > 0:
        out["max_tokens"] = o["num_predict"]
    if o.get("stop"):
        out["stop"] = o["stop"]
    fmt = b.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "response", "schema": fmt}}
    if call.stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    if call.kind == "completion" and (b.get("raw") or b.get("suffix")) and b.get("prompt"):  # raw, or FIM
        out["prompt"] = b["prompt"]
        if b.get("suffix"):
            out["suffix"] = b["suffix"]
        return _plan(call, "/v1/completions", out, "openai", "completion")
    if call.kind == "chat":
        out["messages"] = _openai_messages(b["messages"])
        if b.get("tools"):
            out["tools"] = b["tools"]
        out.update(_logprobs(b))
    else:
        user: dict[str, Any] = {"role": "user", "content": b.get("prompt") or "", "images": b.get("images")}
        out["messages"] = _openai_messages(
            [{"role": "system", "content": b["system"]}, user] if b.get("system") else [user]
        )
    return _plan(call, "/v1/chat/completions", out, "openai", "chat")


def _logprobs(b: dict[str, Any]) -> dict[str, Any]:
    """Chat ``logprobs``/``top_logprobs``: the same fields in both dialects (Ollama since 0.12.11)."""
    if not b.get("logprobs"):
        return {}
    return {"logprobs": True, **({"top_logprobs": b["top_logprobs"]} if b.get("top_logprobs") else {})}


def _load_answer(call: Call) -> bytes:
    """What Ollama answers when asked to load a model: OpenAI-family engines always have it loaded."""
    out: dict[str, Any] = {"model": call.model, "created_at": ollama_timestamp()}
    if call.kind == "chat":
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    out.update(done=True, done_reason="load")
    return dumps(out) + (b"\n" if call.stream else b"")


def _data_url(image: str) -> str:
    if image.startswith("data:"):
        return image
    mime = next((t for magic, t in _IMAGE_MAGIC.items() if image.startswith(magic)), "image/jpeg")
    return f"data:{mime};base64,{image}"


def _openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending: deque[tuple[str, str]] = deque()  # (call id, tool name) awaiting a tool message
    n = 0
    for i, m in enumerate(messages):
        msg: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("images"):
            parts: list[dict[str, Any]] = [{"type": "text", "text": msg["content"]}] if msg["content"] else []
            parts += [{"type": "image_url", "image_url": {"url": _data_url(img)}} for img in m["images"]]
            msg["content"] = parts
        if m.get("tool_calls"):
            msg["tool_calls"] = []
            for fn in _functions(m["tool_calls"], i):
                n += 1
                call_id = f"call_{n}"
                pending.append((call_id, fn.get("name", "")))
                args = fn.get("arguments")
                msg["tool_calls"].append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": fn.get("name", ""),
                            "arguments": args if isinstance(args, str) else json.dumps(args or {}),
                        },
                    }
                )
        if m["role"] == "tool":
            match = next((p for p in pending if p[1] == m.get("tool_name")), pending[0] if pending else None)
            if match is not None:
                pending.remove(match)
                msg["tool_call_id"] = match[0]
            if m.get("tool_name"):
                msg["name"] = m["tool_name"]
        out.append(msg)
    return out
