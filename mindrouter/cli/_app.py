"""The ``Application`` in ``ctx.obj``: the global options and a lazily made admin client.

As in hatch, the root callback turns ``--config`` into one object that every
command reaches through its context, so no command reads settings or opens a
socket on its own, and ``mr config path`` works even when the file is broken.
Commands also accept ``--config`` after their own name (``mr status --config
F``), because DESIGN §5 promises it on every command; that value wins.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ..config import Config, config_path, load_config
from ..daemon.process.statelock import StateLock
from ._client import AdminClient

__all__ = ["Application", "ConfigOption", "JsonOption", "UserName", "complete_from", "get_app", "install"]


@dataclass
class Application:
    """What a command needs from the global options."""

    config_arg: Path | None = None
    """``--config`` as given; None means ``$MR_CONFIG`` or the user config dir."""
    _config: Config | None = field(default=None, repr=False)
    _client: AdminClient | None = field(default=None, repr=False)

    @property
    def config_file(self) -> Path:
        return config_path(self.config_arg)

    @property
    def config(self) -> Config:
        """The effective settings (read once). Raises ConfigError for a bad file."""
        if self._config is None:
            self._config = load_config(self.config_arg, must_exist=self.config_arg is not None)
        return self._config

    @property
    def client(self) -> AdminClient:
        """The admin client for the configured socket (made on first use)."""
        if self._client is None:
            path, origin = self.socket()
            self._client = AdminClient(path, origin=origin)
        return self._client

    def socket(self) -> tuple[Path, str]:
        """The admin socket to use and where its path came from.

        With no ``[server] socket`` set, the default path depends on
        ``XDG_RUNTIME_DIR``, which sudo, cron and services do not carry; the
        daemon writes its socket into its state lock, so that is tried next.
        """
        config = self.config
        server = config.server
        where = f"from {config.path}" if config.path else "no config file; the default"
        if server.socket:
            return server.socket_path, f"[server] socket {where}"
        path = server.socket_path
        if not path.exists():
            running = StateLock.holder(server.state_path).get("socket")
            if isinstance(running, str) and Path(running).exists():
                return Path(running), f"named by the daemon's lock in {server.state_path}"
        return path, f"{where} socket, as no [server] socket is set"

    def use_config(self, path: Path | None) -> None:
        """Apply a command-level ``--config``; forgets settings read from another file."""
        if path is not None and path != self.config_arg:
            self.config_arg = path
            self._config = None
            self._client = None


ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        metavar="FILE",
        help="Settings file (also $MR_CONFIG); it names the daemon's socket.",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def get_app(ctx: typer.Context, config: Path | None = None) -> Application:
    """The ``Application`` of this invocation, with a command-level ``--config`` applied."""
    root = ctx.find_root()
    if not isinstance(root.obj, Application):
        root.obj = Application()
    root.obj.use_config(config)
    return root.obj


def _root(ctx: typer.Context, config: ConfigOption = None) -> None:
    """Set up the ``Application`` every command reads from ``ctx.obj``."""
    ctx.obj = Application(config_arg=config)


ROOT_EPILOG = (
    "Run `mr COMMAND --help` for a command's options and an example.\n\nExample: mr --config ~/lab.toml status"
)


def install(app: typer.Typer) -> None:
    """Make ``_root`` the app's callback (global ``--config``, ``ctx.obj``), and every docstring prose."""
    app.callback(epilog=ROOT_EPILOG)(_root)
    _as_prose(app)


def _as_prose(app: typer.Typer) -> None:
    """Each command's docstring as ``--help`` is to show it: paragraphs the terminal wraps, brackets kept.

    typer keeps a docstring's single line breaks after its first paragraph, so a source line
    of 95 characters broke at 80 columns into a full line and a stub, and reads the text as
    rich markup, so ``[scheduler]`` vanished from ``mr simulate --help``. A docstring is
    prose: each paragraph becomes one line, escaped (``_manpage`` reads the markup back).
    """
    for info in app.registered_commands:
        doc = info.help or inspect.getdoc(info.callback)
        if doc:
            info.help = "\n\n".join(escape(" ".join(p.split())) for p in doc.split("\n\n"))
    for group in app.registered_groups:
        if group.typer_instance is not None:
            _as_prose(group.typer_instance)


def complete_from(path: str, key: str = "name") -> Any:
    """A shell-completion function offering the names the daemon lists at ``path``.

    Completion must never hang or fail loudly, so it uses a one-second
    timeout and offers nothing when the daemon is away.
    """

    def complete(ctx: typer.Context, incomplete: str) -> list[str]:
        try:
            root = ctx.find_root()
            app = root.obj if isinstance(root.obj, Application) else Application(config_arg=root.params.get("config"))
            rows = AdminClient(app.socket()[0], timeout=1.0).get(path)
            return [str(r[key]) for r in rows if str(r.get(key, "")).startswith(incomplete)]
        except Exception:
            return []

    return complete


#: A user's name, as ``mr user`` commands take it (completed from the daemon's users).
UserName = Annotated[
    str,
    typer.Argument(
        metavar="NAME", help="The user's name.", autocompletion=complete_from("/admin/users"), show_default=False
    ),
]
