"""The TCP port's first reader: a request that has to wait for a slot waits here, in a few KB.

aiohttp keeps about 14 KB of objects for each request it is serving (its
protocol and parser, the parsed message, the request, payload and writer
objects, two tasks), and a request waiting in the queue is one it is serving:
10,000 queued requests held 220 MB. The front door reads each new
connection's first request itself. A plain inference POST (one
Content-Length; no Transfer-Encoding, Expect, Content-Encoding or browser
Origin) is admitted here (``admission.py``), and if its job has to wait it is
parked: the socket, the request's bytes and its lease, about 7 KB with the job.

- A parked request gets its answer from aiohttp: when the job has a slot (or
  has timed out), the bytes are replayed into aiohttp's protocol for this
  connection, and the inference handler takes the admitted lease over.
- A parked stream is answered here, since its headers and queue position go
  out while it waits; its connection closes at the end.
- Everything else goes to aiohttp at once, bytes read so far included, and
  stays with it. The front door only forwards the connection's events from
  then on, and lets go of an admitted request aiohttp never took over.

While many requests wait, answers close their connection (``inference.CLOSE_WHEN_QUEUED``),
so that a client's next request comes on a fresh connection, which can wait here.
"""

from __future__ import annotations

import asyncio
import re
from email.utils import formatdate
from typing import cast

from aiohttp import web
from multidict import CIMultiDict

from ..backends import INFERENCE_PATHS
from ..backends._shapes import error_tail
from ..errors import RequestError
from .admission import Admitted, admit
from .inference import SHUTTING_DOWN, position_teller, pour, refused, shutdown_tail, waiting_headers
from .keys import ADMITTED, CONFIG
from .responses import error_response

__all__ = ["FrontDoors"]

_MAX_HEAD = 8190  # aiohttp's limit on one line; a longer head goes to aiohttp unread
_REQUEST_LINE = re.compile(rb"POST (/[A-Za-z0-9/_.-]*) HTTP/1\.1")
_FIELD = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([\x20-\x7e\t]*?)[ \t]*")
_NOT_HERE = frozenset({"transfer-encoding", "expect", "content-encoding", "upgrade", "origin"})


def _plain_request(head: bytes) -> tuple[str, CIMultiDict[str], int] | None:
    """Path, headers and body length of a plain inference POST; None for anything aiohttp should read."""
    lines = head.split(b"\r\n")
    match = _REQUEST_LINE.fullmatch(lines[0])
    if match is None or match[1].decode() not in INFERENCE_PATHS:
        return None
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        field = _FIELD.fullmatch(line)
        if field is None:
            return None
        headers.add(field[1].decode(), field[2].decode("latin-1"))
    lengths = headers.getall("Content-Length", [])
    if len(lengths) != 1 or not lengths[0].isdigit() or any(name in headers for name in _NOT_HERE):
        return None
    return match[1].decode(), headers, int(lengths[0])


