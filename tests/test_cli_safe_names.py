"""Names a backend supplies reach the terminal escaped (issue 19 item 7): an ESC[2J in a model name
cleared the admin's screen in `mr models`, a newline forged a line, rich markup in it was read."""

from __future__ import annotations

import io

from rich.console import Console

from mindrouter.cli._output import Column, table
from mindrouter.cli._top_view import render_top

from . import test_cli_fake
from .test_cli_fake import FakeDaemon, mr

fake = test_cli_fake.fake
fake_server = test_cli_fake.fake_server

EVIL = "evil\x1b[2J\nforged [bold red]line[/]\x07"


def rendered(renderable: object, width: int = 200) -> str:
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_a_table_cell_escapes_control_characters_and_reads_no_markup() -> None:
    out = rendered(table([{"model": EVIL}], [Column("model", "model")]))
    assert "\x1b" not in out and "\x07" not in out
    assert "evil\\x1b[2J\\nforged [bold red]line[/]\\x07" in out  # `mr models` uses this table


def test_backend_list_shows_backend_supplied_text_safely(fake: FakeDaemon) -> None:
    for row in fake.backends.values():
        row["models"] = [EVIL]
        row["error"] = EVIL
    run = mr("backend", "list")
    assert run.exit_code == 0
    assert "\x1b" not in run.stdout and "\x07" not in run.stdout and "\\x1b[2J" in run.stdout
    assert not any(line.startswith("forged") for line in run.stdout.splitlines())


def test_top_shows_backend_supplied_names_safely(fake_server: FakeDaemon) -> None:
    fake_server.reset()
    data = fake_server.top()
    data["backends"][0]["name"] = EVIL
    data["backends"][0]["loaded_models"] = [EVIL]
    out = rendered(render_top(data, 160, 40))
    assert "\x1b" not in out and "\x07" not in out and "evil\\x1b" in out
