"""The admin API's middleware: who may call it, and how the store's errors are answered.

Admin paths are free on the Unix socket (mode 0600, or 0660 for its
``socket_group``) and need the admin key on TCP; an address that sends wrong
keys waits before its next try (``edge/guesses.py``). An error a handler raises for
bad input (a name not found, taken or still in use, a bad value) becomes a JSON
error with its status, so the handlers in ``api.py`` raise and never build
error answers themselves.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from ...store import AlreadyExists, InUse, InvalidValue, NotFound, StoreError
from ..edge.auth import bearer_is
from ..edge.errorbodies import error_response, json_error
from ..edge.services import SERVICES

__all__ = ["admin_middleware"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
def admin_middleware(request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]:
    """Admin paths: free on the Unix socket, on TCP only with the admin key; store errors mapped to statuses.

    Not a coroutine: other paths get their handler's awaitable itself, so an
    inference request (thousands may wait at once) keeps no frame alive here.
    """
    if not request.path.startswith("/admin/"):
        return handler(request)
    return _admin(request, handler)


async def _admin(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not isinstance(request.transport.get_extra_info("sockname") if request.transport else None, str):
        guesses = request.app[SERVICES].auth.guesses
        refusal = guesses.refusal(request.remote)
        if refusal is not None:
            return error_response(refusal, "openai")
        key = request.app[SERVICES].config.server.admin_key
        if not key or not bearer_is(request, key):
            guesses.wrong(request.remote)
            return json_error(
                "admin calls on the TCP port need `Authorization: Bearer <admin_key>`; "
                "use the Unix socket (`mr` does) or set [server] admin_key",
                401,
                "admin_key_required",
            )
    try:
        return await handler(request)
    except NotFound as exc:
        return json_error(str(exc), 404, "not_found")
    except (AlreadyExists, InUse) as exc:
        return json_error(str(exc), 409, "conflict")
    except (InvalidValue, StoreError, ValueError) as exc:
        return json_error(str(exc), 400, "bad_request")
