"""Placement that follows demand: drain a busy model from a GPU where a model with more demand waits (issue 31).

mindrouter never evicts a busy model, and a GPU holding a popular model never
idles, so without this the placement of the first loads stood all run: with two
popular 8B-class models the RTX 3060 held one of them and refused the other 461
times ("does not fit, even after evicting idle models"), and the refused one
waited in the queue p95 179 s against 57 s. A review (``Placement.review``,
every ``placement_interval`` seconds of the core's clock) looks at each model
whose queue waits with no backend open to it, and at each backend that could
serve it but for one busy model there (it would fit were that model idle). It
drains that model there (no new work of it goes there, so its runner goes idle
and Ollama evicts it for the waiting one) when moving the backend's slots lowers
the highest demand per slot of the two by more than ``drain_margin``:

    demand per slot = (jobs queued + running for the model) / its slots (per-model slots where it is resident)
    drain when max(waiting's after, drained's after) x (1 + drain_margin) < waiting's now
    and the waiting queue's expected wait (its jobs x a typical answer's time / its slots) exceeds the
    price of the move: loading the waiting model there plus ``eviction_price`` x reloading the drained one.

A drain holds while the move still lowers the highest demand (no margin then)
and the waiting model still has jobs queued, and ends once the drained model is
no longer resident there: the margin is the hysteresis, so two models with equal
demand per slot never drain each other (the drained one's demand after the move
would be the higher), and a model whose only home is that backend is never
drained (its demand after would be unbounded).

Invariant: the models drained on a backend are drained for one waiting model,
each running there when its drain began (each alone, or all the busy ones
together where the waiting model fits only alone); the drains live in
``drains`` (backend id -> {drained model: waiting model}), which the class
cache reads to close the backend to the drained models' classes.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping

from ..jobs import ClassKey
from ..settings import SchedulerSettings
from .backend import Backend, BackendLoad
from .classes import Classes
from .constraints import REASONS, fit
from .estimate import Speeds, load_seconds

__all__ = ["Placement"]

#: Reasons a waiting model's candidate may be closed for and still be worth draining: it would fit once idle.
_MOVABLE = frozenset({REASONS["memory"], REASONS["loaded"], REASONS["capacity"], REASONS["held"]})
_ROOM = frozenset({REASONS["memory"], REASONS["loaded"]})


class Placement:
    """The drains in force, and the review that starts and ends them. Pure: time is passed in."""

    def __init__(
        self,
        backends: Mapping[Hashable, Backend],
        loads: Mapping[Hashable, BackendLoad],
        classes: Classes,
        speeds: Speeds,
        settings: SchedulerSettings,
    ) -> None:
        self._backends = backends
        self._loads = loads
        self._classes = classes
        self._speeds = speeds
        self._settings = settings
        self.drains: dict[Hashable, dict[str, str]] = classes.drains
        self._next = -math.inf

    def review(self, queued: Mapping[ClassKey, int], now: float) -> list[Hashable]:
        """Start and end drains by the queues now, at most every ``placement_interval``; the backends changed."""
        margin = self._settings.drain_margin
        if now < self._next or margin is None:
            return []
        self._next = now + self._settings.placement_interval
        waiting: dict[str, int] = {}
        for key, count in queued.items():
            if count:
                waiting[key[0]] = waiting.get(key[0], 0) + count
        if not waiting and not self.drains:
            return []
        demand = _Demand(self._backends, self._loads, waiting, now, self._settings.load_confirm_seconds)
        wanted: dict[Hashable, dict[str, str]] = {}
        for bid, drained in self.drains.items():  # drains in force hold while the move still helps
            target = next(iter(drained.values()))
            if not waiting.get(target):
                continue
            keep = tuple(m for m in drained if self._resident(bid, m, now) and demand.helps(bid, target, m, 0.0))
            if keep:
                wanted[bid] = dict.fromkeys(keep, target)
                demand.move(bid, target, keep)
        for key, count in queued.items():
            if count and not self._classes.get(key).open:
                self._start(key, demand, wanted, now, margin)
        changed = [bid for bid in set(wanted) | set(self.drains) if wanted.get(bid) != self.drains.get(bid)]
        self.drains.clear()
        self.drains.update(wanted)
        return changed

    def _resident(self, bid: Hashable, model: str, now: float) -> bool:
        backend, load = self._backends.get(bid), self._loads.get(bid)
        if backend is None or load is None:
            return False
        return model in load.resident(backend, now, self._settings.load_confirm_seconds)

    def _start(
        self, key: ClassKey, demand: _Demand, wanted: dict[Hashable, dict[str, str]], now: float, margin: float
    ) -> None:
        """Drain, for class ``key``'s waiting model, the one backend where it pays most, if any does."""
        target = key[0]
        best: tuple[float, Hashable, tuple[str, ...]] | None = None
        for bid, reasons in self._classes.get(key).closed.items():
            if bid in wanted or not _ROOM.intersection(reasons) or not _MOVABLE.issuperset(reasons):
                continue
            backend, load = self._backends[bid], self._loads[bid]
            if not backend.takes_work:
                continue
            resident = load.resident(backend, now, self._settings.load_confirm_seconds)
            busy = [
                m for m in sorted(resident) if m != target and load.model_in_flight.get(m) and m not in load.loading
            ]
            # Each busy model alone, then all together (a 32B that fits an RTX 4090 only alone).
            for models in [(m,) for m in busy] + ([tuple(busy)] if len(busy) > 1 else []):
                idle = dict(load.model_in_flight)
                idle.update(dict.fromkeys(models, 0))
                room = fit(backend, _with(load, idle), target, resident)
                if isinstance(room, str) or not all(demand.helps(bid, target, m, margin) for m in models):
                    continue
                if demand.wait(target, self._speeds, self._settings) <= self._price(backend, load, target, models):
                    continue
                after = max(demand.after(bid, m, gains=False) for m in models)
                if best is None or after < best[0]:
                    best = (after, bid, models)
        if best is not None:
            wanted[best[1]] = dict.fromkeys(best[2], target)
            demand.move(best[1], target, best[2])

    def _price(self, backend: Backend, load: BackendLoad, target: str, models: tuple[str, ...]) -> float:
        """Seconds a move costs: the waiting model's load there, and the drained ones' reloads, priced as evictions."""
        settings = self._settings
        reloads = sum(load_seconds(backend, load, m, settings) for m in models)
        return load_seconds(backend, load, target, settings) + settings.eviction_price * reloads


