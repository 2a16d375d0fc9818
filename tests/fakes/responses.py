"""The Responses API (/v1/responses) of a fake OpenAI or vLLM: text, or a call of the first function tool."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .wire import _compact, _Generation, _words, argument_pieces, content_words, token, tool_to_call

if TYPE_CHECKING:
    from .openai import FakeOpenAI


def _message(item_id: str, status: str, content: list[Any]) -> dict[str, Any]:
    """A Responses API output message item."""
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def invalid(fake: FakeOpenAI, body: dict[str, Any]) -> web.Response | None:
    """As vLLM validates a Responses body: a function tool names itself, a call and its output name the call."""
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            return fake.error(400, f"1 validation error: tools.{i}.name Field required")
    given = body.get("input")
    for i, item in enumerate(given if isinstance(given, list) else ()):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind in ("function_call", "function_call_output") and not isinstance(item.get("call_id"), str):
            return fake.error(400, f"1 validation error: input.{i}.call_id Field required")
    return None


async def answer(
    fake: FakeOpenAI, request: web.Request, body: dict[str, Any], drop_after: int | None
) -> web.StreamResponse:
    """The Responses API: text, or a call of the first function tool offered, as OpenAI and vLLM answer.

    A tool's answer (``function_call_output``) counts as prompt words; a call is TOOL_ARGUMENTS, one
    token per fragment of :func:`argument_pieces`.
    """
    if (bad := fake._check(body) or invalid(fake, body)) is not None:
        return bad
    given = body.get("input")
    if isinstance(given, str):
        prompt = _words(given)
    elif isinstance(given, list):
        items = [i for i in given if isinstance(i, dict)]
        prompt = sum(content_words(i.get("content")) + _words(i.get("output")) for i in items)
    else:
        return fake.error(400, "input must be a string or a list of items")
    prompt += _words(body.get("instructions"))
    tool = tool_to_call(body)
    pieces = argument_pieces() if tool else []
    gen = _Generation(prompt, len(pieces), "stop") if tool else fake.generation(prompt, body.get("max_output_tokens"))
    await fake.prefill(gen)
    fake._ids += 1
    rid, mid, created = f"resp_fake{fake._ids}", f"msg_fake{fake._ids}", int(time.time())
    status = "incomplete" if gen.finish == "length" else "completed"
    usage = {
        "input_tokens": gen.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": gen.n,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": gen.prompt_tokens + gen.n,
    }
    done = {"type": "output_text", "text": gen.text, "annotations": []}
    call = {
        "id": f"fc_fake{fake._ids}",
        "type": "function_call",
        "status": "completed",
        "call_id": f"call_fake{fake._ids}",
        "name": tool,
        "arguments": "".join(pieces),
    }
    item = call if tool else _message(mid, "completed", [done])

    def response(state: str, output: list[Any], used: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "id": rid,
            "object": "response",
            "created_at": created,
            "status": state,
            "incomplete_details": {"reason": "max_output_tokens"} if state == "incomplete" else None,
            "model": body["model"],
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "usage": used,
        }

    if not body.get("stream"):
        await fake.pace(time.monotonic(), gen.n)
        fake.count(gen)
        return web.Response(body=_compact(response(status, [item], usage)), content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    seq = iter(range(10_000))

    def event(kind: str, **data: Any) -> bytes:
        payload = _compact({"type": kind, "sequence_number": next(seq), **data})
        return f"event: {kind}\ndata: ".encode() + payload + b"\n\n"

    chunks = [
        event("response.created", response=response("in_progress", [], None)),
        event("response.in_progress", response=response("in_progress", [], None)),
    ]
    if tool:  # as vLLM streams a call: its item with empty arguments, the fragments, then the whole
        at: dict[str, Any] = {"item_id": call["id"], "output_index": 0}
        added = dict(call, status="in_progress", arguments="")
        chunks.append(event("response.output_item.added", output_index=0, item=added))
        chunks += [event("response.function_call_arguments.delta", delta=piece, **at) for piece in pieces]
        chunks.append(event("response.function_call_arguments.done", arguments=call["arguments"], name=tool, **at))
    else:
        at = {"item_id": mid, "output_index": 0, "content_index": 0}
        chunks.append(event("response.output_item.added", output_index=0, item=_message(mid, "in_progress", [])))
        chunks.append(event("response.content_part.added", part=dict(done, text=""), **at))
        chunks += [event("response.output_text.delta", delta=token(i), logprobs=[], **at) for i in range(gen.n)]
        chunks.append(event("response.output_text.done", text=gen.text, logprobs=[], **at))
        chunks.append(event("response.content_part.done", part=done, **at))
    chunks.append(event("response.output_item.done", output_index=0, item=item))
    chunks.append(event(f"response.{status}", response=response(status, [item], usage)))
    await fake.write_chunks(request, resp, chunks, drop_after)
    fake.count(gen)
    await resp.write_eof()
    return resp
