"""A small synchronous client for the daemon's admin API on its Unix socket.

The CLI makes one or two calls per command, so the standard library's
``http.client`` over ``AF_UNIX`` is enough: no event loop, no new dependency.
Every failure is turned into a mindrouter error at this one boundary
(``raise … from exc``): a socket that does not answer becomes
``DaemonUnreachable`` (exit 3), an HTTP error status becomes ``RequestError``
carrying the daemon's own sentence (exit 1).
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import json
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from ..errors import DaemonUnreachable, RequestError

__all__ = ["AdminClient", "quote_name"]


def quote_name(name: str) -> str:
    """Quote a group, user or backend name for use as one path segment."""
    return quote(str(name), safe="")


class _UnixConnection(http.client.HTTPConnection):
    """``HTTPConnection`` whose transport is a Unix stream socket."""

    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._unix_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class AdminClient:
    """Calls ``/admin/...`` on the daemon's socket; one connection per call.

    Args:
        socket_path: the admin socket (``[server] socket``).
        timeout: seconds to wait for the daemon to answer. Defaults to 30
            (``mr backend add`` waits for the backend's first probe).
    """

    def __init__(self, socket_path: str | Path, timeout: float | None = 30.0, origin: str = "") -> None:
        self.socket_path = str(socket_path)
        self.origin = origin
        """Where the socket path came from, for the message when nothing answers there."""
        self.timeout = timeout

    # -- the verbs ---------------------------------------------------------

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", _with_query(path, query))

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body)

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """Send one request and return the decoded JSON answer.

        Raises:
            DaemonUnreachable: nothing answers on the socket, or it hung up.
            RequestError: the daemon answered with an error status.
        """
        conn, resp = self._open(method, path, body)
        try:
            data = self._read(resp, method, path)
        finally:
            conn.close()
        if resp.status >= 400:
            raise self._error(resp.status, data, method, path)
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError as exc:
            raise RequestError(
                f"the daemon sent {method} {path} an answer that is not JSON; "
                f"is the socket {self.socket_path} really `mr serve`'s?",
                status=502,
            ) from exc

    def stream(self, path: str, **query: Any) -> Iterator[dict[str, Any]]:
        """Yield the JSON objects of an NDJSON stream, one per line, until the daemon closes it.

        Ctrl-C ends the stream by shutting its socket, and ``KeyboardInterrupt`` is raised here. The
        default handler raises it wherever the interpreter happens to be, and inside a finalizer
        Python reports it as ignored and the read goes on.

        Raises:
            DaemonUnreachable, RequestError: as ``request``.
            KeyboardInterrupt: Ctrl-C (SIGINT) while streaming.
        """
        target = _with_query(path, query)
        conn, resp = self._open("GET", target, None, timeout=None)
        interrupted = False

        def on_sigint(_signum: int, _frame: Any) -> None:
            nonlocal interrupted
            interrupted = True
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)

        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, on_sigint) if main else None
        try:
            if resp.status >= 400:
                raise self._error(resp.status, self._read(resp, "GET", target), "GET", target)
            while True:
                try:
                    line = resp.readline()
                except (OSError, http.client.HTTPException) as exc:
                    if interrupted:
                        raise KeyboardInterrupt from None
                    raise DaemonUnreachable(
                        f"the daemon at {self.socket_path} closed the stream ({_reason(exc)}); "
                        "run the command again once `mr serve` is back"
                    ) from exc
                if interrupted:
                    raise KeyboardInterrupt
                if not line:
                    return
                line = line.strip()
                if line:
                    try:
                        yield json.loads(line)
                    except ValueError:
                        continue  # a partial line from a daemon that is shutting down
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            conn.close()

    # -- plumbing ------------------------------------------------------------

    def _open(
        self, method: str, path: str, body: Any, timeout: float | str | None = "default"
    ) -> tuple[_UnixConnection, http.client.HTTPResponse]:
        conn = _UnixConnection(self.socket_path, self.timeout if timeout == "default" else timeout)  # type: ignore[arg-type]
        headers = {"Accept": "application/json"}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=payload, headers=headers)
            return conn, conn.getresponse()
        except PermissionError as exc:
            conn.close()
            raise DaemonUnreachable(
                f"no permission to use the daemon's socket {self.socket_path}; run mr as the user that runs "
                "`mr serve`, or as a member of its [server] socket_group"
            ) from exc
        except TimeoutError as exc:
            conn.close()
            raise DaemonUnreachable(
                f"the daemon at {self.socket_path} did not answer within {self.timeout:g} s; is `mr serve` stuck?"
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            where = f" ({self.origin})" if self.origin else ""
            raise DaemonUnreachable(
                f"cannot reach the daemon at {self.socket_path}{where}; is `mr serve` running? "
                "Point at another daemon with --config FILE or MR_CONFIG (its [server] socket)"
            ) from exc

    def _read(self, resp: http.client.HTTPResponse, method: str, path: str) -> bytes:
        try:
            return resp.read()
        except TimeoutError as exc:
            raise DaemonUnreachable(
                f"the daemon at {self.socket_path} did not finish answering {method} {path} within {self.timeout:g} s"
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise DaemonUnreachable(
                f"the daemon at {self.socket_path} hung up while answering {method} {path}; "
                "is `mr serve` still running?"
            ) from exc

    def _error(self, status: int, data: bytes, method: str, path: str) -> RequestError:
        message = code = None
        kind = "server_error" if status >= 500 else "invalid_request_error"
        try:
            body = json.loads(data)
            err = body.get("error") if isinstance(body, dict) else None
            if isinstance(err, dict):
                message, code, kind = err.get("message"), err.get("code"), err.get("type") or kind
            elif isinstance(err, str):
                message = err
        except ValueError:
            pass
        if not message:
            text = data.decode("utf-8", "replace").strip().splitlines()
            detail = f": {text[0][:200]}" if text else ""
            message = f"the daemon answered {method} {path} with HTTP {status}{detail}"
        return RequestError(str(message), status=status, type=str(kind), code=code)


def _with_query(path: str, query: dict[str, Any]) -> str:
    params = {k: v for k, v in query.items() if v is not None}
    return f"{path}?{urlencode(params)}" if params else path


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return type(exc).__name__
