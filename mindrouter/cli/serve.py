"""`mr serve`: run the daemon."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from ..config import load_config
from ._app import ConfigOption, get_app

__all__ = ["register"]


def serve(
    ctx: typer.Context,
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="Address for the inference API. \\[default: 127.0.0.1]")] = None,
    port: Annotated[int | None, typer.Option(help="TCP port for the inference API. \\[default: 8484]")] = None,
    socket: Annotated[str | None, typer.Option("--socket", help="Unix socket for the admin API.")] = None,
    state_dir: Annotated[str | None, typer.Option("--state-dir", help="Folder for the SQLite state.")] = None,
    log_level: Annotated[
        str | None, typer.Option("--log-level", help="debug, info, warning or error. \\[default: info]")
    ] = None,
    discover: Annotated[
        bool,
        typer.Option(
            "--discover/--no-discover",
            help="With no backend configured, look for Ollama (11434) and OpenAI-compatible servers "
            "(8000, 8080) on this machine.",
        ),
    ] = True,
) -> None:
    """Run the daemon: the inference API on TCP and the admin API on a Unix socket.

    Example: mr serve --port 8484
    """
    path = get_app(ctx, config).config_arg
    overrides = {"host": host, "port": port, "socket": socket, "state_dir": state_dir, "log_level": log_level}
    load_config(path, overrides=overrides, must_exist=path is not None)  # a bad setting: one line, from here
    argv = [sys.executable, "-m", "mindrouter.daemon"] + ([] if path is None else ["--config", str(path)])
    for option, value in overrides.items():
        if value is not None:
            argv += [f"--{option.replace('_', '-')}", str(value)]
    if not discover:
        argv.append("--no-discover")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)  # the daemon without the CLI's modules: about 20 MB less for as long as it runs


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
