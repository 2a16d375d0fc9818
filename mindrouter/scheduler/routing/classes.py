"""Job classes: which backends may serve each class, and which can take a job now.

A class is (model, modality, JSON mode): its jobs are interchangeable for
routing. For each class the cache keeps the candidates that pass the static
constraints (cleared whenever a backend's models or abilities change), split
into *open* (could take a job now) and *closed* (with the reasons), kept up to
date as slots are taken and freed. The candidates also name the class's pool
of contention (``pooling.py``): the backends joined to them by shared models.
Which open candidate is best is the router's question (``router.py``).

Invariant: for every cached class, ``open`` and ``closed`` partition
``candidates`` by ``live_rejections`` as of the last change to each backend.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from ..jobs import ClassKey, Job, Rejection
from ..pooling import PoolKey, joined
from ..settings import SchedulerSettings
from .backend import Backend, BackendLoad
from .constraints import REASONS, fit, live_rejections, static_rejections

__all__ = ["ClassInfo", "Classes"]


@dataclass(slots=True)
class ClassInfo:
    candidates: list[Hashable]
    """Backends that pass the static constraints, in registration order."""
    static_rejected: dict[Hashable, tuple[str, ...]]
    model_known: bool
    pool: PoolKey
    """The pool of contention: every backend joined to the candidates by a model both serve."""
    open: dict[Hashable, None] = field(default_factory=dict)
    """Candidates that can take a job now (an ordered set)."""
    closed: dict[Hashable, tuple[str, ...]] = field(default_factory=dict)
    """Candidates that cannot, with the reasons why."""
    most_slots: int = 1
    """The largest ``max_concurrent`` among the candidates, and the highest priority: bounds for
    ``Router._wait_may_win``, kept as backends change so a decision need not scan them."""
    top_priority: float = 0.0


class Classes:
    """The per-class candidate cache over the core's backends and loads (shared, not copied)."""

    def __init__(
        self, backends: dict[Hashable, Backend], loads: dict[Hashable, BackendLoad], settings: SchedulerSettings
    ) -> None:
        self._backends = backends
        self._loads = loads
        self._confirm = settings.load_confirm_seconds
        self.now = 0.0
        """The core's clock at its last decision: when loads it triggered are expected to end."""
        self._classes: dict[ClassKey, ClassInfo] = {}
        self._by_backend: dict[Hashable, list[tuple[ClassKey, ClassInfo]]] = {}
        self._pools: dict[Hashable, PoolKey] = {}
        self._sole: dict[Hashable, list[ClassKey]] = {}
        """Per backend, the cached classes it alone can serve (a 70B that only the H100 holds)."""
        self.drains: dict[Hashable, dict[str, str]] = {}
        """Per backend, the models drained there and the waiting model each is drained for (``placement.py``)."""

    def clear(self) -> None:
        self._classes.clear()
        self._by_backend.clear()
        self._pools.clear()
        self._sole.clear()

    def _pool_of(self, candidates: list[Hashable]) -> PoolKey:
        """The pool ``candidates`` lie in (none without candidates); built once per change of models."""
        if not candidates:
            return frozenset()
        if not self._pools:
            ids = list(self._backends)
            for group in joined([self._backends[bid].models for bid in ids]):
                key = frozenset(ids[i] for i in group)
                self._pools.update((ids[i], key) for i in group)
        return self._pools[candidates[0]]

    def get(self, key: ClassKey) -> ClassInfo:
        info = self._classes.get(key)
        if info is None:
            candidates: list[Hashable] = []
            rejected: dict[Hashable, tuple[str, ...]] = {}
            known = False
            for bid, backend in self._backends.items():
                reasons = static_rejections(backend, key)
                if key[0] in backend.models:
                    known = True
                if reasons:
                    rejected[bid] = reasons
                else:
                    candidates.append(bid)
            info = self._classes[key] = ClassInfo(candidates, rejected, known, self._pool_of(candidates))
            if len(candidates) == 1:
                self._sole.setdefault(candidates[0], []).append(key)
            self._bound(info)
            for bid in candidates:
                self._by_backend.setdefault(bid, []).append((key, info))
                self._place(info, bid, key[0])
        return info

    def refusal(self, job: Job) -> Rejection | None:
        """Why ``job`` cannot even wait for a slot (no backend can ever, or can now, serve it), if so."""
        info = self.get((job.model, job.modality, job.json_mode))
        if not info.candidates:
            if not info.model_known:
                return Rejection(
                    job,
                    404,
                    "model_not_found",
                    f"model {job.model!r} is not served by any backend; `GET /v1/models` "
                    "(Ollama clients: `GET /api/tags`) lists the models you can use",
                )
            serving = [b for b in self._backends.values() if job.model in b.models]
            json_refused = job.json_mode and not any(b.supports_json for b in serving)
            what = "JSON mode" if json_refused else f"{job.modality.value} requests"
            return Rejection(job, 400, "unsupported", f"no backend serving {job.model!r} supports {what}")
        backends = [self._backends[bid] for bid in info.candidates]
        if not any(b.takes_work for b in backends):
            if all(b.draining or not b.enabled for b in backends):  # an admin's doing, not a fault to wait out
                drained = sorted(b.name for b in backends)
                return Rejection(
                    job,
                    503,
                    "no_backend",
                    f"every backend serving {job.model!r} ({', '.join(drained)}) was drained by an admin, so no "
                    f"request for it can run; an admin brings one back with `mr backend enable {drained[0]}`",
                    retry_after=5.0,
                )
            return Rejection(
                job,
                503,
                "no_backend",
                f"every backend serving {job.model!r} is unhealthy, draining or drained; try again shortly",
                retry_after=5.0,
            )
        return None

    def _place(self, info: ClassInfo, bid: Hashable, model: str) -> None:
        """Put candidate ``bid`` in its class's open or closed set, by the live constraints."""
        reasons = live_rejections(self._backends[bid], self._loads[bid], model, self.now, self._confirm)
        if self.drains and model in self.drains.get(bid, ()):
            reasons += (REASONS["placement"],)
        if reasons:
            info.open.pop(bid, None)
            info.closed[bid] = reasons
        else:
            info.closed.pop(bid, None)
            info.open[bid] = None

    def _bound(self, info: ClassInfo) -> None:
        backends = [self._backends[bid] for bid in info.candidates]
        info.most_slots = max((b.max_concurrent for b in backends), default=1)
        info.top_priority = max((b.priority for b in backends), default=0.0)

    def changed(self, bid: Hashable) -> None:
        """``bid``'s settings or readings changed (not its models): re-evaluate it, and its classes' bounds."""
        for _, info in self._by_backend.get(bid, ()):
            self._bound(info)
        self.reopen(bid)

    def reopen(self, bid: Hashable) -> None:
        """Re-evaluate ``bid``'s live constraints in every class it serves."""
        for key, info in self._by_backend.get(bid, ()):
            self._place(info, bid, key[0])

    def load_changed(self, bid: Hashable) -> None:
        """A slot on ``bid`` was taken or freed: capacity, and what idle models could be evicted, may have changed."""
        if bid in self._backends:
            self.reopen(bid)

    def served_by(self, bid: Hashable) -> list[ClassKey]:
        """The cached classes ``bid`` is a candidate of."""
        return [key for key, _ in self._by_backend.get(bid, ())]

    def live(self, bid: Hashable, model: str) -> bool:
        """Could ``bid`` take a job for ``model`` once slots free (healthy, enabled, not draining, fits)?"""
        reasons = live_rejections(self._backends[bid], self._loads[bid], model, self.now, self._confirm)
        return all(r in _WAITS for r in reasons)

    def contested(self, bid: Hashable, key: ClassKey, waiting: Mapping[ClassKey, int], queued: bool = True) -> float:
        """How many jobs with no other home a job of class ``key`` on ``bid`` would hold up (0: none).

        Jobs of another class that only ``bid`` can serve are held up by it when they run there
        (it takes GPU time from them; ``_slowed``), or, with ``queued``, are queued and either their
        model is not resident and cannot be loaded until this job's model (busy, or the idle one
        Ollama would evict) is idle, or they could fill every free slot there (each class within its
        free per-model slots).
        """
        sole = self._sole.get(bid)
        if not sole:
            return 0
        slowed = self._slowed(bid, key, waiting, sole)
        if not queued:
            return slowed
        backend, load = self._backends[bid], self._loads[bid]
        resident = load.resident(backend, self.now, self._confirm)
        free = backend.max_concurrent - load.in_flight
        blocked = need = 0
        for other in sole:
            if other == key or other[0] == key[0]:
                continue
            count = waiting.get(other, 0)
            if not count:
                continue
            if other[0] not in resident:
                room = fit(backend, load, other[0], resident)
                if isinstance(room, str) or key[0] in room:
                    blocked += count
                    continue
            elif (slots := backend.slots(other[0])) is not None:
                count = max(0, min(count, slots - load.model_in_flight.get(other[0], 0)))
            need += count
        if need >= free > 0:
            blocked += need
        return slowed + blocked

    def _slowed(self, bid: Hashable, key: ClassKey, waiting: Mapping[ClassKey, int], sole: list[ClassKey]) -> float:
        """The jobs with no other home that a job of class ``key`` running on ``bid`` slows, each weighed
        by the part of its time there it takes from them.

        Where each model has its runner (Ollama) and the runners with streams time-share the GPU,
        a stream beside ``r`` other runners takes 1 / (r + 1) of the GPU from each while it runs:
        the sole-home streams running there lose that part of its time, and so do the sole-home
        jobs queued for their slots, which wait on them. Elsewhere each stream running loses as
        much as the job takes (the streams of one batch; the estimate's delay prices the batch).
        """
        load = self._loads[bid]
        running = sum(load.model_in_flight.get(other[0], 0) for other in sole if other[0] != key[0])
        backend = self._backends[bid]
        if not running or backend.parallel is None:
            return running
        behind = sum(
            waiting.get(other, 0)
            for other in sole
            if other[0] != key[0] and load.model_in_flight.get(other[0], 0) >= (backend.slots(other[0]) or 0)
        )
        others = sum(1 for m, n in load.model_in_flight.items() if n > 0 and m != key[0])
        return (running + behind) / (others + 1)


#: Reasons that end by themselves as running jobs finish.
_WAITS = frozenset({REASONS["capacity"], REASONS["held"], REASONS["loaded"]})
