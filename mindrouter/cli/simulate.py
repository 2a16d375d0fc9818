"""``mr simulate``: run a scenario through the real scheduler core and show shares and waits."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, ClassVar

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from ..errors import UsageError
from ._app import ConfigOption
from ._fit import Fitted
from ._output import console, err_console

__all__ = ["register"]

#: The columns of the users' table a narrow terminal hides first (the summary under it says each in words).
_DROP = ("passed", "p95", "max", "starved", "reqs", "timeouts")


class _LazyProgress:
    """A progress bar on stderr that appears only once a run has taken a noticeable time.

    Short runs (most scenarios take well under a second) never flash a bar. The
    second phase is the comparison run without heavy-user deprioritization.
    """

    _LABELS: ClassVar[dict[str, str]] = {
        "run": "simulating",
        "perfect": "with perfect placement",
        "baseline": "without deprioritization",
    }

    def __init__(self, total: float, console: Console, after: float = 0.5) -> None:
        self.total = total
        self.console = console
        self.after = after
        self.began = time.perf_counter()
        self.progress: Progress | None = None
        self.tasks: dict[str, TaskID] = {}

    def __call__(self, phase: str, now: float) -> None:
        if self.progress is None:
            if time.perf_counter() - self.began < self.after:
                return
            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed:.0f}/{task.total:.0f} s"),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self.progress.start()
        task = self.tasks.get(phase)
        if task is None:
            task = self.tasks[phase] = self.progress.add_task(self._LABELS.get(phase, phase), total=self.total)
        self.progress.update(task, completed=now)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def simulate(
    scenario: Annotated[
        Path | None,
        typer.Argument(
            help="Scenario TOML file (its format: `python -m pydoc mindrouter.simulate`).", show_default=False
        ),
    ] = None,
    example: Annotated[
        str | None,
        typer.Option(
            "--example",
            help="Run a scenario shipped with mindrouter instead, such as scenario3 or model-switch"
            " (docs/simulate.md lists them all).",
        ),
    ] = None,
    duration: Annotated[
        float | None, typer.Option("--duration", help="Simulated seconds (overrides the file's duration).")
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Random seed (overrides the file's seed).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    config: ConfigOption = None,
) -> None:
    """Simulate users and backends against the real scheduler: shares, waits, service gap, fairness.

    Needs no daemon. The scenario's own [scheduler] table sets the scheduler, not
    the config file (`--config` is accepted as on every command and ignored),
    so a scenario and seed give the same result on every machine.
    """
    from ..simulate.loading import example_names, load_example, load_scenario
    from ..simulate.render import render
    from ..simulate.report import run_scenario

    if (scenario is None) == (example is None):
        raise UsageError(
            "give a scenario file or --example NAME (one of " + ", ".join(example_names()) + "), not both or neither"
        )
    sc = load_example(example) if example is not None else load_scenario(scenario)  # type: ignore[arg-type]
    if duration is not None:
        if not duration > 0 or duration != duration or duration == float("inf"):
            raise UsageError(f"--duration must be a number of seconds greater than 0, not {duration!r}")
        sc = sc.replace(duration=float(duration))
    if seed is not None:
        if seed < 0:
            raise UsageError(f"--seed must be a whole number of at least 0, not {seed}")
        sc = sc.replace(seed=seed)
    err = err_console()
    progress = _LazyProgress(sc.duration, err) if err.is_terminal else None
    began = time.perf_counter()
    try:
        result, _ = run_scenario(sc, progress=progress)
    finally:
        if progress is not None:
            progress.close()
    wall = time.perf_counter() - began
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
        return
    render(result, console(), wall_seconds=wall, fit=lambda table: Fitted(table, drop=_DROP))


def register(app: typer.Typer) -> None:
    app.command(
        "simulate",
        epilog="Example: mr simulate --example scenario3, or mr simulate examples/scenario3.toml --json --seed 2.",
    )(simulate)
