"""``mr agent``: serve this workstation's GPU readings to a daemon elsewhere."""

from __future__ import annotations

import ipaddress
import logging
from typing import Annotated

import typer

from ..errors import UsageError
from ._app import ConfigOption, get_app

__all__ = ["register"]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def agent(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="Address to listen on; 0.0.0.0 for every interface.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port.")] = 8485,
    key: Annotated[
        str | None,
        typer.Option(
            envvar="MR_AGENT_KEY", show_envvar=True, help="Require Authorization: Bearer KEY on every request."
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
    logging.basicConfig(level=logging.INFO, format="mr agent: %(message)s")
    if key is None and not _is_loopback(host):
        logging.getLogger(__name__).warning(
            "listening on %s without a key: anyone who can reach port %d can read this machine's GPU readings; "
            "set --key or MR_AGENT_KEY",
            host,
            port,
        )
    run_agent(host, port, key, poll_interval=interval)


def register(app: typer.Typer) -> None:
    app.command("agent")(agent)
