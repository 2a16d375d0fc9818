"""Error bodies in the shape each client dialect expects."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ...backends._shapes import Dialect
from ...errors import RequestError

__all__ = ["dialect_of", "error_response", "json_error"]


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
