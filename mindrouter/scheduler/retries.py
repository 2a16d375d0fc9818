"""Retries: the backends that failed each job queued again, and how many times it was tried.

Invariant: a job has an entry only from its first failure before the first byte
until it ends (``forget``); a retry waits for another live backend rather than
go back to one that failed it (``Router.route``'s ``excluded``).
"""

from __future__ import annotations

from collections.abc import Hashable

__all__ = ["Retries"]


class Retries:
    def __init__(self) -> None:
        self._excluded: dict[str, set[Hashable]] = {}
        self._attempts: dict[str, int] = {}

    def failed(self, job_id: str, backend_id: Hashable) -> None:
        """``job_id`` failed on ``backend_id`` before its first byte and is queued again."""
        self._excluded.setdefault(job_id, set()).add(backend_id)
        self._attempts[job_id] = self._attempts.get(job_id, 0) + 1

    def excluded(self, job_id: str) -> set[Hashable] | None:
        """The backends that failed ``job_id``, if any."""
        return self._excluded.get(job_id)

    def attempt(self, job_id: str) -> int:
        """Which try of ``job_id`` starts now (1 for its first)."""
        return self._attempts.get(job_id, 0) + 1

    def forget(self, job_id: str) -> None:
        self._excluded.pop(job_id, None)
        self._attempts.pop(job_id, None)
