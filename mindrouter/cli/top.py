"""``mr top``: the live view of the pool, redrawn about once a second.

This module is the I/O shell: it polls ``/admin/top``, reads keys, and hands
each answer and the terminal size to ``_top_view.render_top``, the pure
function that draws the frame. rich's ``Live`` on the alternate screen
redraws in place (no clearing, so no flicker) and puts the terminal back on
exit. Keys are read in cbreak mode only while stdin is a terminal, and the
old terminal settings are restored in ``finally`` whatever happens.
"""

from __future__ import annotations

import math
import os
import select
import shutil
import signal
import sys
import time
from types import TracebackType
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live

from ..errors import DaemonUnreachable, RequestError, UsageError
from ._app import ConfigOption, get_app
from ._client import AdminClient
from ._output import print_json
from ._top_view import render_top

__all__ = ["KeyReader", "poll", "register"]

#: What ``KeyReader.read`` returns when the terminal was resized.
RESIZE = "\x00resize"
#: Seconds one poll may take before the daemon counts as away (keeps `q` responsive).
POLL_TIMEOUT = 2.0


class KeyReader:
    """Single keys from a terminal stdin in cbreak mode (Ctrl-C still interrupts); a plain wait otherwise."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = sys.stdin if stream is None else stream
        self._fd: int | None = None
        self._saved: Any = None
        self._wake: tuple[int, int] | None = None
        self._old_winch: Any = None

    def __enter__(self) -> KeyReader:
        try:
            fd = self.stream.fileno()
            tty_in = os.isatty(fd)
        except (AttributeError, OSError, ValueError):
            tty_in = False
        if tty_in:
            import termios
            import tty

            self._saved = termios.tcgetattr(fd)
            tty.setcbreak(fd, termios.TCSANOW)
            self._fd = fd
        try:
            r, w = os.pipe()
            os.set_blocking(w, False)
            self._wake = (r, w)
            self._old_winch = signal.signal(signal.SIGWINCH, self._on_winch)
        except (ValueError, OSError, AttributeError):  # not the main thread, or no SIGWINCH here
            self._old_winch = None
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._fd is not None:
            import termios

            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
            self._fd = None
        if self._old_winch is not None:
            signal.signal(signal.SIGWINCH, self._old_winch)
            self._old_winch = None
        if self._wake is not None:
            for fd in self._wake:
                os.close(fd)
            self._wake = None

    def _on_winch(self, signum: int, frame: Any) -> None:
        if self._wake is not None:
            try:
                os.write(self._wake[1], b"w")
            except OSError:
                pass

    def read(self, timeout: float) -> str | None:
        """The next key, ``RESIZE``, or None when ``timeout`` seconds pass first."""
        fds = [fd for fd in (self._fd, self._wake[0] if self._wake else None) if fd is not None]
        if not fds:
            time.sleep(max(0.0, timeout))
            return None
        ready, _, _ = select.select(fds, [], [], max(0.0, timeout))
        if self._wake is not None and self._wake[0] in ready:
            os.read(self._wake[0], 64)
            return RESIZE
        if self._fd is not None and self._fd in ready:
            data = os.read(self._fd, 1)
            return data.decode("utf-8", "replace") if data else None
        return None


def poll(client: AdminClient) -> tuple[dict[str, Any] | None, str | None]:
    """One ``/admin/top`` answer, or None and the sentence to show instead."""
    try:
        return client.get("/admin/top"), None
    except DaemonUnreachable:
        return None, f"daemon not reachable at {client.socket_path} — retrying"
    except RequestError as exc:
        return None, f"the daemon answered with an error ({exc}) — retrying"


def _interval(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise UsageError(f"--interval {value!r} is not a number of seconds; use a number such as 1 or 0.5") from None
    if not math.isfinite(seconds) or seconds < 0.2:
        raise UsageError(f"--interval {value!r} must be at least 0.2 seconds, such as 1")
    return seconds


def top(
    ctx: typer.Context,
    once: Annotated[
        bool,
        typer.Option("--once", help="Print one frame and exit (what happens anyway when stdout is not a terminal)."),
    ] = False,
    interval: Annotated[
        str, typer.Option("--interval", "-i", metavar="SECONDS", help="Seconds between refreshes.")
    ] = "1",
    json: Annotated[bool, typer.Option("--json", help="Print the /admin/top answer as JSON once and exit.")] = False,
    config: ConfigOption = None,
) -> None:
    """Watch the pool live: backends, GPUs, the queue, fair share and the last decisions.

    Quits on q or Ctrl-C. When the daemon goes away the view says so and
    reconnects by itself when it is back.

    Example: mr top
    """
    seconds = _interval(interval)
    app = get_app(ctx, config)
    socket, origin = app.socket()
    client = AdminClient(socket, timeout=POLL_TIMEOUT, origin=origin)
    out = Console(highlight=False)
    if json or once or not out.is_terminal:
        data = client.get("/admin/top")  # daemon away: exit 3 with the sentence, as scripts expect
        if json:
            print_json(data)
            return
        columns, lines = shutil.get_terminal_size((120, 50))
        frame = Console(width=columns, highlight=False) if not out.is_terminal else out
        frame.print(render_top(data, columns, lines, socket=str(socket), now=time.time()))
        return
    try:
        _live(client, out, seconds)
    except KeyboardInterrupt:
        return


def _live(client: AdminClient, out: Console, seconds: float) -> None:
    data: dict[str, Any] | None = None
    error: str | None = None

    def frame() -> Any:
        width, height = out.size
        return render_top(data, width, height, socket=client.socket_path, error=error, now=time.time())

    with (
        KeyReader() as keys,
        Live(console=out, screen=True, auto_refresh=False, redirect_stdout=False, redirect_stderr=False) as live,
    ):
        while True:
            fresh, error = poll(client)
            data = fresh if fresh is not None else data
            live.update(frame(), refresh=True)
            deadline = time.monotonic() + seconds
            while (left := deadline - time.monotonic()) > 0:
                key = keys.read(left)
                if key in ("q", "Q"):
                    return
                if key == RESIZE:
                    live.update(frame(), refresh=True)


def register(app: typer.Typer) -> None:
    app.command("top")(top)
