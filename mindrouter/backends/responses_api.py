"""OpenAI's Responses API (``POST /v1/responses``), served as chat completions.

No engine mindrouter speaks to is guaranteed to have the Responses API, and
mindrouter keeps no conversation state, so a Responses request becomes a chat
completions request (:func:`to_chat`) that goes through the usual routing and
translation to any engine; its answer, already OpenAI chat, is rendered back
as a Response object or as Responses stream events (:func:`renderer`).

What maps: ``input`` (a string, or message, ``function_call`` and
``function_call_output`` items, with ``input_text``/``output_text``/
``input_image`` parts), ``instructions``, function ``tools`` and
``tool_choice``, ``text.format`` (json_object, json_schema),
``max_output_tokens``, temperature, top_p, seed, user, streaming. What does
not is the client's 400: ``previous_response_id`` (send the whole conversation),
built-in tools (web search, file search...), files.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..errors import RequestError
from ..reported import count
from ._shapes import dumps

__all__ = ["error_event", "renderer", "to_chat"]

_PASSED = ("model", "temperature", "top_p", "seed", "user", "parallel_tool_calls", "stream", "metadata")


def _fail(message: str) -> RequestError:
    return RequestError(message, status=400, type="invalid_request_error")


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completions body that asks what a Responses body asks.

    Raises:
        RequestError: 400 naming what the Responses API offers that mindrouter does not.
    """
    if body.get("previous_response_id"):
        raise _fail(
            "previous_response_id is not supported: mindrouter keeps no conversation state; "
            "send the whole conversation in input"
        )
    out: dict[str, Any] = {k: body[k] for k in _PASSED if k in body and k != "metadata"}
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for i, item in enumerate(given):
            _add_item(messages, item, i)
    else:
        raise _fail('"input" must be a string or a list of input items.')
    out["messages"] = messages
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    tools = body.get("tools")
    if tools:
        out["tools"] = [_tool(t, i) for i, t in enumerate(tools if isinstance(tools, list) else [tools])]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice is not None:
        out["tool_choice"] = choice
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "response", **schema}}
    if out.get("stream"):
        out["stream_options"] = {"include_usage": True}
    return out


def _parts(content: Any, where: str) -> Any:
    """Responses content parts as chat content parts (a plain string stays a string)."""
    if isinstance(content, str) or content is None:
        return content or ""
    if not isinstance(content, list):
        raise _fail(f"{where}.content must be a string or a list of parts.")
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise _fail(
                    f"{where}: input_image needs an image_url (a data: URL or a link); file ids are not supported."
                )
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise _fail(f"{where}: content parts of type {kind!r} are not supported; use input_text or input_image.")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _add_item(messages: list[dict[str, Any]], item: Any, i: int) -> None:
    where = f"input[{i}]"
    if not isinstance(item, dict):
        raise _fail(f"{where} must be an object.")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise _fail(f"{where}.role must be user, assistant, system or developer.")
        messages.append({"role": role, "content": _parts(item.get("content"), where)})
    elif kind == "function_call":
        call = {
            "id": item.get("call_id") or item.get("id"),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"},
        }
        if not isinstance(call["id"], str) or not isinstance(item.get("name"), str):
            raise _fail(f"{where}: a function_call needs a call_id and a name.")
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and "tool_calls" in last:
            last["tool_calls"].append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        if not isinstance(item.get("call_id"), str):
            raise _fail(f"{where}: a function_call_output needs the call_id it answers.")
        text = output if isinstance(output, str) else json.dumps(output)
        messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
    elif kind != "reasoning":  # reasoning items are the model's own notes: nothing to send
        raise _fail(f"{where}: input items of type {kind!r} are not supported through mindrouter.")


def _tool(tool: Any, i: int) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        kind = tool.get("type") if isinstance(tool, dict) else tool
        raise _fail(f"tools[{i}]: only function tools are supported through mindrouter, not {kind!r}.")
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": fn}


# ---- answers ------------------------------------------------------------------------------------


def _usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    prompt, completion = count(usage.get("prompt_tokens")) or 0, count(usage.get("completion_tokens")) or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def _response(rid: str, model: str, created: int, output: list[Any], finish: str | None, usage: Any) -> dict[str, Any]:
    status = "incomplete" if finish == "length" else "completed" if finish is not None else "in_progress"
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if finish == "length" else None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": _usage(usage),
    }


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": [part]}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def render_body(body: bytes) -> bytes:
    """A chat completion as a Response object."""
    chat = json.loads(body)
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    output: list[Any] = []
    if message.get("content"):
        output.append(_message_item(f"msg_{uuid.uuid4().hex}", message["content"]))
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {}
        output.append(
            _call_item(f"fc_{uuid.uuid4().hex}", call.get("id", ""), fn.get("name", ""), fn.get("arguments") or "")
        )
    rid = "resp_" + str(chat.get("id") or uuid.uuid4().hex)
    response = _response(
        rid,
        chat.get("model", ""),
        chat.get("created") or int(time.time()),
        output,
        choice.get("finish_reason") or "stop",
        chat.get("usage"),
    )
    return dumps(response)


