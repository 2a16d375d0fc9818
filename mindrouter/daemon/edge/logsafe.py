"""Client-chosen text made safe for one log line.

A model name or path is the client's to choose; written verbatim, a newline
in it forges a log line of the client's making. :func:`safe` escapes control
and non-printable characters (as ``repr`` would) and bounds the length
(it is :func:`mindrouter.reported.shown`, the one rule for text shown anywhere);
:class:`OneLineFormatter` applies it to every line the daemon logs, so no
call site can forget. :class:`Occasional` bounds how often one kind of line
that a client can cause is written.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from ...reported import shown as safe

__all__ = ["Occasional", "OneLineFormatter", "safe"]


class OneLineFormatter(logging.Formatter):
    """Every log record's message on one line, whatever a client put into its arguments.

    Tracebacks (``exc_info``) still follow on their own lines: they are the daemon's, not a client's.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        return safe(super().formatMessage(record), limit=4000)


class Occasional:
    """One kind of event logged at most once per ``every`` seconds, each line saying how many went unlogged.

    For what anyone can cause without a key (a malformed request, a body that does not match its
    Content-Encoding): one line a minute says it happens, and a flood of them cannot fill the disk.
    """

    def __init__(self, logger: logging.Logger, every: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.logger = logger
        self.every = every
        self.clock = clock
        self._next = -math.inf
        self._unlogged = 0

    def info(self, message: str, *args: object) -> None:
        now = self.clock()
        if now < self._next:
            self._unlogged += 1
            return
        if self._unlogged:
            message += f" ({self._unlogged:,} more like it in the last {self.every:g} s were not logged)"
        self._next, self._unlogged = now + self.every, 0
        self.logger.info(message, *args)
