"""``mr store migrate``: move a pool's whole state between SQLite and PostgreSQL; needs no daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..daemon.process.statelock import StateLock
from ..errors import ConfigError
from ..store import Store
from ..store.copy import copy_store
from ..store.dialect import is_postgres_url
from ._app import ConfigOption, get_app

__all__ = ["register"]

store_app = typer.Typer(name="store", help="Move the pool's state between SQLite and PostgreSQL.", no_args_is_help=True)


def _open(where: str) -> Store:
    """A store at a ``postgresql://`` url or an SQLite file."""
    return Store(Path(where), url=where) if is_postgres_url(where) else Store(Path(where))


@store_app.command("migrate")
def migrate(
    ctx: typer.Context,
    to: Annotated[
        str,
        typer.Option(
            "--to", metavar="URL_OR_FILE", help="An empty PostgreSQL database (postgresql://...) or SQLite file."
        ),
    ],
    source: Annotated[
        str | None,
        typer.Option(
            "--from",
            metavar="URL_OR_FILE",
            help="Where the state is now. Defaults to the config's: \\[store] url, else mindrouter.db in state_dir.",
            show_default=False,
        ),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Copy the whole state (groups, users, keys, quotas, backends, usage, decisions) into an empty database.

    Stop `mr serve` first. Then set [store] url to the new database (or empty it to go back to SQLite)
    and start it again; the old state stays as it was.

    Example: mr store migrate --to postgresql://mindrouter@db.lab:5432/mindrouter
    """
    settings = get_app(ctx, config).config
    lock = None
    if source is None:
        source = settings.store.url or str(settings.server.state_path / "mindrouter.db")
        if not settings.store.url:
            lock = StateLock(settings.server.state_path)
            lock.acquire(command="mr store migrate")  # refuses while mr serve runs on this state
    if not is_postgres_url(source) and not Path(source).exists():
        raise ConfigError(f"there is no state database at {source}; name it with --from FILE")
    if not is_postgres_url(to) and Path(to).exists():
        raise ConfigError(f"{to} exists already; name a new file, so nothing in it is overwritten")
    try:
        with _open(source) as old, _open(to) as new:
            counts = copy_store(old, new, lambda table, rows: typer.echo(f"{table}: {rows} rows"))
    finally:
        if lock is not None:
            lock.release()
    typer.echo(f"copied {sum(counts.values())} rows into {to}; point [store] url at it and start mr serve")


def register(app: typer.Typer) -> None:
    app.add_typer(store_app)