class _Stream:
    """Chat completion chunks (SSE) in, Responses events (SSE) out; one per answer."""

    def __init__(self) -> None:
        self.buffer = b""
        self.seq = 0
        self.rid = f"resp_{uuid.uuid4().hex}"
        self.model = ""
        self.created = int(time.time())
        self.started = False
        self.text: dict[str, Any] | None = None  # the message item being written: id, index, text
        self.calls: dict[int, dict[str, Any]] = {}  # tool call index -> item id, output index, call id, name, args
        self.items = 0
        self.finish: str | None = None
        self.usage: Any = None

    def event(self, kind: str, **data: Any) -> bytes:
        self.seq += 1
        return (
            f"event: {kind}\n".encode()
            + b"data: "
            + dumps({"type": kind, "sequence_number": self.seq, **data})
            + b"\n\n"
        )

    def feed(self, chunk: bytes) -> bytes:
        self.buffer += chunk
        out = b""
        while b"\n\n" in self.buffer:
            raw, self.buffer = self.buffer.split(b"\n\n", 1)
            for line in raw.split(b"\n"):
                if line.startswith(b"data: "):
                    out += self.data(line[6:])
        return out

    def data(self, payload: bytes) -> bytes:
        if payload.strip() == b"[DONE]":
            return self.end()
        obj = json.loads(payload)
        if "error" in obj:
            err = obj["error"] if isinstance(obj["error"], dict) else {"message": str(obj["error"])}
            return self.event("error", code=err.get("code"), message=err.get("message"), param=None)
        out = b""
        if not self.started:
            self.started = True
            self.model = obj.get("model", "")
            self.created = obj.get("created") or self.created
            out += self.event("response.created", response=self.snapshot([], None))
            out += self.event("response.in_progress", response=self.snapshot([], None))
        if obj.get("usage"):
            self.usage = obj["usage"]
        for choice in obj.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self.text_delta(delta["content"])
            for call in delta.get("tool_calls") or ():
                out += self.call_delta(call)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return out

    def text_delta(self, text: str) -> bytes:
        out = b""
        if self.text is None:
            self.text = {"id": f"msg_{uuid.uuid4().hex}", "index": self.items, "text": ""}
            self.items += 1
            item = _message_item(self.text["id"], "", "in_progress")
            item["content"] = []
            out += self.event("response.output_item.added", output_index=self.text["index"], item=item)
            part = {"type": "output_text", "text": "", "annotations": []}
            out += self.event(
                "response.content_part.added",
                item_id=self.text["id"],
                output_index=self.text["index"],
                content_index=0,
                part=part,
            )
        self.text["text"] += text
        return out + self.event(
            "response.output_text.delta",
            item_id=self.text["id"],
            output_index=self.text["index"],
            content_index=0,
            delta=text,
        )

    def call_delta(self, call: dict[str, Any]) -> bytes:
        index = call.get("index", 0)
        fn = call.get("function") or {}
        out = b""
        state = self.calls.get(index)
        if state is None:
            state = self.calls[index] = {
                "id": f"fc_{uuid.uuid4().hex}",
                "index": self.items,
                "call_id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                "name": fn.get("name") or "",
                "args": "",
            }
            self.items += 1
            item = _call_item(state["id"], state["call_id"], state["name"], "", "in_progress")
            out += self.event("response.output_item.added", output_index=state["index"], item=item)
        if fn.get("arguments"):
            state["args"] += fn["arguments"]
            out += self.event(
                "response.function_call_arguments.delta",
                item_id=state["id"],
                output_index=state["index"],
                delta=fn["arguments"],
            )
        return out

    def output(self) -> list[dict[str, Any]]:
        items: list[tuple[int, dict[str, Any]]] = []
        if self.text is not None:
            items.append((self.text["index"], _message_item(self.text["id"], self.text["text"])))
        for s in self.calls.values():
            items.append((s["index"], _call_item(s["id"], s["call_id"], s["name"], s["args"])))
        return [item for _, item in sorted(items, key=lambda x: x[0])]

    def snapshot(self, output: list[Any], finish: str | None) -> dict[str, Any]:
        return _response(self.rid, self.model, self.created, output, finish, self.usage)

    def end(self) -> bytes:
        out = b""
        if self.text is not None:
            t = self.text
            out += self.event(
                "response.output_text.done", item_id=t["id"], output_index=t["index"], content_index=0, text=t["text"]
            )
            part = {"type": "output_text", "text": t["text"], "annotations": []}
            out += self.event(
                "response.content_part.done", item_id=t["id"], output_index=t["index"], content_index=0, part=part
            )
            out += self.event(
                "response.output_item.done", output_index=t["index"], item=_message_item(t["id"], t["text"])
            )
        for s in self.calls.values():
            out += self.event(
                "response.function_call_arguments.done",
                item_id=s["id"],
                output_index=s["index"],
                name=s["name"],
                arguments=s["args"],
            )
            item = _call_item(s["id"], s["call_id"], s["name"], s["args"])
            out += self.event("response.output_item.done", output_index=s["index"], item=item)
        finish = self.finish or "stop"
        kind = "response.incomplete" if finish == "length" else "response.completed"
        return out + self.event(kind, response=self.snapshot(self.output(), finish))


def renderer(stream: bool) -> Callable[[bytes], bytes]:
    """What turns a chat completion answer into the Responses API's: per chunk for a stream, else the body."""
    return _Stream().feed if stream else render_body


def error_event(chunk: bytes) -> bytes:
    """A passed-through answer unchanged, but for mindrouter's own tail of a broken stream: the ``error`` event."""
    if not chunk.startswith(b'data: {"error"'):
        return chunk
    return _Stream().data(chunk[6:].split(b"\n\n", 1)[0])
