"""A fake Ollama workstation: one GPU scheduled as Ollama's ``server/sched.go`` does, time-compressed.

What it follows (ollama/ollama at fb30760, server/sched.go, envconfig/config.go, docs/faq.mdx):

- A request for a resident model uses its runner at once (``getRunner``), even one
  marked for eviction; any other goes to one FIFO of pending requests (at most
  ``OLLAMA_MAX_QUEUE`` = 512, else "server busy", 503) served one at a time
  (``processPending``), so a load that must wait for an eviction holds up every
  later request for a non-resident model.
- A load happens when the model fits in the VRAM left by resident runners and
  fewer than ``OLLAMA_MAX_LOADED_MODELS`` (default 3 per GPU) are resident; a
  first model always loads. Otherwise one runner is evicted
  (``findRunnerToUnload``): runners sorted by keep_alive, then name, the first
  idle one, else the first one, whose requests are waited for. The model is
  resident (counted in VRAM) from the start of its load; requests for it wait
  until the load is done (seconds per GB of this workstation, plus a start cost).
- keep_alive (default 5 min, per request ``keep_alive`` overrides, negative is
  forever, 0 unloads when idle) starts when a runner's last request ends;
  a new request stops the timer.
- ``OLLAMA_NUM_PARALLEL`` slots per runner (here 4, a lab's setting; Ollama's
  default is 1); embedding models get one slot. Requests beyond the slots
  wait in the runner's own FIFO.

Where it simplifies: no partial CPU offload (a workstation lists only models
that fit its VRAM); no needsReload (options never change); unloading frees
VRAM at once (Ollama waits up to 5 s for VRAM to recover); concurrent loads do
not share disk bandwidth; no load timeout; a request always produces exactly
its ``num_predict``/``max_tokens`` tokens; prompts are counted as
whitespace-separated words. GPU sharing is a model, not a measurement: a
model's batch of n streams takes ``1 + BATCH_COST * (n - 1)`` times a single
stream's step (weights read once per step), and models with active streams
time-share the GPU equally (each is bound by memory bandwidth), so aggregate
throughput is sublinear in streams and does not grow with models.

Time: all specs are in lab seconds; the workstation runs ``compression`` times
faster than the lab (every duration, keep_alive included, scaled alike), and
reports durations (``eval_duration`` ...) in the compressed wall time it lives
in, so rates learnt from them agree with the clock a router reads.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any

GB = 1_000_000_000
BATCH_COST = 0.25
"""Extra step time per extra stream in one model's batch: four streams give 2.3x one stream's tokens/s."""
TICK = 0.025
"""Wall seconds between two advances of the streams."""
CHUNK_WALL = 0.1
"""Wall seconds between two chunks of one stream (tokens are batched so a chunk costs routers alike)."""


class ServerBusy(Exception):
    """The pending queue is full (Ollama's ErrMaxQueue, answered 503)."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    disk_gb: float
    """Size on disk (``/api/tags`` ``size``): what a load reads."""
    vram_gb: float
    """Resident size with its KV cache for every slot (``/api/ps`` ``size_vram``)."""
    family: str = "llama"
    parameter_size: str = "8B"
    embedding: bool = False


@dataclass(frozen=True, slots=True)
class Speed:
    decode: float
    """Tokens/s of one stream alone on the GPU."""
    prefill: float
    """Prompt tokens/s of one stream alone on the GPU."""


@dataclass(frozen=True, slots=True)
class WorkstationSpec:
    name: str
    gpu: str
    vram_gb: float
    load_s_per_gb: float
    speeds: Mapping[str, Speed]
    """Models pulled here, with their speed on this GPU."""
    num_parallel: int = 4
    max_loaded: int = 3
    keep_alive: float = 300.0
    max_queue: int = 512
    load_start_s: float = 1.0
    """Starting a runner, before the weights are read."""
    preload: tuple[str, ...] = ()
    """Resident (and idle) when the workstation starts, as left by earlier use."""


@dataclass(eq=False)
class Stream:
    """One request's work on a runner, in lab seconds and tokens."""

    prompt: int
    out: int
    prompt_left: float = -1.0
    produced: float = 0.0
    emitted: int = 0
    last_chunk: float = -math.inf
    prefill_s: float = 0.0
    decode_s: float = 0.0
    queued_at: float = 0.0
    """Lab time it asked its runner for a slot; ``started_at`` when it got one, ``first_at`` its first token."""
    started_at: float = 0.0
    first_at: float | None = None
    chunks: asyncio.Queue[int] = field(default_factory=asyncio.Queue)
    """Tokens per chunk; 0 ends the stream."""
    slot: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.prompt = max(1, self.prompt)
        self.out = max(0, self.out)
        if self.prompt_left < 0:
            self.prompt_left = float(self.prompt)


@dataclass(eq=False)
class Runner:
    spec: ModelSpec
    speed: Speed
    parallel: int
    session: float
    """keep_alive in lab seconds (inf: forever, <= 0: unload when idle)."""
    refs: int = 0
    loading: bool = True
    evicting: bool = False
    expires_at: float | None = None
    timer: asyncio.TimerHandle | None = None
    active: list[Stream] = field(default_factory=list)
    waiting: deque[Stream] = field(default_factory=deque)
    ready: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(slots=True)
class Stats:
    loads: int = 0
    load_seconds: float = 0.0
    """Lab seconds spent loading, summed over loads."""
    evictions: int = 0
    expiries: int = 0
    busy: int = 0
    requests: int = 0
    tokens: int = 0


@dataclass(eq=False)
class _Pending:
    model: str
    keep_alive: float | None
    done: asyncio.Future[Runner]


class Workstation:
    """The scheduler and the GPU of one fake Ollama; the HTTP face is in ``_ollama_app.py``."""

    def __init__(self, spec: WorkstationSpec, models: Mapping[str, ModelSpec], compression: float = 1.0) -> None:
        self.spec = spec
        self.models = {name: models[name] for name in spec.speeds}
        self.compression = compression
        self.loaded: dict[str, Runner] = {}
        self.stats = Stats()
        self.trace: list[dict[str, Any]] = []
        """Each answered request's times (``_ollama_app._trace``), for bench_pool's ``--trace``."""
        self._pending: asyncio.Queue[_Pending] = asyncio.Queue(spec.max_queue)
        self._work = asyncio.Event()
        self._unloaded = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._tasks = {asyncio.create_task(self._process_pending()), asyncio.create_task(self._advance())}
        for name in spec.preload:
            runner = self._runner(name, None)
            runner.loading = False
            runner.ready.set()
            self._idle(runner)

    def now(self) -> float:
        """Lab seconds since start."""
        return (self._loop.time() - self._t0) * self.compression

    async def sleep(self, lab_seconds: float) -> None:
        await asyncio.sleep(lab_seconds / self.compression)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def used_vram_gb(self) -> float:
        return sum(r.spec.vram_gb for r in self.loaded.values())

    def busy_streams(self) -> int:
        return sum(len(r.active) for r in self.loaded.values())

    # --- the runner a request gets (getRunner, processPending) ---

    async def acquire(self, model: str, keep_alive: float | None = None) -> tuple[Runner, float, float]:
        """The resident runner for ``model`` (loading it as Ollama would), the lab seconds waited for it, and
        how many of those were its load (the rest: waiting in the pending queue, for an eviction).

        Raises:
            KeyError: the model is not pulled here.
            ServerBusy: the pending queue is full.
        """
        if model not in self.models:
            raise KeyError(model)
        self.stats.requests += 1
        start = self.now()
        runner = self.loaded.get(model)
        if runner is not None:
            self._use(runner, keep_alive)
        else:
            pending = _Pending(model, keep_alive, self._loop.create_future())
            try:
                self._pending.put_nowait(pending)
            except asyncio.QueueFull:
                self.stats.busy += 1
                raise ServerBusy("server busy, please try again.  maximum pending requests exceeded") from None
            try:
                runner = await pending.done
            except asyncio.CancelledError:
                if pending.done.done() and not pending.done.cancelled():
                    self.release(pending.done.result())
                pending.done.cancel()
                raise
        ready_from = self.now()
        try:
            await runner.ready.wait()
        except asyncio.CancelledError:
            self.release(runner)
            raise
        end = self.now()
        return runner, end - start, end - ready_from

    def _use(self, runner: Runner, keep_alive: float | None) -> None:
        runner.refs += 1
        if runner.timer is not None:
            runner.timer.cancel()
            runner.timer = None
        runner.expires_at = None
        if keep_alive is not None:
            runner.session = keep_alive

    async def _process_pending(self) -> None:
        while True:
            pending = await self._pending.get()
            while not pending.done.cancelled():
                runner = self.loaded.get(pending.model)
                if runner is not None:
                    self._use(runner, pending.keep_alive)
                    pending.done.set_result(runner)
                    break
                spec = self.models[pending.model]
                if not self.loaded or (
                    len(self.loaded) < self.spec.max_loaded and self.used_vram_gb() + spec.vram_gb <= self.spec.vram_gb
                ):
                    pending.done.set_result(self._load(pending))
                    break
                victim = self._victim()
                victim.session, victim.evicting = 0.0, True
                if victim.timer is not None:
                    victim.timer.cancel()
                    victim.timer = None
                self._unloaded.clear()
                if victim.refs <= 0:
                    self._unload(victim)
                await self._unloaded.wait()  # any unload, as Ollama's unloadedCh

    def _victim(self) -> Runner:
        """``findRunnerToUnload``: by keep_alive then name, the first idle runner, else the first."""
        ranked = sorted(self.loaded.values(), key=lambda r: (r.session, r.spec.name))
        return next((r for r in ranked if r.refs == 0), ranked[0])

    def _runner(self, model: str, keep_alive: float | None) -> Runner:
        spec = self.models[model]
        parallel = 1 if spec.embedding else self.spec.num_parallel
        session = self.spec.keep_alive if keep_alive is None else keep_alive
        runner = Runner(spec, self.spec.speeds[model], parallel, session)
        self.loaded[model] = runner
        return runner

    def _load(self, pending: _Pending) -> Runner:
        runner = self._runner(pending.model, pending.keep_alive)
        runner.refs = 1
        seconds = self.spec.load_start_s + runner.spec.disk_gb * self.spec.load_s_per_gb
        self.stats.loads += 1
        self.stats.load_seconds += seconds

        async def load() -> None:
            await self.sleep(seconds)
            runner.loading = False
            runner.ready.set()

        task = asyncio.create_task(load())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return runner

    def release(self, runner: Runner) -> None:
        """A request is done with ``runner`` (``processCompleted``): start keep_alive or unload."""
        runner.refs -= 1
        if runner.refs <= 0:
            self._idle(runner)

    def _idle(self, runner: Runner) -> None:
        if runner.session <= 0:
            self._unload(runner)
        elif math.isfinite(runner.session):
            runner.expires_at = self.now() + runner.session
            runner.timer = self._loop.call_later(runner.session / self.compression, self._expire, runner)

    def _expire(self, runner: Runner) -> None:
        runner.timer = None
        if runner.refs <= 0:
            self.stats.expiries += 1
            self._unload(runner)

    def _unload(self, runner: Runner) -> None:
        if self.loaded.get(runner.spec.name) is runner:
            del self.loaded[runner.spec.name]
            self.stats.evictions += runner.evicting
            self._unloaded.set()

    # --- the GPU ---

    async def run(self, runner: Runner, stream: Stream) -> AsyncGenerator[int, None]:
        """Tokens of ``stream`` as they are produced (each chunk's count), once a slot of ``runner`` is free."""
        stream.queued_at = stream.started_at = self.now()
        if len(runner.active) < runner.parallel:
            runner.active.append(stream)
        else:
            runner.waiting.append(stream)
            try:
                await stream.slot.wait()
                stream.started_at = self.now()
            except asyncio.CancelledError:
                if stream in runner.waiting:
                    runner.waiting.remove(stream)
                self._free(runner, stream)
                raise
        self._work.set()
        try:
            while n := await stream.chunks.get():
                self.stats.tokens += n
                yield n
        finally:
            self._free(runner, stream)

    def _free(self, runner: Runner, stream: Stream) -> None:
        """``stream`` leaves its slot (done or cancelled); the next waiting stream takes it."""
        if stream in runner.active:
            runner.active.remove(stream)
            if runner.waiting:
                nxt = runner.waiting.popleft()
                runner.active.append(nxt)
                nxt.slot.set()

    async def _advance(self) -> None:
        last = self._loop.time()
        while True:
            if not self.busy_streams():
                self._work.clear()
                await self._work.wait()
                last = self._loop.time()
            await asyncio.sleep(TICK)
            wall = self._loop.time()
            self._step((wall - last) * self.compression, wall)
            last = wall

    def _step(self, dt: float, wall: float) -> None:
        runners = [r for r in self.loaded.values() if r.active and not r.loading]
        for runner in runners:
            slow = (1 + BATCH_COST * (len(runner.active) - 1)) * len(runners)
            prefill, decode = runner.speed.prefill / slow, runner.speed.decode / slow
            for stream in list(runner.active):
                budget = dt
                if stream.prompt_left > 0:
                    used = min(budget, stream.prompt_left / prefill)
                    stream.prompt_left -= used * prefill
                    stream.prefill_s += used
                    budget -= used
                    if stream.prompt_left > 1e-9:
                        continue
                    stream.prompt_left = 0.0
                if budget > 0 and stream.produced < stream.out:
                    used = min(budget, (stream.out - stream.produced) / decode)
                    stream.produced += used * decode
                    stream.decode_s += used
                ready = min(stream.out, int(stream.produced + 1e-9)) - stream.emitted
                done = stream.produced >= stream.out - 1e-9
                if ready > 0 and (stream.emitted == 0 or done or wall - stream.last_chunk >= CHUNK_WALL):
                    if stream.first_at is None:
                        stream.first_at = self.now()
                    stream.chunks.put_nowait(ready)
                    stream.emitted += ready
                    stream.last_chunk = wall
                if done:
                    stream.chunks.put_nowait(0)
                    self._free(runner, stream)
