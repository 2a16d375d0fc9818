"""The command line's documentation: man/mr.1 is complete and current, every command's --help has an example."""

from __future__ import annotations

import inspect
import itertools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from mindrouter.cli import _manpage
from mindrouter.cli import app as mr_app

from . import test_cli_fake
from .test_cli_fake import mr

fake = test_cli_fake.fake
fake_server = test_cli_fake.fake_server  # the fixtures, shared with test_cli_fake

ROOT = Path(__file__).resolve().parent.parent
MAN = ROOT / "man" / "mr.1"
UNIT = ROOT / "docs" / "systemd" / "mindrouter.service"

#: Commands this suite documents; serve, gpu, agent and simulate have their own owners and tests.
OURS = {
    "status",
    "models",
    "queue",
    "decisions",
    "top",
    "share",
    "why",
    "import",
    "export",
    "group",
    "user",
    "backend",
    "config",
}


def leaf_commands() -> list[tuple[tuple[str, ...], object]]:
    return list(_manpage.command_paths(typer.main.get_command(mr_app)))


def test_man_page_is_generated_from_the_current_commands() -> None:
    assert MAN.read_text(encoding="utf-8") == _manpage.render(), (
        "man/mr.1 is out of date; run: python -m mindrouter.cli._manpage -o man/mr.1"
    )


def test_man_page_names_every_command_and_option() -> None:
    page = MAN.read_text(encoding="utf-8")
    root = typer.main.get_command(mr_app)
    for param in root.params:
        for opt in param.opts:
            assert _manpage._esc(opt) in page, opt
    for path, cmd in leaf_commands():
        section = page.split(f".SS {' '.join(path)}\n", 1)
        assert len(section) == 2, f"mr {' '.join(path)} is missing from man/mr.1"
        body = section[1].split("\n.SS ", 1)[0]
        for param in cmd.params:  # type: ignore[attr-defined]
            if getattr(param, "hidden", False):
                continue
            names = (
                [*param.opts, *param.secondary_opts]
                if param.param_type_name == "option"
                else [_manpage._metavar(param).strip("[]")]
            )
            for name in names:
                assert _manpage._esc(name) in body, f"{name} of mr {' '.join(path)} is missing from man/mr.1"
    for code in ("0", "1", "2", "3"):
        assert f"\\fB{code}\\fR" in page.split(".SH EXIT STATUS", 1)[1]


@pytest.mark.skipif(shutil.which("man") is None, reason="needs man")
def test_man_page_renders_without_warnings() -> None:
    run = subprocess.run(
        ["man", "--warnings", "-l", str(MAN)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "MANPAGER": "cat", "PAGER": "cat", "MANWIDTH": "80"},
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    assert "mr group set-weight NAME W" in re.sub(r".\x08", "", run.stdout)


def test_generator_check_mode(tmp_path: Path) -> None:
    stale = tmp_path / "mr.1"
    stale.write_text("old\n")
    assert _manpage.main(["-o", str(stale), "--check"]) == 1
    assert _manpage.main(["-o", str(stale)]) == 0
    assert _manpage.main(["-o", str(stale), "--check"]) == 0


@pytest.mark.parametrize("path", [p for p, _ in leaf_commands() if p[0] in OURS], ids=lambda p: " ".join(p))
def test_every_command_has_help_with_an_example(path: tuple[str, ...]) -> None:
    run = mr(*path, "--help", env={"COLUMNS": "200"})
    assert run.exit_code == 0
    assert f"Example: mr {' '.join(path)}" in run.stdout or f"Example: mr {path[0]}" in run.stdout, run.stdout


def test_json_on_every_reading_command() -> None:
    readers = {
        ("status",),
        ("models",),
        ("queue",),
        ("decisions",),
        ("top",),
        ("share",),
        ("why",),
        ("export",),
        ("group", "list"),
        ("user", "list"),
        ("backend", "list"),
        ("config", "show"),
        ("config", "path"),
    }
    commands = dict(leaf_commands())
    for path in readers:
        assert "--json" in [o for p in commands[path].params for o in p.opts], path  # type: ignore[attr-defined]


def test_shell_completion_offers_names_from_the_daemon(fake: object) -> None:
    script = Path(sys.executable).parent / "mr"
    if not script.exists():
        pytest.skip("the mr console script is not installed next to this Python")
    env = {**os.environ, "_MR_COMPLETE": "complete_bash", "COMP_WORDS": "mr group set-weight ", "COMP_CWORD": "3"}
    run = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert {"student", "faculty"} <= set(run.stdout.split()), run


def test_systemd_unit_example() -> None:
    text = UNIT.read_text()
    assert re.search(r"^ExecStart=\S+/mr serve --config /etc/mindrouter/config.toml$", text, re.M)
    for key in (
        "RuntimeDirectory=mindrouter",
        "StateDirectory=mindrouter",
        "WantedBy=multi-user.target",
        "User=mindrouter",
    ):
        assert key in text
    if shutil.which("systemd-analyze") is None:
        return
    try:
        run = subprocess.run(["systemd-analyze", "verify", str(UNIT)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return
    problems = [
        line
        for line in run.stderr.splitlines()
        if line.strip() and "is not executable" not in line and "man " not in line and "Failed to" not in line
    ]
    assert problems == [], problems


@pytest.mark.parametrize("path", [p for p, _ in leaf_commands()], ids=lambda p: " ".join(p))
def test_help_wraps_at_the_terminal_not_at_the_source_lines(path: tuple[str, ...]) -> None:
    """typer keeps a docstring's line breaks: at 80 columns ``mr model alias --help`` left "the alias, a" alone."""
    run = mr(*path, "--help", env={"COLUMNS": "80"})
    prose = [line.rstrip() for line in run.stdout.split("╭", 1)[0].splitlines()]
    for line, after in itertools.pairwise(prose):
        if line.strip() and after.strip():  # a paragraph goes on: the next word would not have fitted
            assert len(line) + 1 + len(after.split()[0]) > 78, f"{line!r} is broken before {after!r}"


def callbacks(app: typer.Typer = mr_app, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], object]:
    """Each leaf command's function, by its path, from typer's registry (its docstring is the help's source)."""
    out: dict[tuple[str, ...], object] = {}
    for info in app.registered_commands:
        name = info.name or typer.main.get_command_name(info.callback.__name__)  # type: ignore[union-attr]
        out[(*path, name)] = info.callback
    for group in app.registered_groups:
        out.update(callbacks(group.typer_instance, (*path, group.name or group.typer_instance.info.name)))  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize("path", [p for p, _ in leaf_commands()], ids=lambda p: " ".join(p))
def test_help_shows_the_brackets_its_source_has(path: tuple[str, ...]) -> None:
    """rich read ``[scheduler]`` in a docstring and ``[default: 8484]`` in an option's help as markup, and
    dropped them."""
    (cmd,) = [c for p, c in leaf_commands() if p == path]
    sources = [inspect.getdoc(callbacks()[path]) or ""]
    sources += [p.help.replace("\\[", "[") for p in cmd.params if getattr(p, "help", None)]  # type: ignore[attr-defined]
    shown = " ".join(mr(*path, "--help", env={"COLUMNS": "250"}).stdout.replace("│", " ").split())
    for source in sources:
        for piece in re.findall(r"\[[^\]\n]*\]", source):
            assert " ".join(piece.split()) in shown, f"{piece} is missing from mr {' '.join(path)} --help"
