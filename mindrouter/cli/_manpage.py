"""Build man/mr.1 from typer's own command tree, so the page cannot drift from the code.

Since typer 0.26 vendors its own click, click-man cannot see typer's options;
instead this walks ``typer.main.get_command(app)`` (the same objects that
parse the command line and print ``--help``) and writes roff. A test
compares the result with the checked-in page; after changing a command run::

    python -m mindrouter.cli._manpage -o man/mr.1
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer.main
from rich.text import Text

from .. import __version__

__all__ = ["command_paths", "main", "render"]

ENVIRONMENT = [
    ("MR_CONFIG", "The settings file, when \\fB\\-\\-config\\fR is not given."),
    (
        "SCHEDULER_WEIGHT_<GROUP>",
        "Fallback weight of a group that has none of its own (student 1, staff 2, faculty 3, admin 10).",
    ),
    (
        "SCHEDULER_FAIRNESS_WINDOW, SCHEDULER_DEPRIORITIZE_THRESHOLD, SCHEDULER_SCORE_*",
        "Override the matching settings of the file (see \\fBmr config show\\fR).",
    ),
    ("NO_COLOR", "Print tables without colour. Colour is also left out when standard output is not a terminal."),
    ("COLUMNS", "Width of tables when standard output is not a terminal (default 200)."),
]

EXIT_STATUS = [
    ("0", "Success."),
    ("1", "An error: a refused change, an unknown group, user or backend, a bad settings file."),
    ("2", "Bad command-line input (a weight of 0, a URL that is not http(s), ...); nothing was changed."),
    ("3", "The daemon cannot be reached on its admin socket; is \\fBmr serve\\fR running?"),
]


def _esc(text: str) -> str:
    """Escape text for roff, with `code` in bold."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    text = re.sub(r"`([^`]+)`", r"\\fB\1\\fR", text)
    return text


def _line(text: str) -> str:
    """One roff text line (a leading . or ' would be read as a request)."""
    return "\\&" + text if text[:1] in (".", "'") else text


def _plain(markup: str) -> str:
    """What ``--help`` shows of a help text, which typer reads as rich markup (``\\[store]`` shows ``[store]``)."""
    return Text.from_markup(markup).plain


def _paragraphs(help_text: str) -> list[str]:
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", _plain(help_text).strip()) if p.strip()]


def command_paths(group: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every leaf command as (("group", "add"), command), in ``mr --help`` order."""
    for name, cmd in group.commands.items():
        if getattr(cmd, "hidden", False):
            continue
        if hasattr(cmd, "commands"):
            yield from command_paths(cmd, (*prefix, name))
        else:
            yield (*prefix, name), cmd


def _metavar(param: Any) -> str:
    if getattr(param, "is_flag", False):
        return ""
    return param.metavar or param.name.upper()


def _usage(path: tuple[str, ...], cmd: Any) -> str:
    parts = [f"\\fBmr {' '.join(path)}\\fR"]
    for p in cmd.params:
        if p.param_type_name == "argument":
            meta = _esc(_metavar(p))
            parts.append(f"\\fI{meta}\\fR" if p.required else f"[\\fI{meta.strip('[]')}\\fR]")
    if any(p.param_type_name == "option" for p in cmd.params):
        parts.append("[\\fIOPTIONS\\fR]")
    return " ".join(parts)


def _options(params: list[Any]) -> list[str]:
    out: list[str] = []
    for p in params:
        if p.param_type_name != "option" or getattr(p, "hidden", False):
            continue
        names = ", ".join(f"\\fB{_esc(o)}\\fR" for o in [*p.opts, *p.secondary_opts])
        meta = _metavar(p)
        out += [".TP", f"{names}" + (f" \\fI{_esc(meta)}\\fR" if meta else "")]
        text = _plain(p.help or "")
        default = p.default
        if (
            getattr(p, "show_default", False)
            and default not in (None, False, "", ())
            and not getattr(p, "is_flag", False)
        ):
            text += f" Default: {default}."
        out.append(_line(_esc(text)))
    return out


def _arguments(params: list[Any]) -> list[str]:
    out: list[str] = []
    for p in params:
        if p.param_type_name == "argument":
            out += [".TP", f"\\fI{_esc(_metavar(p).strip('[]'))}\\fR", _line(_esc(_plain(p.help or "")))]
    return out


def _help_body(help_text: str) -> list[str]:
    out: list[str] = []
    for para in _paragraphs(help_text):
        if para.startswith("Example:"):
            out += [".PP", "Example:", ".RS", ".EX", _line(_esc(para[len("Example:") :].strip())), ".EE", ".RE"]
        else:
            out += [".PP", _line(_esc(para))]
    return out


def render(app: typer.Typer | None = None) -> str:
    """The man page of ``mr`` as roff text (deterministic: no date, no terminal width)."""
    if app is None:
        from . import app as mr_app

        app = mr_app
    root = typer.main.get_command(app)
    summary = _paragraphs(root.help or "")[0] if root.help else "mindrouter"
    lines = [
        f'.TH MR 1 "" "mindrouter {__version__}" "mindrouter manual"',
        '.\\" Generated by `python -m mindrouter.cli._manpage -o man/mr.1`; do not edit by hand.',
        ".SH NAME",
        f"mr \\- {_esc(summary.removeprefix('mindrouter: '))}",
        ".SH SYNOPSIS",
        "\\fBmr\\fR [\\fB\\-\\-config\\fR \\fIFILE\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]...",
        ".SH DESCRIPTION",
        _line(
            _esc(
                "mindrouter pools the GPUs of a lab's workstations behind one OpenAI- and Ollama-compatible endpoint "
                "and shares them fairly between people. `mr serve` runs the daemon; every other command except "
                "`mr gpu`, `mr agent`, `mr simulate` and `mr config` talks to it over its admin Unix socket, "
                "prints a table for people or JSON with --json, and exits with the status below."
            )
        ),
        ".SH GLOBAL OPTIONS",
        *_options(root.params),
    ]
    if root.epilog:
        lines += _help_body(root.epilog)
    lines.append(".SH COMMANDS")
    for path, cmd in command_paths(root):
        lines += [f".SS {' '.join(path)}", ".PP", _usage(path, cmd)]
        lines += _help_body(cmd.help or "")
        args = _arguments(cmd.params)
        if args:
            lines += [".PP", "Arguments:", ".RS", *args, ".RE"]
        opts = _options(cmd.params)
        if opts:
            lines += [".PP", "Options:", ".RS", *opts, ".RE"]
    lines.append(".SH EXIT STATUS")
    for code, meaning in EXIT_STATUS:
        lines += [".TP", f"\\fB{code}\\fR", meaning]
    lines.append(".SH ENVIRONMENT")
    for name, meaning in ENVIRONMENT:
        lines += [".TP", f"\\fB{_esc(name)}\\fR", meaning]
    lines += [
        ".SH FILES",
        ".TP",
        "\\fI$XDG_CONFIG_HOME/mindrouter/config.toml\\fR",
        "The settings (\\fBmr config path\\fR prints where; \\fBmr config init\\fR writes a commented one).",
        ".TP",
        "\\fI$XDG_RUNTIME_DIR/mindrouter/mr.sock\\fR",
        "The daemon's admin socket (mode 0600), unless [server] socket says otherwise.",
        ".TP",
        "\\fI$XDG_DATA_HOME/mindrouter/\\fR",
        "The SQLite state: groups, users, keys, backends, usage and decisions.",
        ".SH SHELL COMPLETION",
        "\\fBmr \\-\\-install\\-completion\\fR installs completion for the current shell (bash, zsh, fish); "
        "names of groups, users and backends are completed from the running daemon.",
        ".SH SEE ALSO",
        "\\fBsshare\\fR(1), \\fBsprio\\fR(1), \\fBsystemd.service\\fR(5)",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mindrouter.cli._manpage", description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, help="write the page here instead of stdout")
    parser.add_argument("--check", action="store_true", help="exit 1 if --output differs from what would be written")
    args = parser.parse_args(argv)
    text = render()
    if args.output is None:
        sys.stdout.write(text)
        return 0
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(
                f"{args.output} is out of date; run python -m mindrouter.cli._manpage -o {args.output}", file=sys.stderr
            )
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
