"""The outermost middleware: every error a client can cause is a JSON answer in its path's dialect.

aiohttp answers a wrong route, a wrong method and an oversized body with plain
text, and a bug or a hostile body (JSON nested 100,000 deep, a lone surrogate,
a body falsely labelled gzip) would surface as a 500. Here each becomes the
error its clients parse: OpenAI's shape on ``/v1`` and admin paths, Ollama's
``{"error": "..."}`` on ``/api``. Anything unexpected is logged with its
traceback once and answered 500 in the same shape, and the daemon goes on.
A body that cannot be decoded is one rate-limited log line, never a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Awaitable, Callable

from aiohttp import http_exceptions, web

from ...errors import RequestError
from ..edge.logsafe import Occasional, safe
from ..edge.services import SERVICES
from .errorbodies import dialect_of, error_response

__all__ = ["guard_middleware"]

log = logging.getLogger(__name__)
_undecodable = Occasional(log)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _too_large(request: web.Request) -> RequestError:
    limit = request.client_max_size
    return RequestError(
        f"the request body is larger than the {limit:,} bytes this server accepts; "
        "send a smaller one (an admin can raise [server] max_body_bytes)",
        status=413,
        code="request_too_large",
    )


def _http_error(request: web.Request, exc: web.HTTPException) -> RequestError:
    """aiohttp's own refusals, reworded as one sentence that says what to do."""
    if exc.status == 404:
        message = f"there is no {request.method} {safe(request.path)} here; see the routes in the README"
        return RequestError(message, status=404, code="not_found")
    if exc.status == 405:
        allowed = ", ".join(sorted(getattr(exc, "allowed_methods", ()) or ())) or "another method"
        message = f"{safe(request.path)} does not take {request.method}; use {allowed}"
        return RequestError(message, status=405, code="method_not_allowed")
    if exc.status == 413:
        return _too_large(request)
    return RequestError(
        exc.reason or f"HTTP {exc.status}", status=exc.status, code=exc.reason.lower().replace(" ", "_")
    )


async def _read_body(request: web.Request) -> None:
    """Read the body within ``body_timeout`` (aiohttp keeps it, so the handler's read is free).

    A body that came whole with its head (most do) is read without a timer: a cancelled timer
    stays in the event loop's heap until it is due, so each would outlive its read by
    ``body_timeout`` on every waiting request.
    """
    if request.content.is_eof():
        await request.read()
        return
    timeout = request.app[SERVICES].config.server.body_timeout
    try:
        async with asyncio.timeout(timeout):  # no second task per request, as wait_for would make on 3.11
            await request.read()
    except TimeoutError:
        raise RequestError(
            f"the request body did not arrive within {timeout:g} s; send it at once",
            status=408,
            code="request_timeout",
        ) from None


def _closing(response: web.Response) -> web.Response:
    """Close the connection after this answer: the unread rest of the body must not pass for a request."""
    response.force_close()
    return response


@web.middleware
async def guard_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer every client-caused error as JSON in the path's dialect; never let one become a crash."""
    length = request.content_length
    if length is not None and length > request.client_max_size:
        return _closing(error_response(_too_large(request), dialect_of(request.path)))
    try:
        if request.body_exists:
            await _read_body(request)
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = error_response(_http_error(request, exc), dialect_of(request.path))
        if exc.status == 405:
            response.headers["Allow"] = exc.headers.get("Allow", "")
        return response
    except RequestError as exc:
        response = error_response(exc, dialect_of(request.path))
        return _closing(response) if exc.status == 408 else response
    except RecursionError:
        error = RequestError("the request body is nested too deeply; send at most a few hundred levels of JSON")
    except UnicodeError:
        error = RequestError(
            "the request body is not valid UTF-8 text (or holds a lone surrogate escape); fix its encoding"
        )
    except (web.RequestPayloadError, zlib.error, http_exceptions.ContentEncodingError, EOFError):
        _undecodable.info("refused a request body that could not be read as sent, from %s", request.remote)
        request.content.feed_eof()  # the rest is not wanted: aiohttp must not drain it (and log its error again)
        error = RequestError(
            "the request body could not be read as sent (does it match its Content-Encoding?); send it plain"
        )
        return _closing(error_response(error, dialect_of(request.path)))
    except Exception:
        log.exception("internal error on %s %s", request.method, safe(request.path))
        error = RequestError(
            "the router hit an internal error on this request; it was logged, and other requests are unaffected",
            status=500,
            type="server_error",
            code="internal_error",
        )
    return error_response(error, dialect_of(request.path))
