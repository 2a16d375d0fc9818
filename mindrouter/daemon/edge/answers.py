"""One place for an answer's headers, and aiohttp's own refusals of malformed HTTP as JSON.

Every response gets its request id (admission's, or a new one for a request
refused before admission), the quota headers admission left, and a ``Server``
line without a version: aiohttp's default names itself and its version, which
tells an attacker which parser's bugs to try. CORS labels are added in ``cors.py``
(only for allowed origins). A request aiohttp's parser refuses (a smuggling or
desync attempt, a malformed head) never reaches the app; ``Runner`` answers it
here with the same JSON error shape and headers, through aiohttp's own error
hook (``RequestHandler.handle_error``), not a parser of ours.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable
from http import HTTPStatus
from typing import cast

from aiohttp import web

from ...backends import Dialect
from ...errors import RequestError
from ..edge.logsafe import Occasional, safe
from ..edge.services import SERVICES
from .errorbodies import error_response

__all__ = ["QUOTA_HEADERS", "REQUEST_ID", "Runner", "new_request_id", "stamp"]

log = logging.getLogger(__name__)
_malformed = Occasional(log)

SERVER = "mindrouter"

REQUEST_ID = web.RequestKey("mindrouter_request_id", str)
"""The id admission gave the request; the answer, the log and the decision record carry it."""

QUOTA_HEADERS = web.RequestKey("mindrouter_quota_headers", dict[str, str])
"""The quota headers admission found for the request (``Quotas.admit``); every answer carries them."""

_counter = itertools.count(1)
_prefix = os.urandom(3).hex()


def new_request_id() -> str:
    return f"mr-{_prefix}{next(_counter):x}"


def _stamp(request: web.BaseRequest, response: web.StreamResponse) -> None:
    headers = response.headers
    headers["Server"] = SERVER
    headers["X-Request-Id"] = request.get(REQUEST_ID) or new_request_id()
    quota = request.get(QUOTA_HEADERS)
    if quota:
        headers.update(quota)


async def stamp(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: the headers every answer carries, streams included; an error answer is
    counted here, whoever made it (a handler, the guard, the admin API, the web UI). A stream that an
    error ends after its first byte is counted where it ends (``inference.py``)."""
    _stamp(request, response)
    if response.status >= 400:
        request.app[SERVICES].stats.count_error(response.status)


class _Handler(web.RequestHandler):
    """aiohttp's connection handler; its refusals of what it cannot parse are answered as ours are.

    Such a refusal (too many headers, a header too long, a body in an encoding it cannot decode)
    comes before aiohttp has a request with a path, so the dialect of its answer is that of the
    last request line seen at the start of what the client sent: an Ollama client's are on ``/api/``.
    """

    _dialect: Dialect = "openai"

    def data_received(self, data: bytes) -> None:
        space = data.find(b" ", 0, 8)
        if space > 0 and data[:space].isalpha():  # what looks like a request line: "POST /api/chat ..."
            self._dialect = "ollama" if data.startswith(b"/api/", space + 1) else "openai"
        super().data_received(data)

    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if status >= 500 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        reason = str(getattr(exc, "message", "") or message or HTTPStatus(status).phrase).splitlines()[0]
        _malformed.info("refused a malformed request from %s: %s", request.remote, safe(reason))
        refusal = RequestError(
            f"the request is not well-formed HTTP/1.1 ({safe(reason.rstrip(': .'))}); "
            "fix the client or the proxy in front of the router",
            status=status,
            code="malformed_request",
        )
        response = error_response(refusal, self._dialect)
        _stamp(request, response)
        if isinstance(self._manager, _Server):  # not an answer of the app's: on_response_prepare is not told
            self._manager.count_error(status)
        response.force_close()
        return response


class _Server(web.Server):
    count_error: Callable[[int], None]
    """Where the connection handlers count their refusals (``Stats.count_error``)."""

    def __call__(self) -> web.RequestHandler:
        return _Handler(self, loop=self._loop, **self._kwargs)


class Runner(web.AppRunner):
    """aiohttp's runner, with its connection handler answering malformed requests in JSON."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server  # only __call__ differs: which handler class serves a connection
        cast(_Server, server).count_error = self.app[SERVICES].stats.count_error
        return server
