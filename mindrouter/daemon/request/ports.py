"""What a lease needs from the rest of the daemon: the backend registry and the quotas, as protocols.

The lease depends on these two small views rather than on the registry and the quota book
themselves, so tests pass dict-backed fakes.
"""

from __future__ import annotations

from typing import Any, Protocol

from ...backends import Fault
from ...errors import RequestError

__all__ = ["Backends", "Reservations"]


class Backends(Protocol):
    """What a lease needs from the backend registry (tests pass a dict-backed fake)."""

    def adapter(self, backend_id: Any) -> Any:
        """The backend's adapter (with ``open(call, model)``), or None if it was removed."""

    def request_failed(self, backend_id: Any, error: str, *, fault: Fault = Fault.DOWN, user: Any = None) -> None:
        """One request failed on this backend with ``fault``: the breaker decides whether it counts."""

    def request_succeeded(self, backend_id: Any) -> None: ...

    def lacks(self, backend_id: Any, model: str, modality: Any, said: str) -> None:
        """The backend answered "not supported" (``said``) for ``modality`` on ``model``: route such requests
        elsewhere."""

    def lacking(self, model: str, modality: Any) -> str:
        """What the backends serving ``model`` said when they lacked ``modality`` ("" if none did)."""

    def serves(self, model: str, modality: Any, *, besides: Any = ()) -> bool:
        """Another backend (not in ``besides``) offers ``modality`` for ``model``."""

    def released(self, backend_id: Any) -> None:
        """A slot there was freed (a draining backend may now be idle)."""


class Reservations(Protocol):
    """What a lease needs from the quotas: what a job reserves once it runs, and how far a stream may go."""

    def start(self, job_id: str) -> int | None:
        """The job starts on a backend: reserve its tokens against everyone; the whole answer's cap, if any.

        Raises:
            RequestError: 429, the quota was used while it waited.
        """

    def allowance(self, job_id: str) -> float:
        """Completion tokens the job may stream before it asks again (infinite without a token quota)."""

    def outgrow(self, job_id: str, completion_tokens: int) -> RequestError | None:
        """The stream has this many; grow its reservation, or say why it must end (a spent quota)."""
