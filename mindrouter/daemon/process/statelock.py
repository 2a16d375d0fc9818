"""One daemon per state: an exclusive lock on ``state_dir/mr.lock``, taken before anything else.

Two daemons on one database would each restore usage, probe the backends and
hand out the same slots twice. The lock is ``flock``'d, so the kernel drops it
when its holder dies (a SIGKILL leaves no stale lock to clean up), and the
file names the holder so a refusal can say which daemon has the state.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import IO

from ...errors import ConfigError

__all__ = ["StateLock"]


class StateLock:
    """Held from :meth:`acquire` until :meth:`release` or the process's end.

    Args:
        state_dir: the folder of the state database; created (0700) if missing.
    """

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / "mr.lock"
        self._file: IO[str] | None = None

    def acquire(self, **about: object) -> None:
        """Take the lock and write ``about`` (pid, addresses) into it.

        Raises:
            ConfigError: another process holds it; the sentence names that daemon.
        """
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(
                f"cannot use the state folder {self.path.parent} ({exc.strerror or exc}); "
                "make it writable for this user or set [server] state_dir"
            ) from None
        file = os.fdopen(fd, "r+", encoding="utf-8")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = self._describe(file.read())
            file.close()
            raise ConfigError(
                f"another mr serve ({holder}) is using the state in {self.path.parent}; "
                "stop it first, or give this one its own [server] state_dir"
            ) from None
        file.seek(0)
        file.truncate()
        file.write(json.dumps({"pid": os.getpid(), **about}) + "\n")
        file.flush()
        self._file = file

    def release(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.truncate(0)
            self._file.close()  # closing the descriptor drops the flock
            self._file = None

    @staticmethod
    def holder(state_dir: Path) -> dict[str, object]:
        """What the daemon holding the lock in ``state_dir`` wrote (pid, listen, socket); empty if none."""
        try:
            info = json.loads((Path(state_dir) / "mr.lock").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return info if isinstance(info, dict) else {}

    @staticmethod
    def _describe(text: str) -> str:
        try:
            info = json.loads(text)
        except ValueError:
            return "pid unknown"
        if not isinstance(info, dict):
            return "pid unknown"
        parts = [f"pid {info.get('pid', '?')}"]
        parts += [str(info[k]) for k in ("listen", "socket") if info.get(k)]
        return ", ".join(parts)
