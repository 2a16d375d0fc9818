"""The ``mr`` command line: one typer sub-app per noun, one module per command group.

Each command module exposes ``register(app)``; ``main()`` turns mindrouter's
errors into one stderr line and the exit codes 0 ok, 1 error, 2 usage,
3 daemon unreachable.
"""

from __future__ import annotations

import sys

import typer

from ..errors import MindRouterError

__all__ = ["app", "main"]

app = typer.Typer(
    name="mr",
    help="mindrouter: share a lab's GPUs fairly behind one OpenAI- and Ollama-compatible endpoint.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


def _register_all() -> None:
    from importlib import import_module

    for name in _COMMAND_MODULES:
        try:
            module = import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:  # a command module not written yet
            if exc.name != f"{__name__}.{name}":
                raise
            continue
        module.register(app)


#: Command modules, in the order their commands appear in ``mr --help``.
_COMMAND_MODULES = [
    "serve",
    "status",
    "group",
    "user",
    "backend",
    "models",
    "gpu",
    "queue",
    "decisions",
    "top",
    "share",
    "usage",
    "why",
    "simulate",
    "agent",
    "config_cmd",
    "transfer",
    "store_cmd",
]

_register_all()

# The global ``--config`` and the ``Application`` in ``ctx.obj`` (hatch-style).
from ._app import install as _install_root  # noqa: E402

_install_root(app)


def main() -> None:
    """Entry point of the ``mr`` console script."""
    try:
        app()
    except MindRouterError as exc:
        print(f"mr: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
