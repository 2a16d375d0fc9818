"""``mr gpu``: this machine's GPUs through NVML; needs no daemon."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from ..gpu.probe import GpuProbe
from ..gpu.render import gpu_table, no_gpu_sentence
from ._app import ConfigOption
from ._output import console, print_table

__all__ = ["register"]


def gpu(
    json_output: Annotated[
        bool, typer.Option("--json", help="Print a JSON array of readings instead of a table.")
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Show this machine's NVIDIA GPUs: memory, utilization, temperature, power, processes.

    Reads NVML directly, so it needs no daemon; `--config` is accepted as on
    every command but nothing here depends on it.

    Example: mr gpu --json
    """
    with GpuProbe() as probe:
        readings = probe.read()
        reason = probe.unavailable_reason
    if json_output:
        typer.echo(json.dumps([r.to_dict() for r in readings], indent=2))
        return
    if not readings:
        typer.echo(no_gpu_sentence(reason))
        return
    ascii = not console().encoding.lower().startswith("utf")
    print_table(gpu_table(readings, ascii=ascii), drop=["Procs", "Mem util"])


def register(app: typer.Typer) -> None:
    app.command("gpu")(gpu)
