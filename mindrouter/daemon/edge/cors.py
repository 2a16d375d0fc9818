"""CORS for browser-side clients: pages from ``[server] cors_origins`` may call the inference API.

A preflight (``OPTIONS`` with ``Access-Control-Request-Method``) from an
allowed origin is answered here, before routing; every other response to an
allowed origin gets its ``Access-Control-Allow-Origin`` just before its headers
go out, streams included. The admin API is never offered to browsers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

__all__ = ["setup_cors"]

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_EXPOSED = "X-Request-Id, X-Queue-Position, X-Queue-Length, Retry-After"


def _allowed(request: web.Request, origins: frozenset[str]) -> str | None:
    """The request's origin if it may read the answer, else None."""
    origin = request.headers.get("Origin")
    if not origin or request.path.startswith("/admin"):
        return None
    return origin if "*" in origins or origin.rstrip("/") in origins else None


def setup_cors(app: web.Application, cors_origins: str) -> None:
    """Answer preflights and label responses for ``cors_origins`` (comma-separated, ``*`` for any)."""
    origins = frozenset(o.strip().rstrip("/") for o in cors_origins.split(",") if o.strip())
    if not origins:
        return

    @web.middleware
    async def preflight(request: web.Request, handler: _Handler) -> web.StreamResponse:
        origin = _allowed(request, origins)
        if origin is None or request.method != "OPTIONS" or "Access-Control-Request-Method" not in request.headers:
            return await handler(request)
        asked = request.headers.get("Access-Control-Request-Headers", "Authorization, Content-Type")
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Origin": origin,
                "Access-Control-Allow-Methods": "GET, HEAD, POST, DELETE, OPTIONS",
                "Access-Control-Allow-Headers": asked,
                "Access-Control-Max-Age": "600",
                "Vary": "Origin",
            },
        )

    async def label(request: web.Request, response: web.StreamResponse) -> None:
        origin = _allowed(request, origins)
        if origin is not None:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = _EXPOSED
            response.headers["Vary"] = "Origin"

    app.middlewares.insert(0, preflight)
    app.on_response_prepare.append(label)
