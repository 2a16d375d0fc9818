"""A request on a workstation (``Stream``) and a model resident there (``Runner``): the state the model keeps.

A stream's phase only moves forward: WAITING (in the server's queue or its
runner's), PREFILL (reading the part of its prompt the cache did not hold),
DECODE, DONE. Its timing is piecewise linear: ``work0`` tokens of the current
phase at ``t0``, then ``rate`` tokens a second until the next re-timing, which
bumps ``version`` so that events computed before it are known to be stale.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ..scenario import ModelSpec, Rates
from .caches import BlockCache, SlotCache
from .ollama import Context
from .prompts import Prompt, Segment

__all__ = ["DECODE", "DONE", "PREFILL", "WAITING", "Options", "Runner", "Stream"]

WAITING, PREFILL, DECODE, DONE = range(4)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Options:
    """What a request asks of the server beside its prompt (Ollama's ``keep_alive`` and ``options.num_ctx``)."""

    keep_alive: float | None = None
    """Seconds its model stays loaded once idle (``math.inf``: forever; 0: unload at once); None: the server's."""
    num_ctx: int | None = None
    """Context per slot; None: Ollama's automatic one."""


@dataclass(slots=True, eq=False)
class Stream(Generic[T]):
    """One request on its backend, from arrival there to its last token; ``tag`` is the driver's own."""

    tag: T
    model: str
    prompt: Prompt
    completion: int
    """Tokens it generates."""
    rates: Rates
    arrived: float
    answer: Segment
    """Its answer, as the next turn of its conversation sends it back."""
    options: Options = Options()
    phase: int = WAITING
    t0: float = 0.0
    """When the current phase's rate last changed."""
    work0: float = 0.0
    """Tokens of the current phase done by ``t0``."""
    rate: float = 0.0
    """Tokens per second of the current phase now."""
    version: int = 0
    """Bumped when the stream is re-timed: events of an older version are stale."""
    prefill_end: float = 0.0
    done: float = 0.0
    runner_at: float = 0.0
    """When it got its model's runner (left the server's queue), loaded or still loading."""
    load: float = 0.0
    """Seconds from arrival until its model's runner took it, loaded (Ollama's ``load_duration``)."""
    began: float = 0.0
    """When its prefill began (it got a slot)."""
    cached: int = 0
    """Prompt tokens the cache held: not prefilled."""
    slot: int = -1
    blocks: list[int] = field(default_factory=list)

    @property
    def computed(self) -> int:
        """Prompt tokens it prefills."""
        return self.prompt.tokens - self.cached

    def tokens(self, now: float) -> float:
        """Tokens of the current phase done by ``now``."""
        return self.work0 + (now - self.t0) * self.rate

    def due(self, version: int, kind: str) -> bool:
        """Whether its "prefill" or "done" event, pushed at ``version``, still stands (none does once re-timed)."""
        if version != self.version:
            return False
        return self.phase == PREFILL if kind == "prefill" else self.phase != DONE


@dataclass(slots=True, eq=False)
class Runner(Generic[T]):
    """One resident (or loading) model on a backend."""

    model: ModelSpec
    slots: float
    context: Context
    vram: float
    """GB it holds, its KV cache included."""
    session: float
    """Seconds it stays loaded once idle (Ollama's sessionDuration; 0: unload when idle; ``math.inf``: forever)."""
    cache: SlotCache | BlockCache | None = None
    loading: bool = False
    ready_at: float = 0.0
    refs: int = 0
    """Requests holding it: running, queued in it, or waiting for its load (Ollama's refCount)."""
    active: int = 0
    queue: deque[Stream[T]] = field(default_factory=deque)
    last_used: float = 0.0
    version: int = 0
    """Bumped whenever its keep_alive timer restarts or stops."""
    chosen: bool = False
    """Chosen to unload to make room or to reload (an eviction), not only idle with a keep_alive of 0."""

    @property
    def evicting(self) -> bool:
        """It unloads when its last request ends (keep_alive 0: chosen to make room, or asked so)."""
        return self.session == 0

    def rank(self) -> tuple[float, str]:
        """``ByDurationAndName``: the shortest keep_alive first (forever last), then by name."""
        return (self.session, self.model.name)
