"""The decision log's flush task: a round's records are encoded a slice at a time, between requests."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from mindrouter.daemon.request.decisions import SLICE, DecisionLog
from mindrouter.daemon.request.settlement import Outcome, Settlement
from mindrouter.scheduler import Job
from mindrouter.store import Store, decision_row


def ended(i: int) -> Settlement:
    """A request refused in the queue (no backend): a record of its own."""
    return Settlement(
        job=Job(id=f"req{i}", user_id=1, model="m", submitted_at=0.0),
        user="alice",
        group="staff",
        outcome=Outcome.REJECTED,
        reason="queue full",
        status=429,
        backend_id=None,
        answered=False,
        prompt_tokens=0,
        completion_tokens=0,
        held=0.0,
        attempts=(),
        waited=0.5,
        wall=1_700_000_000.0 + i,
    )


async def test_a_flush_round_lets_requests_run_between_slices_and_writes_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    log = DecisionLog(store, lambda _bid: None)
    count = 5 * SLICE + 3
    for i in range(count):
        log.settled(ended(i))
    commits: list[int] = []
    write = store.add_decision_rows
    store.add_decision_rows = lambda rows: (commits.append(len(rows)), write(rows))[1]  # type: ignore[method-assign]
    turns = 0
    drained = False

    async def other_requests() -> None:
        nonlocal turns
        while not drained:
            turns += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(other_requests())
    await asyncio.sleep(0)
    await log._drain()
    drained = True
    await other
    assert turns >= 6  # the loop ran other work between the 6 slices
    assert commits == [count]  # one commit for the round
    assert [d["request_id"] for d in store.recent_decisions(count)] == [f"req{i}" for i in range(count)]
    assert store.get_decision("req7")["reason"] == "queue full"
    store.close()


async def test_a_reader_during_a_round_finds_every_record(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    log = DecisionLog(store, lambda _bid: None)
    for i in range(3 * SLICE):
        log.settled(ended(i))
    round_ = asyncio.create_task(log._drain())
    await asyncio.sleep(0)  # one slice encoded, the rest pending
    assert log.get(f"req{3 * SLICE - 1}") is not None  # `mr why` right after the answer
    assert len(log.recent(1000)) == 3 * SLICE
    await round_
    assert len(store.recent_decisions(1000)) == 3 * SLICE  # nothing written twice
    store.close()


def test_a_record_orjson_refuses_is_still_written_whole() -> None:
    """orjson writes records at 64-bit integers and string keys; anything past that falls back to the stdlib."""
    plain = {"request_id": "r1", "user": "alice", "wall_time": 1.5, "scores": {"3": 0.25}, "at": 2**63 - 1}
    wide = {"request_id": "r2", "user": None, "wall_time": 2.0, "scores": {3: 0.25}, "tokens": 2**70}
    assert json.loads(decision_row(plain)[3]) == plain
    rid, user, when, text = decision_row(wide)
    assert (rid, user, when) == ("r2", None, 2.0)
    assert json.loads(text) == {**wide, "scores": {"3": 0.25}}
    assert (
        json.loads(decision_row({"request_id": "r3", "wall_time": 3.0, "path": Path("/srv/m")})[3])["path"] == "/srv/m"
    )
