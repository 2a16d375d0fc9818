"""Error bodies in the shape each client dialect expects."""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

from aiohttp import web

from ..backends._shapes import Dialect
from ..errors import RequestError

__all__ = ["dialect_of", "error_response", "json_error", "label_answer", "request_id"]

_counter = itertools.count(1)
_prefix = os.urandom(3).hex()


def request_id() -> str:
    """A new ``X-Request-Id``: ``mr-``, this daemon's random prefix, then a counter."""
    return f"mr-{_prefix}{next(_counter):x}"


async def label_answer(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: no answer names the server's software and version (a banner tells an
    attacker which aiohttp's bugs to try), and every refusal carries an ``X-Request-Id``, also those no
    handler saw (an unknown route, a wrong method, a body too large)."""
    response.headers.popall("Server", None)
    if response.status >= 400 and "X-Request-Id" not in response.headers:
        response.headers["X-Request-Id"] = request_id()


def dialect_of(path: str) -> Dialect:
    """Which client dialect a path speaks: Ollama's ``/api/...`` or OpenAI's everything else."""
    return "ollama" if path.startswith("/api/") else "openai"


def error_response(exc: RequestError, dialect: str) -> web.Response:
    """OpenAI paths get ``{"error": {"message", "type", "code"}}``; Ollama paths ``{"error": "message"}``."""
    body: dict[str, Any]
    if dialect == "ollama":
        body = {"error": exc.message}
    else:
        body = {"error": {"message": exc.message, "type": exc.type, "code": exc.code}}
    headers = {"Retry-After": str(int(exc.retry_after))} if exc.retry_after else None
    return web.Response(
        body=json.dumps(body).encode(), status=exc.status, content_type="application/json", headers=headers
    )


def json_error(message: str, status: int, code: str) -> web.Response:
    """An admin API error (always the OpenAI shape)."""
    return error_response(RequestError(message, status=status, type="invalid_request_error", code=code), "openai")
