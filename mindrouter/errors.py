"""Every error mindrouter raises on purpose, each carrying what the edge needs to report it.

MindRouterError          exit_code for the CLI
├── ConfigError          bad settings (exit 1)
├── UsageError           bad command-line input (exit 2)
├── DaemonUnreachable    the admin socket does not answer (exit 3)
└── RequestError         an inference or admin request that cannot be served;
                         carries the HTTP status and OpenAI type/code
"""

from __future__ import annotations

__all__ = ["ConfigError", "DaemonUnreachable", "MindRouterError", "RequestError", "UsageError"]


class MindRouterError(Exception):
    """Base class; ``str(exc)`` is one sentence that says what to do."""

    exit_code = 1


class ConfigError(MindRouterError):
    """The settings cannot be used as given."""


class UsageError(MindRouterError):
    """A command was called with input it cannot use."""

    exit_code = 2


class DaemonUnreachable(MindRouterError):
    """Nothing answers on the admin socket."""

    exit_code = 3


class RequestError(MindRouterError):
    """A request that ends with an HTTP error status."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        type: str = "invalid_request_error",
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.code = code
        self.retry_after = retry_after
