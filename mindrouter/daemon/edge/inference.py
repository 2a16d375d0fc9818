"""The inference API: OpenAI and Ollama routes, translated into jobs for the core.

This module only translates HTTP: admission (``admission.py``) authenticates, parses the body into a
``Call`` and queues the job, and the request's :class:`~.lease.Lease` does everything with
the slot, from waiting in the queue to failing over and settling the usage.
The handler prepares the response, writes the chunks, and ends it; a streaming client that has to wait gets its
headers at once and its queue position, and every stream whose headers went
out gets an end: the answer, or the dialect's error tail and a close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from ...backends import INFERENCE_PATHS, Upstream
from ...backends._shapes import Dialect, error_tail
from ...errors import RequestError
from ..edge.admission import admit
from ..request.lease import Lease
from .answers import QUOTA_HEADERS, REQUEST_ID
from .errorbodies import dialect_of, error_response
from .services import SERVICES, Services

__all__ = ["SHUTTING_DOWN", "end_handlers", "setup_inference_routes"]

log = logging.getLogger(__name__)

_CONTENT_TYPES = {"ollama": "application/x-ndjson", "openai": "text/event-stream"}
Write = Callable[[bytes | bytearray], Awaitable[None]]

SHUTTING_DOWN = RequestError(
    "the router is shutting down; send the request again in a few seconds",
    status=503,
    type="service_unavailable",
    code="shutting_down",
    retry_after=5,
)
STANDBY = RequestError(
    "this router is a standby and another one leads; send requests to the leader (a load balancer that checks "
    "GET /health does) or again in a few seconds",
    status=503,
    type="service_unavailable",
    code="standby",
    retry_after=2,
)
"""What a standby router answers to inference (docs/scale.md)."""
_CUT_BY_SHUTDOWN = "the router shut down before the answer was complete; send the request again in a few seconds"
_BROKEN = "stream"
"""How ``mindrouter_errors_total`` labels a stream that an error ended after its first byte."""


async def handle_inference(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES]
    if not services.leading:
        return error_response(STANDBY, dialect_of(request.path))
    admitted = admit(services, request.path, request.headers, await request.read())
    request[REQUEST_ID] = admitted.rid
    if admitted.quota_headers:
        request[QUOTA_HEADERS] = admitted.quota_headers
    rid, dialect, lease, call = admitted.rid, admitted.dialect, admitted.lease, admitted.call
    response: web.StreamResponse | None = None
    task, handlers = asyncio.current_task(), services.handlers
    if lease is not None and task is not None:
        handlers[task] = lease
    try:
        if admitted.error is not None:
            raise admitted.error
        assert lease is not None and call is not None
        async with lease:
            if call.stream and lease.queued and dialect == "openai":
                response = await _prepare_waiting_stream(request, lease, dialect)
                upstream = await lease.open(heartbeat=_position_teller(response.write, lease, dialect))
            else:
                upstream = await lease.open()
            if response is None and upstream.body is not None:
                lease.finish()
                response = await _whole(request, upstream, upstream.body)
            else:
                if response is None:
                    response = web.StreamResponse(status=upstream.status, headers=upstream.headers)
                    await response.prepare(request)
                await _pour(lease, upstream, response.write, dialect)
                if upstream.error is not None:  # the answer carried its error tail
                    await _end_broken(services, response)
                else:
                    await response.write_eof()
                lease.finish()
        return response
    except asyncio.CancelledError:  # the client left, or ``end_handlers`` stopped its lease at shutdown
        if lease is None or task is None or not lease.stopped:
            raise
        task.uncancel()  # answered here: the connection's task goes on to write it and close
        if response is None or not response.prepared:
            _refused(rid, SHUTTING_DOWN)
            return error_response(SHUTTING_DOWN, dialect)
        with contextlib.suppress(Exception):  # best effort: the connection closes next in any case
            await _end_broken(services, response, _shutdown_tail(rid, lease, dialect))
        return response
    except ConnectionError:  # the client hung up mid-write; its lease has settled, and no one is listening
        return response if response is not None else web.Response(status=499)
    except RequestError as exc:
        _refused(rid, exc)
        if response is not None and response.prepared:  # a stream whose headers went out ends in its dialect
            return await _end_broken(services, response, error_tail(dialect, exc.message))
        return error_response(exc, dialect)
    finally:
        if task is not None:
            handlers.pop(task, None)


async def end_handlers(app: web.Application) -> None:
    """At shutdown (``on_shutdown``): a request still queued ends now, a running one when the grace is up.

    Each gets its dialect's error ending (a 503, or a stream's error tail) while its connection is
    open; aiohttp's own shutdown would cancel the handlers only after the same grace and then close
    the connections with nothing said.
    """
    services = app[SERVICES]
    handlers, grace = services.handlers, services.config.server.shutdown_grace_seconds
    for task, lease in list(handlers.items()):
        if lease.queued and lease.stop():  # its job leaves the queue now; the lease ends as ``shutdown``
            task.cancel()
    deadline = asyncio.get_running_loop().time() + grace
    while handlers and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    for task, lease in list(handlers.items()):
        lease.stop()
        task.cancel()


def _shutdown_tail(rid: str, lease: Lease, dialect: Dialect) -> bytes:
    """The error ending of a stream the shutdown stopped: one that waited, or one that was running."""
    message = SHUTTING_DOWN.message if lease.upstream is None else _CUT_BY_SHUTDOWN
    _refused(rid, RequestError(message, status=503, type="service_unavailable", code="shutting_down"))
    return error_tail(dialect, message)


async def _end_broken(services: Services, response: web.StreamResponse, tail: bytes = b"") -> web.StreamResponse:
    """End a stream whose headers went out in an error: its tail (unless the answer carried it) and its end.

    The one place such an answer is counted in ``mindrouter_errors_total`` (as ``stream``): every other
    error answer is counted as it is prepared (``answers.stamp``), each once.
    """
    services.stats.count_error(_BROKEN)
    if tail:
        await response.write(tail)
    await response.write_eof()
    return response


def _refused(rid: str, exc: RequestError) -> None:
    """Log a request that ends in an error (its answer is counted as it is prepared, or as its stream ends)."""
    log.info("request=%s status=%d %s", rid, exc.status, exc.message)


async def _pour(lease: Lease, upstream: Upstream, write: Write, dialect: Dialect) -> None:
    """The answer's body into a response whose headers went out: chunks, a whole body, or the error tail."""
    if upstream.body is None:
        async for chunk in lease.chunks():
            await write(chunk)
    elif upstream.error is None:  # headers went out while queued: the answer goes into the stream
        await write(upstream.body)
    else:
        await write(error_tail(dialect, upstream.error))