def _with(load: BackendLoad, in_flight: dict[str, int]) -> BackendLoad:
    """``load`` as if ``in_flight`` ran there (a drained model idle): what ``fit`` would then evict."""
    return BackendLoad(model_in_flight=in_flight, loading=load.loading, evicted=load.evicted)


class _Demand:
    """Jobs and slots per model across the pool, read once per review."""

    def __init__(
        self,
        backends: Mapping[Hashable, Backend],
        loads: Mapping[Hashable, BackendLoad],
        waiting: Mapping[str, int],
        now: float,
        confirm: float,
    ) -> None:
        self.waiting = waiting
        self.jobs: dict[str, float] = dict(waiting)
        self.slots: dict[str, int] = {}
        self._backends = backends
        for bid, backend in backends.items():
            load = loads[bid]
            for model, n in load.model_in_flight.items():
                if n > 0:
                    self.jobs[model] = self.jobs.get(model, 0) + n
            if backend.takes_work:
                for model in load.resident(backend, now, confirm):
                    self.slots[model] = self.slots.get(model, 0) + self._slots(backend, model)

    def _slots(self, backend: Backend, model: str) -> int:
        return min(backend.slots(model) or backend.max_concurrent, backend.max_concurrent)

    def per_slot(self, model: str, slots: int) -> float:
        return self.jobs.get(model, 0) / slots if slots > 0 else math.inf

    def after(self, bid: Hashable, model: str, *, gains: bool) -> float:
        """``model``'s demand per slot once backend ``bid``'s slots for it are gained or lost."""
        moved = self._slots(self._backends[bid], model)
        return self.per_slot(model, self.slots.get(model, 0) + (moved if gains else -moved))

    def move(self, bid: Hashable, target: str, models: tuple[str, ...]) -> None:
        """Count backend ``bid``'s slots as ``target``'s, not ``models``': a drain chosen, so the next is
        weighed as if it had moved (a second GPU is not drained for a queue one would serve)."""
        backend = self._backends[bid]
        self.slots[target] = self.slots.get(target, 0) + self._slots(backend, target)
        for model in models:
            self.slots[model] = self.slots.get(model, 0) - self._slots(backend, model)

    def helps(self, bid: Hashable, target: str, model: str, margin: float) -> bool:
        """Whether moving ``bid`` from ``model`` to ``target`` lowers the higher demand per slot by ``margin``."""
        now = self.per_slot(target, self.slots.get(target, 0))
        later = max(self.after(bid, target, gains=True), self.after(bid, model, gains=False))
        return later * (1 + margin) < now

    def wait(self, model: str, speeds: Speeds, settings: SchedulerSettings) -> float:
        """Seconds ``model``'s queue is expected to wait where it runs now: its jobs x a typical answer's time."""
        slots = self.slots.get(model, 0)
        if not slots:
            return math.inf
        best = speeds.best.get(model)
        decode = (best.decode if best is not None else None) or settings.default_decode_rate
        return self.waiting.get(model, 0) * settings.default_completion_tokens / decode / slots
