"""The fakes' wire: how they count words and tokens, what they answer (tokens, tool calls, logprobs,
embeddings), and how they write JSON, lies included."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


def _words(text: Any) -> int:
    return len(text.split()) if isinstance(text, str) else 0


def content_words(content: Any) -> int:
    """The prompt tokens a fake counts in one message's content: its whitespace-separated words."""
    if isinstance(content, list):
        kinds = ("text", "input_text", "output_text")
        return sum(_words(p.get("text")) for p in content if isinstance(p, dict) and p.get("type") in kinds)
    return _words(content)


def token(i: int) -> str:
    """Piece ``i`` of every fake's answer: ``tok0``, then `` tok1``, `` tok2``..."""
    return f"tok{i}" if i == 0 else f" tok{i}"


TOOL_ARGUMENTS = {"city": "Paris"}
"""What every fake passes when it calls a tool: the first tool the request offers."""


def tool_to_call(body: dict[str, Any]) -> str | None:
    """The tool a fake model calls: the first one offered, unless it just got a tool's answer or may not.

    Chat nests a tool's name in ``function``; the Responses API does not, and answers a call with a
    ``function_call_output`` input item instead of a ``tool`` message.
    """
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools or body.get("tool_choice") == "none":
        return None
    turns = body.get("messages", body.get("input"))
    last = turns[-1] if isinstance(turns, list) and turns else None
    if isinstance(last, dict) and (last.get("role") == "tool" or last.get("type") == "function_call_output"):
        return None
    first = tools[0] if isinstance(tools[0], dict) else {}
    fn = first.get("function", first)
    name = fn.get("name") if isinstance(fn, dict) else None
    return name if isinstance(name, str) else None


def argument_pieces() -> list[str]:
    """TOOL_ARGUMENTS as a fake streams them: in two fragments, one token each."""
    text = json.dumps(TOOL_ARGUMENTS)
    return [text[: len(text) // 2], text[len(text) // 2 :]]


def _pieces(gen: _Generation, json_wanted: bool) -> list[str]:
    """The completion, one piece per token; in JSON mode one JSON object holding it, ending "stop"."""
    if json_wanted:
        return [json.dumps({"answer": gen.text})]
    return [token(i) for i in range(gen.n)]


def logprobs_of(body: dict[str, Any], pieces: list[str], start: int = 0) -> list[dict[str, Any]] | None:
    """What a fake reports when asked for ``logprobs``: piece i has logprob -(i+1)/10, alternatives below it."""
    if not body.get("logprobs"):
        return None
    top = body.get("top_logprobs") or 0
    out = []
    for i, piece in enumerate(pieces, start):
        entry = {"token": piece, "logprob": -(i + 1) / 10, "bytes": list(piece.encode())}
        alternatives = [{"token": f"alt{j}", "logprob": -(i + 2 + j) / 10, "bytes": []} for j in range(top - 1)]
        entry["top_logprobs"] = [dict(entry), *alternatives][:top]
        out.append(entry)
    return out


class Raw(str):
    """A value written into the fake's JSON as it is (``1e400``, ``NaN``): what json.dumps would not write."""


def _compact(obj: Any) -> bytes:
    raws: list[Raw] = []

    def mark(value: Any) -> Any:
        if isinstance(value, Raw):
            raws.append(value)
            return f"__raw{len(raws) - 1}__"
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        return value

    out = _plain(mark(obj))
    for i, raw in enumerate(raws):
        out = out.replace(f'"__raw{i}__"'.encode(), raw.encode())
    return out


def _plain(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def embedding(text: str, dim: int) -> list[float]:
    """The fake's embedding of ``text``: deterministic, so tests can compare vectors."""
    return [((len(text) * (j + 1)) % 97) / 97 for j in range(dim)]


@dataclass(frozen=True)
class Received:
    path: str
    body: dict[str, Any]
    raw: bytes


@dataclass(frozen=True)
class _Generation:
    prompt_tokens: int
    n: int
    finish: str

    @property
    def text(self) -> str:
        return "".join(token(i) for i in range(self.n))
