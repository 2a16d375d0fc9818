"""The slots of a pool: which requests can take which slot, as the backends hold them.

A backend without per-model slots (no ``parallel``) has one set of slots that
any model it serves can take: ``max_concurrent`` of them. One with
``parallel`` (``OLLAMA_NUM_PARALLEL``) gives each model its own slots: a coder
request cannot take a slot of the 8B model beside it, whatever the backend's
total. A *slot set* names one such set: the backend's name, or
``backend/model``. The targets (``maxmin.max_min``), the service gap between
people who compete for the same slots, and who was passed over
(``turns.Turns``) all count slots this way.

Two simplifications, both of which only make more slots look open: the
backend's own ``max_concurrent`` over its per-model slots is not a constraint
of the targets, and nor is VRAM (a model that does not fit beside another still
counts its slots).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

from ..scheduler.pools import joined
from .scenario import BackendSpec

__all__ = ["SlotSets", "contention", "model_slots"]

K = TypeVar("K", bound=Hashable)


def model_slots(spec: BackendSpec, kind: str) -> float:
    """Requests one loaded model of ``kind`` serves at once on ``spec`` (Ollama loads an embedding model with 1)."""
    if spec.ollama and kind == "embedding":
        return 1
    return spec.parallel or math.inf


class SlotSets:
    """The slot sets of a pool's backends: their capacity, and which ones each model's requests can take."""

    def __init__(self, backends: Sequence[BackendSpec], kind: Callable[[str], str]) -> None:
        """Args:
        kind: each model's kind ("chat", "embedding").
        """
        self.capacity: dict[str, float] = {}
        self.of: dict[tuple[str, str], str] = {}
        """The slot set a request for (backend, model) takes."""
        for b in backends:
            if b.parallel is None:
                self.capacity[b.name] = float(b.max_concurrent)
            for m in b.models:
                if b.parallel is None:
                    self.of[b.name, m] = b.name
                else:
                    key = self.of[b.name, m] = f"{b.name}/{m}"
                    self.capacity[key] = float(min(b.max_concurrent, model_slots(b, kind(m))))
        models = {m for b in backends for m in b.models}
        self.serves = {m: frozenset(k for (_, mm), k in self.of.items() if mm == m) for m in models}
        """The slot sets each model's requests can take."""


def contention(candidates: Mapping[K, frozenset[str]]) -> dict[K, int]:
    """Which people compete: a group number per person, the same for two whose slot sets are joined.

    People are joined when their candidate slot sets share a slot set, transitively. Where
    backends give each model its own slots, the users of one model compete only with each
    other, and their slots deliver service at their model's speed, not at the pool's.
    """
    names = list(candidates)
    groups = joined([candidates[u] for u in names])
    return {names[i]: g for g, members in enumerate(groups) for i in members}
