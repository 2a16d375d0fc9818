"""A lease's states and the moves between them, as a table: what may happen next, and what never may.

As h11's ``_state.py`` keeps its rules: every change of a lease's ``state`` is one move of
``MOVES``, and a move the table lacks raises :class:`LeaseError` and leaves the state as it was,
so a second ending, a finish before an answer or a dispatch after the shutdown is a loud bug rather
than a second usage row or a slot freed twice.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["MOVES", "LeaseError", "Move", "State", "moved"]


class State(Enum):
    """Where a lease is in its life."""

    NEW = "new"
    QUEUED = "queued"
    """The job waits for a slot (again after a failover)."""
    DISPATCHED = "dispatched"
    """A slot is ours; the answer is being opened there."""
    STREAMING = "streaming"
    """The backend's answer is open."""
    STOPPING = "stopping"
    """The daemon is shutting down: the lease ends as ``shutdown`` at its exit, whatever it was doing."""
    SETTLED = "settled"
    """The books are closed: one settlement went out."""


class Move(Enum):
    """What happens to a lease; the last three end it (``_end``), as the core is told."""

    QUEUE = "queue"
    DISPATCH = "dispatch"
    ANSWER = "answer"
    REQUEUE = "requeue"
    """The backend failed before the first byte and the core queued the job again."""
    STOP = "stop"
    FINISH = "finish"
    """The answer ended (whole, or a backend's 4xx): the core learns its counts and speed."""
    FAIL = "fail"
    """The backend failed: counted against it, and the job queued again where the core can."""
    ABANDON = "abandon"
    """The request ended without the backend's answer: what was used is charged."""


_END = {Move.FINISH: State.SETTLED, Move.FAIL: State.SETTLED, Move.ABANDON: State.SETTLED}

MOVES: dict[State, dict[Move, State]] = {
    State.NEW: {Move.QUEUE: State.QUEUED, Move.ABANDON: State.SETTLED},
    State.QUEUED: {Move.DISPATCH: State.DISPATCHED, Move.STOP: State.STOPPING, Move.ABANDON: State.SETTLED},
    State.DISPATCHED: {
        Move.ANSWER: State.STREAMING,
        Move.REQUEUE: State.QUEUED,
        Move.STOP: State.STOPPING,
        Move.FAIL: State.SETTLED,
        Move.ABANDON: State.SETTLED,
    },
    State.STREAMING: {Move.STOP: State.STOPPING, **_END},
    State.STOPPING: _END,
    State.SETTLED: {},
}
"""Each state's legal moves and where they lead; anything else is a bug and raises."""


class LeaseError(RuntimeError):
    """A move the lease's state does not allow (a bug in the daemon, never the client's doing)."""


def moved(state: State, move: Move, request: str) -> State:
    """Where ``move`` takes a lease in ``state``.

    Raises:
        LeaseError: the table has no such move from ``state``.
    """
    try:
        return MOVES[state][move]
    except KeyError:
        raise LeaseError(f"a {state.value} lease cannot {move.value} (request {request})") from None
