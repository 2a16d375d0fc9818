"""WAL checkpoints from a thread of their own, so that their fsyncs never stall the daemon's event loop.

SQLite copies the WAL into the database file inside whichever commit grows it
past 1,000 pages. On the daemon's event loop that commit then waits for three
``fdatasync`` calls (6-7 ms every 2 s on the development machine's disk at
2,000 requests/s, more on a busy disk), and every request in flight waits with
it. The daemon turns automatic checkpoints off on its connection and runs them
here instead, every second, on a connection of this thread's own. They are
PASSIVE, so they never block the loop's writes, and the sqlite3 module lets go
of the GIL while SQLite works, so the loop runs meanwhile. Durability is
unchanged: a commit is in the WAL once it returns, whoever checkpoints it.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

__all__ = ["Checkpointer"]

log = logging.getLogger(__name__)


class Checkpointer:
    """Checkpoints ``path``'s WAL every ``interval`` seconds until ``stop``."""

    def __init__(self, path: Path, *, interval: float = 1.0) -> None:
        self.path = path
        self.interval = interval
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mindrouter-checkpoint", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the thread (after a checkpoint in progress) and close its connection."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        db = sqlite3.connect(self.path, isolation_level=None)
        try:
            while not self._stopping.wait(self.interval):
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as exc:  # the loop's writes go on into the WAL; the next round tries again
                    log.warning("could not checkpoint the state database's WAL: %s", exc)
        finally:
            db.close()
