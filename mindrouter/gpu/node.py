"""The latest GPU readings of one node, and whether they are still current.

Pure logic, time passed in (monotonic seconds): the daemon records each poll
of a node (this machine's probe, or a ``mr agent`` elsewhere) and asks
``current(now)`` when it scores backends. A node that has not answered for
``stale_after`` poll intervals is stale: its readings are withheld, so
memory fit and utilization read as unknown rather than as old numbers that
no longer hold.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .probe import GpuReading

__all__ = ["NodeReadings"]


@dataclass(slots=True)
class NodeReadings:
    """One node's readings and its answer history.

    Args:
        node: ``"local"`` or the agent's URL, as ``/admin/gpus`` names it.
        poll_interval: seconds between polls of this node.
        stale_after: missed intervals after which the node is stale. Defaults to 3.
    """

    node: str
    poll_interval: float
    stale_after: int = 3
    readings: tuple[GpuReading, ...] = ()
    last_ok: float | None = None
    """When the node last answered, or None if it never has."""
    last_error: str | None = None
    """Why the last poll failed; None after a success."""
    failures: int = 0
    """Polls failed in a row."""

    def __post_init__(self) -> None:
        if not self.poll_interval > 0:
            raise ValueError(f"poll_interval must be above 0, not {self.poll_interval}")
        if self.stale_after < 1:
            raise ValueError(f"stale_after must be at least 1, not {self.stale_after}")

    def record(self, readings: Iterable[GpuReading], now: float) -> None:
        """The node answered with these readings at ``now``."""
        self.readings = tuple(readings)
        self.last_ok = now
        self.last_error = None
        self.failures = 0

    def record_failure(self, error: str, now: float) -> None:
        """A poll at ``now`` got no answer; the old readings stay until the node goes stale."""
        self.last_error = error
        self.failures += 1

    def stale(self, now: float) -> bool:
        """True when the node never answered, or not for ``stale_after`` poll intervals."""
        return self.last_ok is None or now - self.last_ok > self.poll_interval * self.stale_after

    def current(self, now: float) -> list[GpuReading]:
        """Readings to route by: the latest, or ``[]`` (unknown) when stale."""
        return [] if self.stale(now) else list(self.readings)

    def age(self, now: float) -> float | None:
        """Seconds since the last answer, or None if there was none."""
        return None if self.last_ok is None else max(0.0, now - self.last_ok)

    def snapshot(self, now: float) -> dict[str, Any]:
        """The ``/admin/gpus`` row: ``{"node", "stale", "gpus", "age_seconds", "error"}``."""
        return {
            "node": self.node,
            "stale": self.stale(now),
            "gpus": [r.to_dict() for r in self.readings],
            "age_seconds": self.age(now),
            "error": self.last_error,
        }
