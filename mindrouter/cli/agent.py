"""``mr agent``: serve this workstation's GPU readings to a daemon elsewhere."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from ..errors import UsageError
from ..names import is_loopback
from ._app import ConfigOption, get_app

__all__ = ["register"]


def agent(
    ctx: typer.Context,
    host: Annotated[
        str,
        typer.Option(
            help="Address to listen on; the default serves this machine only, so a router elsewhere needs 0.0.0.0 "
            "(and a key)."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port.")] = 8485,
    key: Annotated[
        str | None,
        typer.Option(
            envvar="MR_AGENT_KEY",
            show_envvar=True,
            help="Require Authorization: Bearer KEY on every request (needed beyond 127.0.0.1).",
        ),
    ] = None,
    interval: Annotated[
        float | None,
        typer.Option(
            help="Seconds between NVML reads (default: gpu_poll_interval from the config's server section, 5)."
        ),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Serve this machine's NVML readings at GET /gpus for a daemon on another machine (a backend's --node).

    Example: mr agent --host 0.0.0.0 --port 8485 --key "$MR_AGENT_KEY"
    """
    from ..gpu.agent import run_agent  # aiohttp is imported only when the agent runs

    if key is not None and not key.strip():
        raise UsageError("--key must not be empty; leave it out to serve without a key")
    if interval is None:
        interval = get_app(ctx, config).config.server.gpu_poll_interval
    if not interval > 0:
        raise UsageError(f"--interval must be above 0 seconds, not {interval:g}")
    if key is None and not is_loopback(host):
        raise UsageError(
            f"mr agent on {host} needs a key, or anyone who can reach port {port} reads this machine's GPUs; "
            "set MR_AGENT_KEY (and the same [server] agent_key on the router)"
        )
    logging.basicConfig(level=logging.INFO, format="mr agent: %(message)s")
    run_agent(host, port, key, poll_interval=interval)


def register(app: typer.Typer) -> None:
    app.command("agent")(agent)