WHOLE_PIECE = 1 << 20
"""A whole answer is written a MiB at a time: written at once, aiohttp would copy it behind its headers."""


async def _whole(request: web.Request, upstream: Upstream, body: bytes | bytearray) -> web.StreamResponse:
    """Write a whole answer before its lease ends, so its bytes count in the budget of whole answers
    (``backends/budget.py``) until the client has them, a piece at a time, each waiting for the last to go."""
    response = web.StreamResponse(status=upstream.status, headers=upstream.headers)
    response.content_length = len(body)
    await response.prepare(request)
    view = memoryview(body)
    for start in range(0, len(view), WHOLE_PIECE):
        await response.write(view[start : start + WHOLE_PIECE])
    await response.write_eof()
    return response


def _waiting_headers(lease: Lease, dialect: str) -> dict[str, str]:
    """The headers a stream gets at once when it has to wait: its type, id and queue position."""
    headers = {"Content-Type": _CONTENT_TYPES[dialect], "Cache-Control": "no-cache"}
    position = lease.position()
    if position is not None:
        headers["X-Queue-Position"] = str(position[0])
        headers["X-Queue-Length"] = str(position[1])
    return headers


async def _prepare_waiting_stream(request: web.Request, lease: Lease, dialect: str) -> web.StreamResponse:
    """An OpenAI stream that must wait gets its headers and position at once, and SSE comments while it
    waits. An Ollama stream gets nothing until its slot: NDJSON has no comments, and Ollama's clients
    (Open WebUI's stream conversion among them) show an error only when it comes as the HTTP status,
    so a queue timeout there is a 504 with ``{"error": ...}``, never an error line after a 200."""
    response = web.StreamResponse(status=200, headers=_waiting_headers(lease, dialect))
    await response.prepare(request)
    return response


def _position_teller(write: Write, lease: Lease, dialect: str) -> Callable[[], Awaitable[None]] | None:
    """OpenAI streams get an SSE comment with their queue position every 2 s; NDJSON has no comments."""
    if dialect != "openai":
        return None

    async def tell() -> None:
        position = lease.position()
        if position is not None:
            await write(f": queued position={position[0]} queue_length={position[1]}\n\n".encode())

    return tell


def setup_inference_routes(app: web.Application) -> None:
    for path in sorted(INFERENCE_PATHS):
        app.router.add_post(path, handle_inference)
