"""``mr config init | show | path``: write, inspect and locate the settings file.

``init`` writes every setting commented out at its default, each with the
sentence from the settings dataclass's field docstring (read from the source
with ``ast``, so the file explains exactly what the code does), values
written by tomli-w so their TOML is always valid.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import os
import re
import sys
import tempfile
import textwrap
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import tomli_w
import typer
from rich.markup import escape

from .. import __version__ as VERSION
from ..config import BackendSettings, Config, ServerSettings, StoreSettings
from ..errors import MindRouterError
from ..scheduler.settings import SchedulerSettings, ScoreWeights
from ._app import ConfigOption, JsonOption, get_app
from ._output import console, print_json

__all__ = ["config_app", "effective_settings", "field_docs", "register", "render_config"]

config_app = typer.Typer(name="config", help="Write, show and locate the settings file.", no_args_is_help=True)

#: Sections of config.toml and the dataclass that reads each.
SECTIONS: list[tuple[str, type]] = [
    ("server", ServerSettings),
    ("scheduler", SchedulerSettings),
    ("scheduler.scores", ScoreWeights),
    ("backends", BackendSettings),
    ("store", StoreSettings),
]

#: Fields config.toml cannot set (they come from elsewhere).
_NOT_IN_FILE = {"scheduler": {"scores", "group_weights"}}

#: Example values shown for settings that are unset by default.
_UNSET_EXAMPLES: dict[str, Any] = {"return_credit": 2048.0, "return_debt": 8192.0, "max_slot_share": 0.75}


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass (the string literal after each field)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):  # no source shipped: settings go undocumented
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            )
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _fields(section: str, cls: type) -> list[dataclasses.Field[Any]]:
    skip = _NOT_IN_FILE.get(section, set())
    return [f for f in dataclasses.fields(cls) if f.name not in skip]


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[operator]


def _value_line(key: str, value: Any) -> str:
    return tomli_w.dumps({key: value}).strip()


def render_config(config: Config | None = None, *, here: bool = True) -> str:
    """The text of a commented config.toml with every setting at its default.

    Args:
        config: where to read the resolved socket and state paths for the
            comments; defaults to plain defaults.
        here: name this machine's paths and the version; False gives the
            generic config.example.toml.
    """
    server = config.server if config else ServerSettings()
    lines = [
        f"# mindrouter settings, written by `mr config init` (mindrouter {VERSION})."
        if here
        else "# mindrouter settings: config.example.toml, written by `python -m mindrouter.cli.config_cmd`.",
        "# Every key is optional: each is shown commented out at its default.",
        '# Remove the leading "# " of a line to change that setting.',
        "# SCHEDULER_* environment variables override this file; `mr config show`",
        "# prints the settings in effect.",
    ]
    for section, cls in SECTIONS:
        lines += ["", f"[{section}]"]
        docs = field_docs(cls)
        for i, f in enumerate(_fields(section, cls)):
            if i:
                lines.append("")
            doc = docs.get(f.name, "")
            if here and section == "server" and f.name == "socket":
                doc += f" Here that is {server.socket_path}."
            if here and section == "server" and f.name == "state_dir":
                doc += f" Here that is {server.state_path}."
            for text in textwrap.wrap(doc, 76):
                lines.append(f"# {text}")
            value = _default(f)
            if value is None:
                lines.append("# Not set by default; for example:")
                lines.append(f"# {_value_line(f.name, _UNSET_EXAMPLES.get(f.name, 1.0))}")
            else:
                lines.append(f"# {_value_line(f.name, value)}")
    return "\n".join(lines) + "\n"


def effective_settings(config: Config) -> dict[str, Any]:
    """The settings in effect as plain data, the keys masked."""
    out: dict[str, Any] = {"path": str(config.path) if config.path else None}
    objects = {
        "server": config.server,
        "scheduler": config.scheduler,
        "scheduler.scores": config.scheduler.scores,
        "backends": config.backends,
        "store": config.store,
    }
    for section, obj in objects.items():
        values = {f.name: getattr(obj, f.name) for f in _fields(section, type(obj))}
        if section == "server":
            for secret in ("admin_key", "metrics_key", "agent_key"):
                values[secret] = "********" if values[secret] else ""
            values["socket_path"] = str(config.server.socket_path)
            values["state_path"] = str(config.server.state_path)
        if section == "store":
            values["url"] = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1********@", values["url"])
        if section == "scheduler":
            values["group_weights"] = dict(config.scheduler.group_weights)
        if section == "scheduler.scores":
            out["scheduler"]["scores"] = values
        else:
            out[section] = values
    return out


@config_app.command("init")
def init(
    ctx: typer.Context,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    config: ConfigOption = None,
) -> None:
    """Write a commented config.toml with every setting at its default.

    It goes where `mr config path` says (--config or $MR_CONFIG to choose),
    and an existing file is kept unless --force is given.

    Example: mr config init && $EDITOR "$(mr config path)"
    """
    target = get_app(ctx, config).config_file
    if target.exists() and not force:
        raise MindRouterError(f"{target} already exists; keep it, or overwrite it with `mr config init --force`")
    text = render_config()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".config-", suffix=".toml", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o600)  # it may come to hold the admin key
        os.replace(tmp, target)
    except OSError as exc:
        raise MindRouterError(
            f"cannot write {target}: {exc.strerror or exc}; choose another place with --config"
        ) from exc
    console().print(f"wrote {escape(str(target))}")


_SECRETS = ("admin_key", "metrics_key", "agent_key")


def _section_values(data: dict[str, Any], section: str) -> dict[str, Any]:
    head, _, sub = section.partition(".")
    return data[head][sub] if sub else data[head]


def settings_toml(config: Config) -> str:
    """The settings in effect as a config.toml that loads back to them: a value that is not the default
    has the default in a comment beside it; a set secret and an unset value are comment lines."""
    data, defaults = effective_settings(config), effective_settings(Config())
    lines = [
        f"# settings in effect, from {data['path'] or 'defaults (no settings file)'}: defaults, then the file,",
        "# then SCHEDULER_* environment variables. A value that is not the default has the default beside it.",
    ]
    for section, cls in SECTIONS:
        values, before = _section_values(data, section), _section_values(defaults, section)
        lines += ["", f"[{section}]"]
        if section == "server":
            lines.append(f"# the socket in effect is {data['server']['socket_path']}")
            lines.append(f"# the state directory in effect is {data['server']['state_path']}")
        for f in _fields(section, cls):
            value, default = values[f.name], before[f.name]
            if section == "server" and f.name in _SECRETS and value:
                lines.append(f"# {f.name} is set (not shown)")
            elif value is None:
                lines.append(f"# {f.name} is not set")
            elif value == default:
                lines.append(_value_line(f.name, value))
            else:
                was = "not set" if default is None else _value_line(f.name, default).partition(" = ")[2]
                lines.append(f"{_value_line(f.name, value)}  # default: {was}")
    return "\n".join(lines) + "\n"


@config_app.command("show")
def show(ctx: typer.Context, json: JsonOption = False, config: ConfigOption = None) -> None:
    """Print the settings in effect: defaults, then the file, then the environment.

    The output is TOML that loads back to the same settings; a value that differs from its default
    has the default in a comment beside it.

    Example: mr config show --json
    """
    app = get_app(ctx, config)
    data = effective_settings(app.config)
    if json:
        print_json(data)
        return
    sys.stdout.write(settings_toml(app.config))


@config_app.command("path")
def path(ctx: typer.Context, json: JsonOption = False, config: ConfigOption = None) -> None:
    """Print where the settings file is (it need not exist yet).

    Example: mr config path
    """
    target: Path = get_app(ctx, config).config_file
    if json:
        print_json({"path": str(target), "exists": target.exists()})
        return
    print(target)


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")


if __name__ == "__main__":
    print(render_config(here=False), end="")
