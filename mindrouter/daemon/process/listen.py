"""Whether ``mr serve`` can listen on its port, asked before it makes anything.

The state folder, the database's default groups and their log lines, and the socket all came before
the TCP site found the port taken; a probe bound and let go at once (as asyncio binds: ``SO_REUSEADDR``,
IPv6 sockets IPv6-only) says so first. The site still reports a port taken in between.
"""

from __future__ import annotations

import errno
import socket

from ...errors import ConfigError

__all__ = ["port_taken", "refuse_a_busy_port"]


def port_taken(host: str, port: int) -> ConfigError:
    """The one sentence for a port another process listens on."""
    return ConfigError(f"port {port} on {host} is already in use; stop the other server or pass --port")


def refuse_a_busy_port(host: str, port: int) -> None:
    """Raise ``port_taken`` when another process listens on ``host:port``.

    Raises:
        ConfigError: the port is taken. Other errors (an unknown host) are left for the site to report.
    """
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise port_taken(host, port) from None
                return
