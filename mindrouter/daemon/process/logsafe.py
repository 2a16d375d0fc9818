"""Client-chosen text made safe for one log line.

A model name or path is the client's to choose; written verbatim, a newline
in it forges a log line of the client's making. :func:`safe` escapes control
and non-printable characters (as ``repr`` would) and bounds the length
(it is :func:`mindrouter.reported.shown`, the one rule for text shown anywhere);
:class:`OneLineFormatter` applies it to every line the daemon logs, so no
call site can forget.
"""

from __future__ import annotations

import logging

from ...reported import shown as safe

__all__ = ["OneLineFormatter", "safe"]


class OneLineFormatter(logging.Formatter):
    """Every log record's message on one line, whatever a client put into its arguments.

    Tracebacks (``exc_info``) still follow on their own lines: they are the daemon's, not a client's.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        return safe(super().formatMessage(record), limit=4000)
