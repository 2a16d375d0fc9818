"""Where a job runs: the backends, their slots, the choice among them, and what answers teach.

The facade (``Scheduler``) asks the router which pool a job's class contends
in (``pool_of``) and whether a class could start a job now (``has_open``);
once fairness chose a job, ``route`` says where it is expected to finish
first, ``take`` gives it a slot there, and ``release`` and ``learn`` take back
what it ends with. The router knows nothing of people: a job comes with the
answer fairness expects of it, and a hold comes as a backend id and a model.

Invariants (``check()``):

- One owner per slot: a backend's ``in_flight`` counts the jobs taken there
  and not yet released, plus the slots held there (``held``), each moved only
  by ``take``/``release`` and ``hold``/``unhold``; it never exceeds
  ``max_concurrent`` while the backend is enabled.
- The class cache (``classes.py``) is cleared whenever what a backend serves
  changes; ``set_backend`` and ``remove_backend`` say so, and the caller then
  seats the queued jobs in their classes' pools again.
- Every estimate of a job on a backend goes through ``estimate`` here, for a
  route and for the price of a hold alike: the one place a job's time on a
  backend is reckoned, where a prefix the backend already holds in its cache
  would be taken off the prompt it must read (issue 31).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping

from ..jobs import ClassKey, Job, Rejection, Timings
from ..pooling import PoolKey
from ..settings import SchedulerSettings
from .backend import Backend, BackendLoad, ModelSpeed
from .classes import Classes, ClassInfo
from .constraints import REASONS
from .estimate import Estimate, Speeds, estimate
from .learning import Sample, learn
from .placement import Placement
from .prefixes import Prefixes

__all__ = ["Route", "Router"]

#: (the chosen backend's estimate, every candidate's estimate, closed candidates with reasons); none is
#: chosen when the job should wait for a full one, where it is expected to finish sooner.
Route = tuple[Estimate | None, tuple[Estimate, ...], dict[Hashable, tuple[str, ...]]]

_FULL = (REASONS["capacity"],)


class Router:
    """Backends, their loads and the per-class candidate cache: where each job runs. Pure: time is passed in."""

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings
        self.speeds = Speeds()
        self._backends: dict[Hashable, Backend] = {}
        self._loads: dict[Hashable, BackendLoad] = {}
        self.classes = Classes(self._backends, self._loads, settings)
        self.placement = Placement(self._backends, self._loads, self.classes, self.speeds, settings)
        self.prefixes = Prefixes()
        self._started: dict[str, tuple[float, float, float]] = {}
        """Per running job: its backend's ``BackendLoad.read`` before it was sent, its own reading, and the
        reading it was sent behind."""

    # -- backends ----------------------------------------------------------

    def set_backend(self, backend: Backend) -> bool:
        """Add a backend or replace what is known about it; True when what backends serve changed."""
        old = self._backends.get(backend.id)
        self._backends[backend.id] = backend
        load = self._loads.setdefault(backend.id, BackendLoad())
        load.polled(backend)
        self.prefixes.keep(backend.id, backend.loaded_models | load.loading.keys())
        if old is None or (old.models, old.modalities, old.model_modalities, old.supports_json) != (
            backend.models,
            backend.modalities,
            backend.model_modalities,
            backend.supports_json,
        ):
            self.classes.clear()
            return True
        self.classes.changed(backend.id)
        return False

    def remove_backend(self, backend_id: Hashable) -> bool:
        """Forget a backend; True when it was known (what backends serve changed)."""
        removed = self._backends.pop(backend_id, None) is not None
        if removed:
            self.classes.clear()
        self._loads.pop(backend_id, None)
        self.prefixes.forget(backend_id)
        return removed

    def pool_of(self, key: ClassKey) -> PoolKey:
        """The pool of contention class ``key`` lies in: every backend joined to its candidates (none without)."""
        return self.classes.get(key).pool

    def refusal(self, job: Job) -> Rejection | None:
        """Why ``job`` cannot even wait for a slot (no backend can ever, or can now, serve it), if so."""
        return self.classes.refusal(job)

    # -- routing -----------------------------------------------------------

    def deciding(self, now: float) -> None:
        """A decision is made at ``now``: loads the core triggered are expected to end by this clock."""
        self.classes.now = now

    def place(self, queues: Mapping[ClassKey, int]) -> None:
        """After a dispatch, with ``queues`` left waiting: drain busy models where waiting ones would serve more
        (``placement.py``); each backend whose drains changed is re-evaluated in every class it serves."""
        for bid in self.placement.review(queues, self.classes.now):
            self.classes.reopen(bid)

    def has_open(self, key: ClassKey) -> bool:
        """Whether some candidate of class ``key`` could take a job now."""
        return bool(self.classes.get(key).open)

    def estimate(
        self,
        backend_id: Hashable,
        job: Job,
        answer_tokens: float,
        now: float,
        penalty: float = 0.0,
        queued: int = 0,
        contested: float = 0.0,
    ) -> Estimate | None:
        """When ``job`` would start and finish on ``backend_id`` (``estimate.py``), None where it cannot run.

        The prompt tokens its cache is expected to hold already (``prefixes.py``) need no prefill there."""
        cached = min(job.prompt_tokens, self.prefixes.cached(backend_id, job.model, job.prefix))
        return estimate(
            self._backends[backend_id],
            self._loads[backend_id],
            job.model,
            job.prompt_tokens,
            answer_tokens,
            now,
            self.settings,
            self.speeds,
            penalty,
            queued,
            contested,
            cached,
            job.context_tokens,
        )

    def route(
        self,
        key: ClassKey,
        job: Job,
        answer_tokens: float,
        excluded: set[Hashable] | None,
        queued: int,
        queues: Mapping[ClassKey, int],
    ) -> Route | None:
        """Where ``job`` is expected to finish first, or None when no candidate is open.

        Full candidates (closed for capacity alone) are estimated too, as starting once ``queued``
        slots have freed (the jobs of this class waiting, this one included): when one of them
        is expected to finish the job sooner than any open one, the route names no backend, and
        the job waits for it rather than load a model elsewhere or take a much slower GPU.
        ``queues``: queued jobs per class, to price what work with no other home needs (``contested``).
        ``excluded``: backends that already failed this job.
        """
        classes = self.classes
        info = classes.get(key)
        model = key[0]
        now = classes.now
        backends = self._backends
        settings = self.settings
        # A retry waits for another live backend rather than go straight back to one
        # that just failed it; only with no alternative left does it try that one again.
        avoid = bool(excluded) and any(bid not in excluded and classes.live(bid, model) for bid in info.candidates)  # type: ignore[operator]
        rows: list[Estimate] = []
        best: Estimate | None = None
        best_score = -math.inf
        for bid in info.open:
            if avoid and bid in excluded:  # type: ignore[operator]
                continue
            penalty = settings.retry_penalty if excluded and bid in excluded else 0.0
            # Yielding a slot to work with no other home costs this job nothing only where another
            # backend is open to it now; with none, the price would make it wait, and routing would
            # overrule fair share (a weight-10 admin kept off the GPU a weight-1 student needs).
            # GPU time is not a slot: where models time-share the GPU (a runner per model, as
            # Ollama's), the streams it would slow are priced even then, and it may wait for a full
            # backend that finishes it nearly as soon.
            contested = 0.0
            if len(info.open) > 1 or backends[bid].parallel is not None:
                contested = classes.contested(bid, key, queues, queued=len(info.open) > 1)
            row = self.estimate(bid, job, answer_tokens, now, penalty, 0, contested)
            if row is None:
                continue
            rows.append(row)
            if row.score > best_score:
                best_score, best = row.score, row
        if best is None:
            return None
        waiting = None
        if info.closed and not self._wait_may_win(info, model, job, answer_tokens, best, queued):
            return best, tuple(rows), dict(info.closed)
        for bid, reasons in info.closed.items():
            if reasons != _FULL or (avoid and bid in excluded):  # type: ignore[operator]
                continue
            row = self.estimate(bid, job, answer_tokens, now, 0.0, queued)
            if row is not None and row.score > best_score + settings.wait_margin:
                best_score, waiting = row.score, row
        if waiting is not None:
            return None, (waiting, *rows), dict(info.closed)
        return best, tuple(rows), dict(info.closed)

    def _wait_may_win(
        self, info: ClassInfo, model: str, job: Job, answer_tokens: float, best: Estimate, queued: int
    ) -> bool:
        """Whether any full candidate could beat ``best``: a bound that skips them all when the queue is long.

        Waiting there takes at least ``queued`` jobs' time at the best rates known, spread over
        the most slots any candidate has; when that alone is longer than ``best`` takes, none can win.
        """
        settings = self.settings
        fastest = self.speeds.best.get(model) or ModelSpeed()
        decode = max(fastest.decode or 0.0, settings.default_decode_rate)
        prefill = max(fastest.prefill or 0.0, decode * settings.prefill_speedup)
        typical = job.prompt_tokens / prefill + answer_tokens / decode
        return info.top_priority - typical * queued / max(1, info.most_slots) > best.score + settings.wait_margin

    def static_rejected(self, key: ClassKey) -> Mapping[Hashable, tuple[str, ...]]:
        """Backends that can never serve class ``key`` as configured now, with the reasons (for records)."""
        return self.classes.get(key).static_rejected

    def observed_rate(self, backend_id: Hashable, model: str) -> float | None:
        """Completion tokens a second one stream of ``model`` got on ``backend_id``, as it ran (``ledger.py``)."""
        speed = self._loads[backend_id].speeds.get(model)
        return speed.observed if speed is not None else None

    def held_since(self, backend_id: Hashable, since: float) -> bool:
        """Whether a slot of ``backend_id`` was held for someone after ``since`` (``DecisionRecord.slot_held``)."""
        return self._loads[backend_id].hold_ended >= since

    # -- slots -------------------------------------------------------------

    def take(self, job: Job, chosen: Estimate, now: float) -> None:
        """``job`` starts where ``chosen`` estimated it: a slot is taken, and the load and evictions it triggers
        are expected."""
        backend_id = chosen.backend_id
        load = self._loads[backend_id]
        model = job.model
        load.in_flight += 1
        load.model_in_flight[model] = load.model_in_flight.get(model, 0) + 1
        self._started[job.id] = (load.read, chosen.reading, load.pending(now))
        load.read += chosen.reading
        load.reading += chosen.reading
        load.backlog, load.backlog_at = load.pending(now) + chosen.reading, now
        if chosen.start > 0 and model not in load.loading:
            load.loading[model] = now + chosen.start
            load.loaders.add(job.id)
        for victim in chosen.evicts:
            load.evicted[victim] = now
        self.prefixes.unloaded(backend_id, chosen.evicts)
        backend = self._backends[backend_id]
        self.prefixes.sent(
            job.id, backend_id, model, job.prefix, backend.slots(model), self.settings.prefix_cache_tokens
        )
        self.classes.load_changed(backend_id)

    def release(self, backend_id: Hashable, job: Job, *, failed: bool = False) -> None:
        """``job`` ended on ``backend_id`` (``failed``: with an error there): its slot is free."""
        started = self._started.pop(job.id, None)
        load = self._loads.get(backend_id)
        if load is None:
            return
        load.in_flight -= 1
        load.model_in_flight[job.model] -= 1
        load.loaders.discard(job.id)
        self.prefixes.ended(job.id, None)
        if started is not None:
            load.reading = max(0.0, load.reading - started[1])
        if job.unload_after and not load.model_in_flight[job.model]:  # Ollama unloads it now (keep_alive 0)
            load.evicted[job.model] = self.classes.now
            self.prefixes.unloaded(backend_id, (job.model,))
        self.classes.load_changed(backend_id)
        if failed:
            load.failed += 1

    def holdable(self, backend_id: Hashable, model: str) -> list[ClassKey] | None:
        """The classes a slot of ``backend_id`` could serve, if a slot there may be held for a job of ``model``
        (it takes work, and ``model`` is not drained there: a held slot would keep its runner busy)."""
        backend = self._backends.get(backend_id)
        if backend is None or not backend.takes_work or model in self.placement.drains.get(backend_id, ()):
            return None
        return self.classes.served_by(backend_id)

    def free(self, backend_id: Hashable) -> int:
        """Slots of ``backend_id`` neither running a job nor held (0 for one not known)."""
        backend, load = self._backends.get(backend_id), self._loads.get(backend_id)
        return 0 if backend is None or load is None else max(0, backend.max_concurrent - load.in_flight)

    def busy_seconds(self, backend_id: Hashable, job: Job, answer_tokens: float, now: float) -> float:
        """Seconds ``job`` would hold a slot of ``backend_id`` once started (0 where it cannot run there)."""
        row = self.estimate(backend_id, job, answer_tokens, now)
        return 0.0 if row is None else row.prefill + row.decode

    def hold(self, backend_id: Hashable, model: str) -> None:
        """A slot of ``backend_id`` is held (for a user about to send again): taken, as a job's would be."""
        load = self._loads[backend_id]
        load.in_flight += 1
        load.held += 1
        load.model_in_flight[model] = load.model_in_flight.get(model, 0) + 1
        self.classes.load_changed(backend_id)

    def unhold(self, backend_id: Hashable, model: str, ended: float) -> None:
        """A slot held on ``backend_id`` is given back; the hold ``ended`` then."""
        load = self._loads.get(backend_id)
        if load is None:
            return
        load.hold_ended = ended
        load.in_flight -= 1
        load.held -= 1
        load.model_in_flight[model] -= 1
        self.classes.load_changed(backend_id)

    # -- learning ----------------------------------------------------------

    def learn(
        self,
        backend_id: Hashable,
        job: Job,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        latency: float | None,
        duration: float | None,
        timings: Timings | None,
        cached: int | None = None,
    ) -> None:
        """What ``job``'s answer teaches about its backend; call before ``release`` (its stream still counts).

        ``cached``: prompt tokens the engine said it found in its cache, which corrects what routing expects."""
        part = self.prefixes.ended(job.id, cached, prompt_tokens)
        load = self._loads.get(backend_id)
        if load is None:
            return
        before, own, behind = self._started.get(job.id, (load.read, 0.0, 0.0))  # release() forgets it
        backend = self._backends.get(backend_id)
        size = backend.model_sizes.get(job.model) if backend is not None else None
        if cached is None and prompt_tokens is not None:  # the engine does not say (Ollama): as expected
            cached = round(prompt_tokens * part)
        # Where prompts stall decoding, the others' prompts read while it ran are time it only waited.
        stalls = backend is not None and backend.prefill_stalls
        sample = Sample(
            prompt_tokens,
            completion_tokens,
            latency,
            duration,
            timings or Timings(),
            size,
            cached or 0,
            load.read - before - own if stalls else 0.0,
            stalls,
            behind if stalls else 0.0,
        )
        learn(load, self.speeds, job, sample, self.settings)

    # -- reading -----------------------------------------------------------

    def backend(self, backend_id: Hashable) -> Backend | None:
        return self._backends.get(backend_id)

    def load(self, backend_id: Hashable) -> BackendLoad | None:
        """A copy of what the router counts for ``backend_id`` (in flight, latency, throughput)."""
        load = self._loads.get(backend_id)
        return None if load is None else dataclasses.replace(load)

    @property
    def backends(self) -> dict[Hashable, Backend]:
        return dict(self._backends)

    def check(self, running: Mapping[Hashable, int], held: Mapping[Hashable, int]) -> None:
        """Assert that each backend counts the jobs ``running`` there and the slots ``held`` there (for tests)."""
        for bid, load in self._loads.items():
            jobs = load.in_flight - load.held
            assert jobs == running.get(bid, 0) and load.held >= 0, (bid, load.in_flight, running.get(bid, 0))
            assert load.held == held.get(bid, 0), (bid, load.held, held.get(bid, 0))
            backend = self._backends.get(bid)
            if backend is not None:
                assert load.in_flight <= backend.max_concurrent or not backend.enabled, bid
