"""Backends in the store: one row per inference server, one server per row."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from ..names import same_server
from .errors import AlreadyExists, NotFound
from .rows import KEEP, BackendRow
from .validate import _backend_fields, _name

_BACKEND_COLUMNS = "url, engine, max_concurrent, gpus, node, priority, state, parallel, max_loaded"
"""The columns ``_backend_fields`` returns, in its order."""
_BACKEND_SELECT = f"SELECT id, name, {_BACKEND_COLUMNS} FROM backends"


def _backend(row: tuple[Any, ...]) -> BackendRow:
    return BackendRow(
        row[0], row[1], row[2], row[3], row[4], tuple(json.loads(row[5])), row[6], row[7], row[8], row[9], row[10]
    )


class Backends:
    """The backend half of ``Store``; it shares the store's connection."""

    _db: sqlite3.Connection

    def _backend_row(self, key: str | int) -> tuple[Any, ...]:
        column = "id" if isinstance(key, int) else "name"
        row = self._db.execute(f"{_BACKEND_SELECT} WHERE {column} = ?", (key,)).fetchone()
        if row is None:
            raise NotFound(f"backend {key!r} does not exist; see the configured ones with `mr backend list`")
        return row

    def add_backend(
        self,
        name: object,
        url: object,
        engine: object,
        *,
        max_concurrent: int = 4,
        gpus: Sequence[int] = (),
        node: str = "",
        priority: float = 0.0,
        state: str = "enabled",
        parallel: int | None = None,
        max_loaded: int | None = None,
    ) -> BackendRow:
        name = _name("backend", name)
        fields = _backend_fields(name, url, engine, max_concurrent, gpus, node, priority, state, parallel, max_loaded)
        if self._db.execute("SELECT 1 FROM backends WHERE name = ?", (name,)).fetchone():
            raise AlreadyExists(
                f"backend {name!r} already exists; pick another name or remove it with `mr backend rm {name}` first"
            )
        self._refuse_same_server(fields[0])
        cur = self._db.execute(
            f"INSERT INTO backends (name, {_BACKEND_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (name, *fields),
        )
        return self.get_backend(cur.lastrowid)  # type: ignore[arg-type]

    def update_backend(
        self,
        key: str | int,
        *,
        url: str | None = None,
        engine: str | None = None,
        max_concurrent: int | None = None,
        gpus: Sequence[int] | None = None,
        node: str | None = None,
        priority: float | None = None,
        state: str | None = None,
        parallel: int | None = KEEP,
        max_loaded: int | None = KEEP,
    ) -> BackendRow:
        """Change the given fields (None leaves one as it is; ``node=""`` clears the node, ``gpus=[]`` the GPUs,
        ``parallel=None`` and ``max_loaded=None`` those settings)."""
        old = _backend(self._backend_row(key))
        fields = _backend_fields(
            old.name,
            old.url if url is None else url,
            old.engine if engine is None else engine,
            old.max_concurrent if max_concurrent is None else max_concurrent,
            old.gpus if gpus is None else gpus,
            old.node if node is None else node,
            old.priority if priority is None else priority,
            old.state if state is None else state,
            old.parallel if parallel is KEEP else parallel,
            old.max_loaded if max_loaded is KEEP else max_loaded,
        )
        self._refuse_same_server(fields[0], but=old.id)
        self._db.execute(
            "UPDATE backends SET url = ?, engine = ?, max_concurrent = ?, gpus = ?, node = ?,"
            " priority = ?, state = ?, parallel = ?, max_loaded = ? WHERE id = ?",
            (*fields, old.id),
        )
        return self.get_backend(old.id)

    def backend_at(self, url: str) -> BackendRow | None:
        """The configured backend that is the server at ``url`` (``names.same_server``), if any."""
        return next((row for row in self.list_backends() if same_server(row.url, url)), None)

    def _refuse_same_server(self, url: str, but: int | None = None) -> None:
        """One server, one backend: two would each hold their own concurrency cap on the same GPUs."""
        row = self.backend_at(url)
        if row is not None and row.id != but:
            raise AlreadyExists(
                f"{url} is already in the pool as backend {row.name!r}; change that one with "
                f"`mr backend` commands or remove it with `mr backend rm {row.name}` first"
            )

    def set_backend_state(self, key: str | int, state: str) -> BackendRow:
        return self.update_backend(key, state=state)

    def remove_backend(self, key: str | int) -> None:
        self._db.execute("DELETE FROM backends WHERE id = ?", (self._backend_row(key)[0],))

    def get_backend(self, key: str | int) -> BackendRow:
        """A backend by name, or by id (an int, as decision records show it)."""
        return _backend(self._backend_row(key))

    def list_backends(self) -> list[BackendRow]:
        return [_backend(r) for r in self._db.execute(_BACKEND_SELECT + " ORDER BY id")]
