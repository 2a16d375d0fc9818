"""The slots of a pool: which requests can take which slot, as the backends hold them.

A backend without per-model slots (no ``parallel``) has one set of slots that
any model it serves can take: ``max_concurrent`` of them. One with
``parallel`` (``OLLAMA_NUM_PARALLEL``) gives each model its own slots
(``workstation.ollama.slots``: Ollama gives some models one): a coder
request cannot take a slot of the 8B model beside it, whatever the backend's
total. A *slot set* names one such set: the backend's name, or
``backend/model``. The targets (``maxmin.max_min``), the service gap between
people who compete for the same slots, and who was passed over
(``turns.Turns``) all count slots this way.

Two simplifications, both of which only make more slots look open: the
backend's own ``max_concurrent`` over its per-model slots is not a constraint
of the targets, and nor is VRAM (a model that does not fit beside another still
counts its slots). What a slot delivers (``SlotSets.units_per_second``) is
counted at one stream's rates alone on the GPU, without loads or the slowdown
of a batch, averaged over the backends that serve the model; the targets
split what each group of contention delivered by these rates, so only their
ratios between the people of one group count.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

from ..scheduler.pooling import joined
from .scenario import BackendSpec, ModelSpec
from .workstation.ollama import slots as runner_slots

__all__ = ["SlotSets", "contention"]

K = TypeVar("K", bound=Hashable)


class SlotSets:
    """The slot sets of a pool's backends: their capacity, and which ones each model's requests can take."""

    def __init__(self, backends: Sequence[BackendSpec], model: Callable[[str], ModelSpec]) -> None:
        """Args:
        model: each model's ``[models]`` entry.
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
                    self.capacity[key] = float(min(b.max_concurrent, runner_slots(b, model(m))))
        models = {m for b in backends for m in b.models}
        self.serves = {m: frozenset(k for (_, mm), k in self.of.items() if mm == m) for m in models}
        """The slot sets each model's requests can take."""
        self.seconds_per_token: dict[str, tuple[float, float]] = {}
        """Seconds a slot takes per prompt and per completion token of each model, alone on its GPU,
        averaged over the slot sets that serve it by their slots (where backends differ in speed, a
        person's requests are taken to spread over its slots as they are counted)."""
        for m in models:
            per = [(self.capacity[self.of[b.name, m]], b.rate(m)) for b in backends if m in b.models]
            slots = sum(n for n, _ in per)
            self.seconds_per_token[m] = (
                sum(n / r.prefill for n, r in per) / slots,
                sum(n / r.decode for n, r in per) / slots,
            )

    def units_per_second(
        self, sizes: Mapping[str, Sequence[float]], prompt_cost: Callable[[str], float], completion_cost: float
    ) -> float:
        """Service units a slot delivers per second to requests of these sizes (prompt and completion tokens by model).

        A slot delivers a 30,000-token prompt's units far faster than a chat answer's (4,842 a second
        against about 130 at 5,000 tokens/s of prefill and 50 of decode), so the targets share units,
        not slots (``pools.Pool.reweigh_targets``).
        """
        units = seconds = 0.0
        for model, (prompt, completion) in sizes.items():
            per_prompt, per_completion = self.seconds_per_token[model]
            units += prompt_cost(model) * prompt + completion_cost * completion
            seconds += per_prompt * prompt + per_completion * completion
        return units / seconds if seconds > 0 else 0.0


def contention(candidates: Mapping[K, frozenset[str]]) -> dict[K, int]:
    """Which people compete: a group number per person, the same for two whose slot sets are joined.

    People are joined when their candidate slot sets share a slot set, transitively. Where
    backends give each model its own slots, the users of one model compete only with each
    other, and their slots deliver service at their model's speed, not at the pool's.
    """
    names = list(candidates)
    groups = joined([candidates[u] for u in names])
    return {names[i]: g for g, members in enumerate(groups) for i in members}