class FrontDoors:
    """The TCP listener with a front door per connection; ``close`` ends what still waits there."""

    def __init__(self, app: web.Application, server: web.Server) -> None:
        self.app = app
        self.server = server
        self.waiting: set[FrontDoor] = set()
        """Connections whose request waits or streams here."""
        self.closing = False
        self.max_body = app[CONFIG].server.max_body_bytes
        self.header_timeout = app[CONFIG].server.header_timeout
        self._listener: asyncio.Server | None = None

    async def listen(self, host: str, port: int, backlog: int) -> int:
        """Listen on ``host:port``; returns the port (the one the system chose for port 0)."""
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(lambda: FrontDoor(self), host, port, backlog=backlog)
        return int(self._listener.sockets[0].getsockname()[1])

    async def close(self, grace: float) -> None:
        """Stop listening; answer the requests still queued here 503, let streams run for ``grace`` s."""
        self.closing = True
        if self._listener is not None:
            self._listener.close()
        for door in list(self.waiting):
            door.shut()
        streams = [door.task for door in self.waiting if door.task is not None]
        if streams:
            _, pending = await asyncio.wait(streams, timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


class FrontDoor(asyncio.Protocol):
    """One connection, from its first bytes until aiohttp or the parked answer has it."""

    def __init__(self, doors: FrontDoors) -> None:
        self.doors = doors
        self.task: asyncio.Task[None] | None = None
        """The answer of a parked stream."""
        self._transport: asyncio.Transport | None = None
        self._buffer: bytearray | None = bytearray()
        self._inner: asyncio.Protocol | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._admitted: Admitted | None = None
        self._drained: asyncio.Future[None] | None = None

    # -- reading the first request -------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass
        if self.doors.closing:
            self._hand_off()
            return
        self._timer = asyncio.get_running_loop().call_later(self.doors.header_timeout, self._too_slow)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)
            return
        buffer = self._buffer
        assert buffer is not None
        buffer += data
        if self._admitted is not None:  # parked: more bytes (a pipelined request) wait for aiohttp
            if len(buffer) > _MAX_HEAD + self.doors.max_body and self._transport is not None:
                self._transport.close()
            return
        end = buffer.find(b"\r\n\r\n", 0, _MAX_HEAD + 4)
        if end < 0:
            if len(buffer) > _MAX_HEAD:
                self._hand_off()
            return
        plain = _plain_request(bytes(buffer[:end]))
        if plain is None:
            self._hand_off()
            return
        path, headers, length = plain
        body = buffer[end + 4 :]
        if length > self.doors.max_body or len(body) > length:
            self._hand_off()
        elif len(body) == length:
            self._admit(path, headers, bytes(body))

    def _admit(self, path: str, headers: CIMultiDict[str], body: bytes) -> None:
        self._cancel_timer()
        try:
            admitted = admit(self.doors.app, path, headers, body)
        except Exception:  # a body aiohttp's side answers (too deep, bad text): it is read again there
            self._hand_off()
            return
        lease, call = admitted.lease, admitted.call
        if lease is None or call is None or not lease.queued:
            self._hand_off(admitted)
            return
        self._admitted = admitted
        self.doors.waiting.add(self)
        if call.stream:
            self.task = asyncio.create_task(self._answer_stream(admitted))
            self.task.add_done_callback(lambda _task: self._stream_done(admitted))
        else:
            lease.when_ready(self._ready)

    def _too_slow(self) -> None:
        """No whole head within ``header_timeout``: closed, as aiohttp does; a slow body is aiohttp's to time."""
        self._timer = None
        buffer, transport = self._buffer, self._transport
        if buffer is not None and buffer.find(b"\r\n\r\n") >= 0:
            self._hand_off()
        elif transport is not None:
            transport.close()

    def _ready(self) -> None:
        if self._admitted is not None and self._transport is not None and not self._transport.is_closing():
            self.doors.waiting.discard(self)
            self._hand_off(self._admitted)

    def _hand_off(self, admitted: Admitted | None = None) -> None:
        """From now on aiohttp reads this connection, beginning with the bytes read so far."""
        self._cancel_timer()
        transport, buffer = self._transport, self._buffer
        if transport is None or buffer is None or transport.is_closing():
            if admitted is not None:
                _walk_away(admitted)
            return
        if admitted is not None:
            self.doors.app[ADMITTED][transport] = admitted
        self._admitted, self._buffer = None, None
        inner = self._inner = self.doors.server()
        inner.connection_made(transport)
        if buffer:
            inner.data_received(bytes(buffer))

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- the connection's other events -------------------------------------

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()
        elif self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()
        elif self._drained is not None:
            self._drained.set_result(None)
            self._drained = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self.doors.waiting.discard(self)
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(ConnectionResetError("the client went away"))
            self._drained.exception()  # retrieved here: the writer may be gone already
        if self._inner is not None:
            self._inner.connection_lost(exc)
            unclaimed = self.doors.app[ADMITTED].pop(self._transport, None)
            if unclaimed is not None:
                _walk_away(unclaimed)
        elif self.task is not None:
            self.task.cancel()
        elif self._admitted is not None:
            _walk_away(self._admitted)
        self._admitted = None

    def shut(self) -> None:
        """End the request waiting here: a queued one gets a 503, a stream its error tail; then close."""
        transport, admitted = self._transport, self._admitted
        if transport is None or admitted is None or self._inner is not None:
            return
        if self.task is not None:
            if admitted.lease is not None and admitted.lease.queued:
                self.task.cancel()  # the task writes the error tail
            return
        self._admitted = None
        self.doors.waiting.discard(self)
        if admitted.lease is not None:
            admitted.lease.withdraw(SHUTTING_DOWN)
        _refuse(transport, admitted, SHUTTING_DOWN)

    # -- a parked stream's answer ------------------------------------------

    async def _answer_stream(self, admitted: Admitted) -> None:
        lease, dialect, transport = admitted.lease, admitted.dialect, self._transport
        assert lease is not None and transport is not None
        try:
            async with lease:
                headers = {**waiting_headers(lease, dialect), **(admitted.quota_headers or {})}
                transport.write(_head(200, "OK", {**headers, "Transfer-Encoding": "chunked"}))
                try:
                    upstream = await lease.open(heartbeat=position_teller(self._write, lease, dialect))
                    await pour(lease, upstream, self._write, dialect)
                except RequestError as exc:
                    refused(self.doors.app, admitted.rid, exc)
                    await self._write(error_tail(dialect, exc.message))
                except asyncio.CancelledError:
                    if self.doors.closing and not transport.is_closing():
                        tail = shutdown_tail(self.doors.app, admitted.rid, lease, dialect)
                        transport.write(_chunk(tail) + b"0\r\n\r\n")
                    raise
                else:
                    transport.write(b"0\r\n\r\n")
                    lease.finish()
                    return
                transport.write(b"0\r\n\r\n")
        except ConnectionError:
            pass  # the client went away; the lease settled that
        finally:
            self._admitted = None
            self.doors.waiting.discard(self)
            transport.close()

    def _stream_done(self, admitted: Admitted) -> None:
        """A stream cancelled before it began (its client left at once) still ends its lease."""
        _walk_away(admitted)  # settled already when the stream ran
        if self._transport is not None:
            self._transport.close()

    async def _write(self, data: bytes) -> None:
        transport = self._transport
        assert transport is not None
        if transport.is_closing():
            raise ConnectionResetError("the client went away")
        if data:
            transport.write(_chunk(data))
        if self._drained is not None:
            await self._drained


def _walk_away(admitted: Admitted) -> None:
    """The request will never be answered: its lease settles as the client gone (it was never opened)."""
    if admitted.lease is not None:
        admitted.lease.leave()


def _refuse(transport: asyncio.Transport, admitted: Admitted, exc: RequestError) -> None:
    response = error_response(exc, admitted.dialect)
    body = response.body
    assert isinstance(body, bytes)
    headers = {**response.headers, "X-Request-Id": admitted.rid, "Content-Length": str(len(body))}
    transport.write(_head(exc.status, response.reason, headers) + body)
    transport.close()


def _head(status: int, reason: str, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}", *(f"{name}: {value}" for name, value in headers.items())]
    lines += [f"Date: {formatdate(usegmt=True)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)
