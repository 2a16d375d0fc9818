"""A throwaway PostgreSQL for the ``postgres`` tests: Debian's server, initdb'd into a temporary folder.

The cluster listens only on a unix socket in its own folder (and its own port number, which names the
socket), trusts local connections, skips fsync, and is stopped at the end of the session. PostgreSQL
will not run as root, so under root (CI, this container) it runs as ``nobody``. Each test gets a
database of its own (``pg_url``). Without the server's binaries the tests skip and say how to get them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["PgCluster", "pg_bin"]

_BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


def pg_bin() -> Path | None:
    """The folder with ``initdb`` and ``pg_ctl`` (the newest Debian install, else on PATH), or None."""
    for folder in _BIN_DIRS:
        if (folder / "initdb").exists() and (folder / "pg_ctl").exists():
            return folder
    found = shutil.which("pg_ctl")
    return Path(found).parent if found and shutil.which("initdb") else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PgCluster:
    """A running cluster: ``url(db)`` connects to database ``db`` on it."""

    folder: Path
    port: int
    _names = itertools.count()

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://mr@/{db}?host={self.folder}&port={self.port}"

    def new_database(self) -> str:
        """A fresh empty database's url."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)


def _as_owner(argv: list[str]) -> list[str]:
    """Run as ``nobody`` when we are root (PostgreSQL refuses root)."""
    return ["runuser", "-u", "nobody", "--", *argv] if os.geteuid() == 0 else argv


@contextlib.contextmanager
def pg_cluster() -> Iterator[PgCluster]:
    """Start a cluster in a temporary folder; stop it and remove the folder afterwards."""
    binaries = pg_bin()
    if binaries is None:
        pytest.skip("PostgreSQL's server is not installed (apt-get install postgresql); the postgres tests need it")
    folder = Path(tempfile.mkdtemp(prefix="mr-pg-"))
    if os.geteuid() == 0:
        os.chown(folder, *_nobody())
    data = folder / "data"
    port = _free_port()
    try:
        subprocess.run(
            _as_owner([str(binaries / "initdb"), "-D", str(data), "-U", "mr", "--auth=trust", "-E", "UTF8", "-N"]),
            check=True,
            capture_output=True,
        )
        options = f"-p {port} -k {folder} -c listen_addresses='' -c fsync=off -c full_page_writes=off"
        subprocess.run(
            _as_owner(
                [str(binaries / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(folder / "log"), "-w", "start"]
            ),
            check=True,
            capture_output=True,
        )
        yield PgCluster(folder, port)
    finally:
        subprocess.run(
            _as_owner([str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]), capture_output=True
        )
        shutil.rmtree(folder, ignore_errors=True)


def _nobody() -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid
