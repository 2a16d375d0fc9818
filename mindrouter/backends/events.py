"""Reading a stream's events off the wire into a relay, within limits.

:func:`events` is the only I/O of a streamed answer: it splits what the socket
brings into SSE events (the ``data:`` lines up to a blank line, joined by newlines, as the
SSE standard reads them) or NDJSON lines, feeds them to the relay
(relay.py) and yields what it renders. :class:`Limits` is where it cuts a
backend that does not stop: a line too long, more tokens than the request's
``max_tokens`` allows, or a stream running too long in all.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..config import BackendSettings
from ._shapes import Fault, StreamCut, StreamFailed
from .relay import Relay

__all__ = ["MAX_LINE_BYTES", "Limits", "answer_bytes", "answer_limit", "events"]

MAX_LINE_BYTES = BackendSettings().max_line_bytes
"""The default longest stream line (8 MiB): an Ollama ``/api/generate`` final line holds its whole
``context`` (about 1 MB at 128k tokens), a Responses API ``response.completed`` event the whole answer."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Where :func:`events` cuts a stream (``StreamCut``), so a backend that never stops cannot hold memory or a slot.

    Attributes:
        line_bytes: the longest line (event) read before a newline. Defaults to MAX_LINE_BYTES.
        events: the most events (about one token each) the request's ``max_tokens`` allows, with slack
            (:func:`answer_limit`); None when it set none.
        seconds: the longest a stream may run in all; None for no limit.
        silence: the ``chunk_timeout`` the connection's reads run under, named when one expires.
    """

    line_bytes: int = MAX_LINE_BYTES
    events: int | None = None
    seconds: float | None = None
    silence: float | None = None


def answer_limit(max_tokens: int | None, choices: Any = 1) -> int | None:
    """The most answer tokens (or events) believed of a request allowed ``max_tokens`` for each of ``choices``.

    A quarter more, plus 32 (role, finish and usage chunks, tokenizer differences between engines).
    """
    if max_tokens is None:
        return None
    n = choices if isinstance(choices, int) and not isinstance(choices, bool) and choices > 0 else 1
    return n * (max_tokens + max_tokens // 4 + 32)


TOKEN_BYTES = 4096
"""The most bytes one answer token may take in a whole answer: its text escaped (up to 6 bytes a
character), 20 ``top_logprobs`` with their bytes, a tool call's arguments quoted again."""
ECHO_BYTES = 8
"""The most answer bytes per byte of the request: Ollama's ``context`` repeats the prompt as token ids."""
BASE_BYTES = 65536
"""An answer's fixed part: ids, model, usage, timings."""


def answer_bytes(max_tokens: int | None, choices: Any, sent: int) -> int | None:
    """The most bytes believed of a whole answer to a request of ``sent`` bytes allowed ``max_tokens``
    for each of ``choices`` (None when it set none): what :func:`answer_limit` is to a stream's events."""
    tokens = answer_limit(max_tokens, choices)
    return None if tokens is None else BASE_BYTES + ECHO_BYTES * sent + TOKEN_BYTES * tokens


async def _reads(content: aiohttp.StreamReader, silence: float | None) -> AsyncIterator[bytes]:
    """What each socket read brings; a read timeout (``chunk_timeout``) says how long the backend was silent."""
    try:
        async for data in content.iter_any():
            yield data
    except aiohttp.ServerTimeoutError:
        raise StreamFailed(
            f"the backend sent nothing for {silence:g} s in the middle of the answer", fault=Fault.ERROR
        ) from None


async def events(
    content: aiohttp.StreamReader, relay: Relay, *, sse: bool, limits: Limits | None = None
) -> AsyncIterator[bytes]:
    """Read upstream events (SSE ``data:`` payloads or NDJSON lines) and yield what the relay renders.

    What one socket read brought is rendered and yielded as one piece, so a burst of
    events costs one write to the client, not one per event; ``relay.fed`` counts events.

    Raises:
        StreamCut: a line longer than ``limits.line_bytes`` (what is held of it never grows past
            that), more events than ``limits.events``, or a stream running past ``limits.seconds``.
    """
    limits = limits or Limits()
    line_bytes, most = limits.line_bytes, limits.events
    deadline = None if limits.seconds is None else time.monotonic() + limits.seconds
    feed = relay.feed
    rest = b""
    partial: list[bytes] = []
    """Pieces of a line longer than one read, joined once its newline comes (never re-copied per read)."""
    held = 0
    data_lines: list[bytes] = []
    """The ``data:`` lines of the SSE event being read: it ends at a blank line, its data joined by newlines."""
    async for data in _reads(content, limits.silence):
        relay.bytes += len(data)
        if deadline is not None and time.monotonic() > deadline:
            raise StreamCut(f"the answer ran past the {limits.seconds:g} s a stream may take, and was cut")
        if b"\n" not in data:
            held += len(data)
            if held > line_bytes:
                raise StreamCut(f"the backend sent a line longer than {line_bytes} bytes, and it was cut")
            partial.append(data)
            continue
        if partial:
            data, partial, held = b"".join([rest, *partial, data]), [], 0
        elif rest:
            data = rest + data
        lines = data.split(b"\n")
        rest = lines.pop()
        held = len(rest)
        if held > line_bytes or (len(data) > line_bytes and any(len(line) > line_bytes for line in lines)):
            raise StreamCut(f"the backend sent a line longer than {line_bytes} bytes, and it was cut")
        out: list[bytes] = []
        for line in lines:
            line = line.strip()
            if sse:
                if line.startswith(b"data:"):
                    data_lines.append(line[5:].lstrip())
                    continue
                if line:
                    if relay.event_lines and line.startswith(b"event:"):
                        out.append(line + b"\n")
                    continue  # comments, id: lines, and event: lines unless passed on
                if not data_lines:
                    continue
                line = data_lines[0] if len(data_lines) == 1 else b"\n".join(data_lines)
                data_lines.clear()
            elif not line:
                continue
            try:
                if most is not None and relay.fed >= most:
                    raise StreamCut(f"the answer ran past the {most} tokens its max_tokens allows, and was cut")
                relay.fed += 1
                rendered = feed(line)
            except Exception:  # what came before the failure still reaches the client first
                if out:
                    yield b"".join(out)
                raise
            if rendered:
                out.append(rendered)
            if relay.finished:
                break
        if out:
            yield b"".join(out)
        if relay.finished:
            break
    else:  # a last event without its ending newline (or, in SSE, its blank line)
        line = (b"".join([rest, *partial])).strip()
        if sse:
            if line.startswith(b"data:"):
                data_lines.append(line[5:].lstrip())
            line = b"\n".join(data_lines)
        if line:
            if most is not None and relay.fed >= most:
                raise StreamCut(f"the answer ran past the {most} tokens its max_tokens allows, and was cut")
            relay.fed += 1
            rendered = feed(line)
            if rendered:
                yield rendered
    tail = relay.end()
    if tail:
        yield tail
    if not content.at_eof():  # let the connection go back to the pool; it ends right after the last event
        with contextlib.suppress(TimeoutError, aiohttp.ClientError):
            await asyncio.wait_for(content.read(), 1.0)
