"""The store's refusals; each carries the HTTP status the admin API answers with."""

from __future__ import annotations

from ..errors import MindRouterError


class StoreError(MindRouterError):
    """A state change that cannot be made; ``status`` is the HTTP status the admin API answers."""

    status = 500
    code = "internal_error"


class NotFound(StoreError, LookupError):
    """The named group, user or backend does not exist."""

    status = 404
    code = "not_found"


class AlreadyExists(StoreError):
    """A group, user or backend of that name exists already."""

    status = 409
    code = "conflict"


class InUse(StoreError):
    """The thing is still referenced (a group that has users)."""

    status = 409
    code = "conflict"


class InvalidValue(StoreError, ValueError):
    """A value (weight, name, URL, engine, import file) that cannot be stored."""

    status = 400
    code = "bad_request"


class Busy(StoreError):
    """Another thread of this process is writing, and the caller said not to wait (the event loop's usage writes)."""

    status = 503
    code = "busy"
