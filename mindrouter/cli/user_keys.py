"""``mr user keys`` and ``mr user key``: list, create (shown once, or written to a 0600 file) and revoke API keys."""

from __future__ import annotations

import io
import os
import stat
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ..errors import MindRouterError
from ..formats import fmt_time
from . import _validate
from ._app import ConfigOption, JsonOption, UserName, get_app
from ._client import quote_name
from ._output import Column, err_console, print_changed, print_json, print_rows

__all__ = ["KEY_COLUMNS", "key", "keys"]


KEY_COLUMNS = [
    Column("id", "id", justify="right", style="bold"),
    Column("label", "label"),
    Column("prefix", "starts with"),
    Column("created", "created", fmt=fmt_time),
    Column("last_used", "last used", fmt=fmt_time),
]


def keys(ctx: typer.Context, name: UserName, json: JsonOption = False, config: ConfigOption = None) -> None:
    """List a user's API keys: id, first characters, created, last used; never the key itself.

    Revoke one with `mr user key NAME --revoke ID`.

    Example: mr user keys alice --json
    """
    rows = get_app(ctx, config).client.get(f"/admin/users/{quote_name(name)}/keys")
    print_rows(rows, KEY_COLUMNS, as_json=json, empty=f"{name} has no keys; create one with `mr user key {name}`")


def key(
    ctx: typer.Context,
    name: UserName,
    revoke: Annotated[
        str | None,
        typer.Option(
            "--revoke",
            metavar="KEY_ID",
            help="Revoke this key (an id from `mr user keys NAME`) instead of creating one.",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            metavar="FILE",
            help="Write the key to FILE, created with mode 0600 (never overwriting one), instead of stdout.",
            show_default=False,
        ),
    ] = None,
    label: Annotated[
        str | None,
        typer.Option(
            "--label",
            metavar="TEXT",
            help="Name the new key (laptop, open-webui), so `mr user keys` tells it from the others.",
            show_default=False,
        ),
    ] = None,
    json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Create a new API key for a user and print it once; it cannot be shown again.

    The key goes in the client's Authorization header (OPENAI_API_KEY for
    OpenAI clients). Earlier keys of the user stay valid. With -o FILE the
    key goes into a new file only its owner can read. With --revoke ID,
    that key alone stops working; the user and its other keys stay.

    Example: mr user key alice --label laptop -o alice.key
    """
    body = {} if label is None else {"label": label}
    if revoke is not None:
        key_id = _validate.key_id(revoke)
        answer = get_app(ctx, config).client.delete(f"/admin/users/{quote_name(name)}/keys/{key_id}")
        print_changed(answer, json, f"revoked key {key_id} of user [bold]{escape(name)}[/]; its other keys still work")
        return
    if output is not None:
        _key_to_file(get_app(ctx, config), name, output, body)
        return
    private = _private_stdout()
    answer = get_app(ctx, config).client.post(f"/admin/users/{quote_name(name)}/keys", body)
    if json:
        print_json({"user": answer.get("user", name), "key": answer["key"]})
    else:
        sys.stdout.write(f"{answer['key']}\n")
        sys.stdout.flush()
    if private:
        err_console().print(f"[dim]new key for {escape(name)}; the file it went to is now mode 0600[/]")
    elif not json:
        err_console().print(f"[dim]new key for {escape(name)}; store it now, it is shown only once[/]")


def _private_stdout() -> bool:
    """Make stdout private where it is a file other accounts can read: True if it was made so.

    ``mr user key alice > alice.key`` gets a file the shell created with its umask (0644
    by default) before mr ran; the key must not stay readable by every local account.
    """
    try:
        fd = sys.stdout.fileno()
        mode = os.fstat(fd).st_mode
    except (OSError, ValueError, io.UnsupportedOperation):  # not a real file (a test's capture, a closed stream)
        return False
    if not stat.S_ISREG(mode) or not mode & 0o077:
        return False
    try:
        os.fchmod(fd, stat.S_IMODE(mode) & 0o700)
    except OSError as exc:
        raise MindRouterError(
            f"stdout is a file other accounts can read and cannot be made private ({exc.strerror});"
            " write the key with -o FILE instead"
        ) from None
    return True


def _key_to_file(app: Any, name: str, path: Path, body: dict[str, str]) -> None:
    """Create the file first (0600, exclusive), so a key is made only when it has somewhere safe to go."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise MindRouterError(f"{path} already exists; remove it or name a new file with -o") from None
    except OSError as exc:
        raise MindRouterError(f"cannot write {path}: {exc.strerror}; name a file in a folder you can write") from None
    try:
        answer = app.client.post(f"/admin/users/{quote_name(name)}/keys", body)
        os.write(fd, f"{answer['key']}\n".encode())
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
    err_console().print(f"[dim]new key for {escape(name)} written to {escape(str(path))} (mode 0600)[/]")
