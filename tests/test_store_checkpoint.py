"""The daemon's store checkpoints its WAL from a thread of its own, never inside a commit on the loop."""

from __future__ import annotations

import threading
from pathlib import Path

from mindrouter.store import Store

from .conftest import until

PAGE = 4096


def decision(i: int) -> dict[str, object]:
    return {"request_id": f"req{i}", "user": "alice", "wall_time": 1_700_000_000.0 + i, "pad": "x" * 2000}


def write_pages(store: Store, pages: int) -> None:
    """Commit about ``pages`` pages of decision records, 100 records a commit."""
    for start in range(0, pages, 100):
        store.add_decisions(decision(i) for i in range(start, start + 100))


def test_commits_never_checkpoint_and_the_thread_does(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = Store(path)
    try:
        store.checkpoint_in_background(interval=3600)  # the thread waits: only the loop's commits could checkpoint
        before = path.stat().st_size
        write_pages(store, 1500)  # past SQLite's automatic checkpoint at 1,000 pages
        wal = Path(f"{path}-wal")
        assert wal.stat().st_size > 1200 * PAGE  # every page still in the WAL: no commit checkpointed
        assert path.stat().st_size == before
        assert [t.name for t in threading.enumerate()].count("mindrouter-checkpoint") == 1
    finally:
        store.close()
    assert not [t for t in threading.enumerate() if t.name == "mindrouter-checkpoint"]  # close ends it
    with Store(path) as again:
        assert again.get_decision("req1499") is not None


async def test_the_thread_copies_the_wal_into_the_database(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with Store(path) as store:
        before = path.stat().st_size
        store.checkpoint_in_background(interval=0.01)
        write_pages(store, 300)
        await until(lambda: path.stat().st_size > before + 200 * PAGE, "the thread never checkpointed the WAL")
        assert store.get_decision("req299") is not None
