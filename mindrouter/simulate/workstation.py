"""A simulated backend: one GPU that serves streams, and, given ``vram``, manages models as Ollama does.

Theory of operation, after Ollama's ``server/sched.go`` (read at fb30760):

- Requests the router sends wait in one FIFO (Ollama's ``pendingReqCh``),
  handled one at a time: the head blocks every request behind it.
- A head whose model is resident goes to that model's runner. One whose model
  is loading waits for the load to finish (Ollama blocks on the runner's lock).
- Otherwise, when ``max_loaded`` models are resident or the model's ``vram``
  does not fit in what is free, a model is unloaded as ``findRunnerToUnload``
  picks it: runners by keep_alive (here one per backend), then by name, the
  first idle one, and the head tries again; with every resident model busy,
  the first is marked to unload once its last request ends, and the head waits
  for it. (Ollama sorts by model path, a digest; the name stands in.) When it fits, the load starts
  (``size * load_seconds_per_gb`` seconds) and the loop goes on.
- A runner serves ``parallel`` requests at once (an embedding model one, as
  Ollama loads those with parallel 1); more wait in the runner's own queue.
- A model idle for ``keep_alive`` seconds is unloaded.
- Streams sharing the GPU slow each other (given ``slowdown``): a model's
  batch of n streams steps ``1 + slowdown * (n - 1)`` times slower than one
  stream, and the models with streams running time-share the GPU equally, so
  every start and end re-times the others (processor sharing), as the
  benchmark's workstations (benchmarks/_workstation.py) do.

A backend without ``vram`` keeps every model it serves resident and never
loads, as the simulator always did. What the daemon would poll (loaded models,
their VRAM, free VRAM, sizes, parallel, max loaded) is ``snapshot()``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..scheduler import Backend, Modality
from .runs import RequestTrace
from .scenario import GB, BackendSpec, ModelSpec, Rates
from .slots import model_slots

__all__ = ["Runner", "Stream", "Workstation"]

WAITING, PREFILL, DECODE, DONE = range(4)


@dataclass(slots=True, eq=False)
class Stream:
    """One request on its backend, from arrival there to its last token."""

    req: RequestTrace
    model: str
    rates: Rates
    arrived: float
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
    load: float = 0.0
    """Seconds from arrival until its model's runner took it (Ollama's ``load_duration``)."""
    began: float = 0.0
    """When its prefill began."""

    def tokens(self, now: float) -> float:
        """Tokens of the current phase done by ``now``."""
        return self.work0 + (now - self.t0) * self.rate


@dataclass(slots=True, eq=False)
class Runner:
    """One resident (or loading) model on a backend."""

    model: ModelSpec
    slots: float
    loading: bool = False
    ready_at: float = 0.0
    refs: int = 0
    """Requests holding it: running, queued in it, or waiting for its load (Ollama's refCount)."""
    active: int = 0
    queue: deque[Stream] = field(default_factory=deque)
    last_used: float = 0.0
    version: int = 0
    """Bumped whenever its keep_alive timer restarts or stops."""
    evicting: bool = False
    """Chosen to make room while busy: it unloads when its last request ends (Ollama's keep_alive 0)."""


class Workstation:
    """One simulated backend; ``push(time, kind, payload)`` schedules the engine's events."""

    def __init__(
        self,
        spec: BackendSpec,
        models: Callable[[str], ModelSpec],
        push: Callable[[float, str, object], None],
        decode_rate_changed: Callable[[Stream, float, float], None],
    ) -> None:
        """Args:
        models: each model's ``[models]`` entry.
        push: schedules ``(time, kind, payload)`` for the engine: "loaded", "expire", "prefill", "done".
        decode_rate_changed: called with (stream, old rate, now) when a decoding stream is re-timed.
        """
        self.spec = spec
        self.model = models
        self.push = push
        self.decode_rate_changed = decode_rate_changed
        self.pending: deque[Stream] = deque()
        self.runners: dict[str, Runner] = {}
        self.active: list[Stream] = []
        self.dirty = True
        """What the daemon would poll has changed since the core last heard."""
        self.loads = 0
        self.load_seconds = 0.0
        self.evictions = 0
        self.expirations = 0
        for m in spec.loaded_models if spec.ollama else spec.models:
            self.runners[m] = Runner(self.model(m), self._slots(m))

    def _slots(self, model: str) -> float:
        return model_slots(self.spec, self.model(model).kind)

    # -- what the daemon polls ----------------------------------------------

    def used_vram(self) -> float:
        return sum(r.model.vram for r in self.runners.values())

    def snapshot(self) -> Backend:
        """The backend as the daemon's poll would describe it to the core."""
        spec = self.spec
        embedding = {m: frozenset({Modality.EMBEDDINGS}) for m in spec.models if self.model(m).kind == "embedding"}
        if not spec.ollama:
            return Backend(
                id=spec.name,
                name=spec.name,
                models=frozenset(spec.models),
                loaded_models=frozenset(spec.loaded_models),
                model_modalities=embedding,
                max_concurrent=spec.max_concurrent,
                priority=spec.priority,
                parallel=spec.parallel,
            )
        assert spec.vram is not None
        return Backend(
            id=spec.name,
            name=spec.name,
            models=frozenset(spec.models),
            loaded_models=frozenset(self.runners),
            model_modalities=embedding,
            max_concurrent=spec.max_concurrent,
            priority=spec.priority,
            vram_free=round((spec.vram - self.used_vram()) * GB),
            vram_total=round(spec.vram * GB),
            model_vram={m: round(self.model(m).vram * GB) for m in spec.models},
            model_sizes={m: round(self.model(m).size * GB) for m in spec.models},
            resident_vram={m: round(r.model.vram * GB) for m, r in self.runners.items()},
            parallel=spec.parallel,
            max_loaded=spec.max_loaded,
        )

    # -- requests -------------------------------------------------------------

    def accept(self, req: RequestTrace, model: str, now: float) -> Stream:
        """The router sent ``req`` here: it joins the backend's queue."""
        stream = Stream(req, model, self.spec.rate(model), now)
        self.pending.append(stream)
        self.process(now)
        return stream

    def process(self, now: float) -> None:
        """Ollama's pending loop: place the head, load or evict for it, or stop where it must wait."""
        spec = self.spec
        while self.pending:
            head = self.pending[0]
            runner = self.runners.get(head.model)
            if runner is not None:
                if runner.loading:
                    return  # blocked on the runner until its load ends
                self.pending.popleft()
                self._hold(runner, head, now)
                continue
            need = self.model(head.model)
            full = spec.max_loaded is not None and len(self.runners) >= spec.max_loaded
            short = spec.vram is not None and need.vram > spec.vram - self.used_vram() + 1e-9
            if full or short:
                # findRunnerToUnload: by keep_alive (one per backend here), then name, the first idle
                # runner; else the first, marked to unload once its requests end, and waited for.
                if any(r.evicting for r in self.runners.values()):
                    return  # Ollama waits for the runner it chose, whatever else goes idle meanwhile
                ranked = sorted((r for r in self.runners.values() if not r.loading), key=lambda r: r.model.name)
                victim = next((r for r in ranked if not r.refs), ranked[0] if ranked else None)
                if victim is None or victim.refs:
                    if victim is not None:
                        victim.evicting = True
                    return
                self._unload(victim)
                self.evictions += 1
                continue
            self.pending.popleft()
            seconds = need.size * spec.load_seconds_per_gb
            runner = self.runners[head.model] = Runner(need, self._slots(head.model), loading=True)
            runner.ready_at = now + seconds
            runner.refs = 1
            runner.queue.append(head)
            self.loads += 1
            self.load_seconds += seconds
            self.dirty = True
            self.push(runner.ready_at, "loaded", (self, runner))

    def _hold(self, runner: Runner, stream: Stream, now: float) -> None:
        """``stream`` takes ``runner``: it starts when a slot is free, else waits in the runner's queue."""
        runner.refs += 1
        runner.version += 1  # stops its keep_alive timer
        stream.load = now - stream.arrived
        if runner.active < runner.slots:
            self._start(runner, stream, now)
        else:
            runner.queue.append(stream)

    def loaded(self, runner: Runner, now: float) -> None:
        """A load finished: its waiters start (up to its slots) and the pending loop goes on."""
        if self.runners.get(runner.model.name) is not runner:
            return
        runner.loading = False
        waiting, runner.queue = runner.queue, deque()
        for stream in waiting:
            stream.load = now - stream.arrived
            if runner.active < runner.slots:
                self._start(runner, stream, now)
            else:
                runner.queue.append(stream)
        self.process(now)

    def _start(self, runner: Runner, stream: Stream, now: float) -> None:
        runner.active += 1
        runner.last_used = now
        stream.began = now
        self.active.append(stream)
        self._retime(now, new=stream)

    def finish(self, stream: Stream, now: float) -> None:
        """``stream`` wrote its last token: free its slot, start the next, maybe time its model out."""
        stream.phase = DONE
        self.active.remove(stream)
        runner = self.runners[stream.model]
        runner.active -= 1
        runner.refs -= 1
        runner.last_used = now
        if runner.queue and runner.active < runner.slots:
            self._start(runner, runner.queue.popleft(), now)
        if not runner.refs and runner.evicting:
            self._unload(runner)
            self.evictions += 1
        elif not runner.refs and self.spec.keep_alive is not None:
            runner.version += 1
            self.push(now + self.spec.keep_alive, "expire", (self, runner, runner.version))
        self._retime(now)
        self.process(now)

    def expire(self, runner: Runner, version: int, now: float) -> None:
        """A keep_alive timer ran out: unload the model if it is still idle and the timer still stands."""
        if self.runners.get(runner.model.name) is runner and runner.version == version and not runner.refs:
            self._unload(runner)
            self.expirations += 1
            self.process(now)

    def _unload(self, runner: Runner) -> None:
        del self.runners[runner.model.name]
        runner.version += 1
        self.dirty = True

    def expected_seconds(self, stream: Stream, now: float) -> float:
        """How long ``stream``, just accepted, should take: its own timing if it started, else a load and a run."""
        if stream.phase != WAITING:
            return stream.done - now
        runner = self.runners.get(stream.model)
        if runner is None:
            wait = self.model(stream.model).size * self.spec.load_seconds_per_gb
        else:
            wait = max(0.0, runner.ready_at - now)
        return wait + stream.req.prompt / stream.rates.prefill + stream.req.completion / stream.rates.decode

    # -- timing -----------------------------------------------------------------

    def _speeds(self) -> dict[str, float]:
        """Each running model's share of one stream's rates: its batch, and its turn on the GPU.

        A model's batch of n streams steps ``1 + slowdown (n - 1)`` times slower than one
        stream, and the models with streams running time-share the GPU equally (each runner
        is a process of its own, bound by memory bandwidth), as benchmarks/_workstation.py has it.
        """
        batch: dict[str, int] = {}
        for stream in self.active:
            batch[stream.model] = batch.get(stream.model, 0) + 1
        turns = len(batch)
        return {m: 1.0 / ((1.0 + self.spec.slowdown * (n - 1)) * turns) for m, n in batch.items()}

    def _retime(self, now: float, new: Stream | None = None) -> None:
        """Start ``new`` and, when streams slow each other, re-time every stream still running here."""
        speeds = self._speeds() if self.spec.slowdown else {}
        if new is not None:
            speed = speeds.get(new.model, 1.0)
            new.phase = PREFILL
            new.t0 = now
            new.rate = new.rates.prefill * speed
            new.prefill_end = now + new.req.prompt / new.rate
            new.done = new.prefill_end + new.req.completion / (new.rates.decode * speed)
            self.push(new.prefill_end, "prefill", (new, new.version))
            self.push(new.done, "done", (new, new.version))
        if not self.spec.slowdown:
            return
        for stream in self.active:
            if stream is new:
                continue
            speed = speeds[stream.model]
            base = stream.rates.prefill if stream.phase == PREFILL else stream.rates.decode
            if stream.rate == base * speed:
                continue
            stream.work0 = stream.tokens(now)
            stream.t0 = now
            old = stream.rate
            stream.rate = base * speed
            stream.version += 1
            if stream.phase == PREFILL:
                stream.prefill_end = now + max(0.0, stream.req.prompt - stream.work0) / stream.rate
                stream.done = stream.prefill_end + stream.req.completion / (stream.rates.decode * speed)
                self.push(stream.prefill_end, "prefill", (stream, stream.version))
            else:
                stream.done = now + max(0.0, stream.req.completion - stream.work0) / stream.rate
                self.decode_rate_changed(stream, old, now)
            self.push(stream.done, "done", (stream, stream.version))

    def prefilled(self, stream: Stream, now: float) -> float:
        """``stream``'s prompt is read: it decodes from now on; returns its decode rate."""
        stream.phase = DECODE
        stream.t0 = now
        stream.work0 = 0.0
        stream.rate = stream.rates.decode * (self._speeds()[stream.model] if self.spec.slowdown else 1.0)
        return stream.rate
