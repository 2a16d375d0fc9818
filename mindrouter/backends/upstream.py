"""An open answer from a backend, already in the client's dialect.

The daemon iterates it and writes each chunk; nothing here raises after the
first byte. A stream that breaks ends with one error chunk in the client's
dialect (an SSE error event and ``[DONE]``, or an Ollama ``{"error"}`` line)
and sets ``error``, so the daemon can tell a broken answer from a whole one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from ._shapes import Dialect, Fault, StreamFailed, Usage, error_tail
from .budget import Holding

__all__ = ["MALFORMED", "Upstream", "describe", "fault_of"]

MALFORMED = (ValueError, TypeError, KeyError, AttributeError, IndexError)
"""What reading a backend's unexpected JSON can raise: the backend's fault, never the daemon's."""
STREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, StreamFailed, *MALFORMED)

_CONTENT_TYPES = {
    ("openai", True): "text/event-stream",
    ("ollama", True): "application/x-ndjson",
    ("openai", False): "application/json",
    ("ollama", False): "application/json",
}


class Upstream:
    """An open answer, rendered in the client's dialect.

    Iterate it for the chunks to write; ``body`` is the whole answer instead
    when it is not a stream. ``usage`` fills in as chunks pass and is final
    once iteration ends. Always ``await close()`` (or use ``async with``).
    """

    def __init__(
        self,
        *,
        dialect: Dialect,
        status: int = 200,
        body: bytes | bytearray | None = None,
        first: bytes | None = None,
        events: AsyncIterator[bytes] | None = None,
        response: aiohttp.ClientResponse | None = None,
        usage: Usage | None = None,
        error: str | None = None,
        opened_at: float | None = None,
        first_byte_at: float | None = None,
        counter: Any = None,
        vet: Callable[[], None] | None = None,
        holding: Holding | None = None,
    ) -> None:
        self.dialect = dialect
        self.status = status
        self.body = body
        self.stream = body is None
        self.content_type = _CONTENT_TYPES[dialect, self.stream]
        self.headers: dict[str, str] = {"Content-Type": self.content_type}
        if self.stream:
            self.headers["Cache-Control"] = "no-cache"
        self.usage = usage if usage is not None else Usage()
        self.error = error
        """Why the answer failed: the backend's 4xx message, or why a stream broke."""
        self.fault: Fault | None = None
        """Whose fault a broken stream was (set with ``error`` when it broke after the first byte)."""
        self._vet = vet
        """Checks ``usage`` against what the answer's bytes could hold, once, when the answer ends."""
        self.opened_at = opened_at if opened_at is not None else time.monotonic()
        self.first_byte_at = first_byte_at
        """When the backend began to answer: a stream's first chunk was in hand, a whole answer's head came."""
        self.done = False
        """Iteration reached the end (normally or with an error tail)."""
        self.chunks = 0
        """Events passed so far (the relay's count, else chunks yielded): a stand-in for tokens."""
        self._counter = counter
        """The relay, whose ``fed`` counts upstream events when one chunk carries several."""
        self._pending: bytes | bytearray | None = body if body is not None else first
        self._events = events
        self._response = response
        self._closed = False
        self._render: Callable[[bytes], bytes] | None = None
        self._holding = holding
        """What a whole answer's bytes hold of the budget, given back by ``close`` (once it was written)."""

    def rendered(self, render: Callable[[bytes], bytes]) -> Upstream:
        """Pass the answer (the whole body, or each chunk of a stream) through ``render``, a dialect on top.

        An error answer (4xx) keeps its shape, which the Responses API shares with chat completions.
        """
        if self.body is not None:
            if self.status < 400:
                self.body = self._pending = render(bytes(self.body))
            return self
        if self._pending is not None:
            self._pending = render(bytes(self._pending))
        self._render = render
        return self

    def __aiter__(self) -> Upstream:
        return self

    async def __anext__(self) -> bytes | bytearray:
        if self._pending is not None:
            chunk, self._pending = self._pending, None
            self.chunks = self._counter.fed if self._counter is not None else self.chunks + 1
            return chunk
        if self._events is None or self._closed:
            self._end()
            raise StopAsyncIteration
        try:
            chunk = await self._events.__anext__()
        except StopAsyncIteration:
            self._end()
            raise
        except STREAM_ERRORS as exc:
            if self._closed:
                raise StopAsyncIteration from None
            self.error = describe(exc)
            self.fault = fault_of(exc)
            self._end(broken=True)
            tail = error_tail(self.dialect, self.error)
            return tail if self._render is None else self._render(tail)
        self.chunks = self._counter.fed if self._counter is not None else self.chunks + 1
        return chunk if self._render is None else self._render(chunk)

    def _settle_usage(self) -> None:
        vet, self._vet = self._vet, None
        if vet is not None:
            vet()

    def _end(self, *, broken: bool = False) -> None:
        self.done = True
        self._events = None
        self._settle_usage()
        if self._response is not None:
            if broken:
                self._response.close()
            else:
                self._response.release()
            self._response = None

    async def close(self) -> None:
        """Close the upstream connection, so that an unfinished backend stops generating."""
        if self._closed:
            return
        self._closed = True
        self._settle_usage()
        if self._holding is not None:
            self._holding.give_back()
        if self._response is not None:
            self._response.close()
            self._response = None
        events, self._events = self._events, None
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except (RuntimeError, *STREAM_ERRORS):
                pass

    async def __aenter__(self) -> Upstream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def fault_of(exc: BaseException) -> Fault:
    """Whose fault ``exc`` is: a stream's own verdict; ERROR for a timeout or an unreadable answer (one
    client's prompt can make a backend slow or odd for it alone); DOWN for a connection that failed."""
    if isinstance(exc, StreamFailed):
        return exc.fault
    if isinstance(exc, (asyncio.TimeoutError, *MALFORMED)):
        return Fault.ERROR
    return Fault.DOWN


def describe(exc: BaseException) -> str:
    """One sentence for an aiohttp, timeout or stream failure."""
    if isinstance(exc, StreamFailed):
        return str(exc)
    if isinstance(exc, asyncio.TimeoutError):
        return "the backend did not answer in time"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect to {exc.host}:{exc.port} ({exc.os_error.strerror or exc.os_error})"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the backend closed the connection"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the backend's answer was cut off"
    if isinstance(exc, MALFORMED):
        return f"the backend sent something unreadable ({type(exc).__name__}: {exc})"
    return f"the backend connection failed ({type(exc).__name__}: {exc})".replace(" ()", "")
