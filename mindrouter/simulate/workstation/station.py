"""One workstation: its server's queue, its runners (loads, evictions, keep_alive, slots), its GPU and caches.

Theory of operation, after Ollama's ``server/sched.go`` (read at fb30760):

- A request for a resident model whose load options match goes to its
  runner at once, even one still loading or marked to unload
  (``getRunner``, ``useLoadedRunner``); a request's ``keep_alive`` becomes
  the runner's. Any other waits in one FIFO (``pendingReqCh``, at most
  ``max_queue``, else ``ServerBusy``), handled one at a time: the head blocks
  every request behind it.
- The head loads its model when fewer than ``max_loaded`` runners are
  resident and it fits (``ollama.py``): the first load always, any other in
  80% of the free VRAM. Otherwise a runner is chosen to unload
  (``findRunnerToUnload``: by keep_alive, then name, the first idle one, else
  the first) and its keep_alive set to 0; an idle one unloads at once, and
  the head tries again; a busy one unloads when its last request ends, and
  the queue waits for an unload (any: Ollama's ``unloadedCh``). A head
  whose runner must reload (other ``num_ctx``) unloads it the same way. A
  load takes ``load_start_seconds + size x load_seconds_per_gb``; requests
  for a loading model wait for it (Ollama blocks on the runner's lock).
- A runner serves ``ollama.slots`` requests at once; more wait in its own
  queue. When its last request ends, it unloads after its keep_alive.
- A request that gets a slot asks the runner's prompt cache (``caches.py``)
  how much of its prompt is held, and prefills the rest; when it ends, the
  cache keeps its prompt and answer. An unload drops the cache.
- Streams share the GPU by its law (``gpu.py``).

A backend without ``vram`` keeps every model it serves resident and never
loads. What the daemon would poll (loaded models, their VRAM, free VRAM,
sizes, parallel, max loaded) is ``snapshot()``. The driver (the simulator's
event heap, or a benchmark's scaled asyncio clock) calls back at the times
``push`` asks: "loaded" (``loaded``), "expire" (``expire``), and a stream's
"prefill" and "done" (``prefilled``, ``finish``) while ``Stream.due``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from ...names import STALLING_ENGINES
from ...scheduler import Backend, Modality
from ..scenario import GB, BackendSpec, ModelSpec
from .caches import BlockCache, SlotCache
from .gpu import Gpu
from .ollama import HEADROOM, Context, context, runner_vram, slots
from .prompts import BLOCK, Prompt, Segment
from .streams import DECODE, DONE, WAITING, Options, Runner, Stream

__all__ = ["HOST_CACHE_MB", "ServerBusy", "Workstation"]

T = TypeVar("T")

HOST_CACHE_MB = 8192 * 2**20 / 1e6
"""llama-server's ``--cache-ram`` (8192 MiB), in MB: host memory for sequences saved from reused slots."""
KV_MB_PER_TOKEN = 0.131
"""KV cache per token where a model does not say (an 8B llama's at f16: 32 layers x 8 heads x 128 x 2 x 2 bytes)."""


NO_OPTIONS = Options()


class ServerBusy(Exception):
    """The server's queue is full (Ollama's ErrMaxQueue, answered 503)."""


class Workstation(Generic[T]):
    """One simulated backend; ``push(time, kind, payload)`` schedules what happens next on it."""

    def __init__(
        self,
        spec: BackendSpec,
        models: Callable[[str], ModelSpec],
        push: Callable[[float, str, object], None],
        decode_rate_changed: Callable[[Stream[T], float, float], None],
    ) -> None:
        """Args:
        models: each model's ``[models]`` entry.
        push: schedules ``(time, kind, payload)`` for the driver: "loaded", "expire", "prefill", "done".
        decode_rate_changed: called with (stream, old rate, now) when a decoding stream is re-timed.
        """
        self.spec = spec
        self.model = models
        self.push = push
        self.gpu: Gpu[T] = Gpu(spec, push, decode_rate_changed)
        self.pending: deque[Stream[T]] = deque()
        self.runners: dict[str, Runner[T]] = {}
        self.blocked = False
        """The queue's head waits for a runner to unload."""
        self.dirty = True
        """What the daemon would poll has changed since the core last heard."""
        self.loads = 0
        self.load_seconds = 0.0
        self.evictions = 0
        self.expirations = 0
        for m in spec.loaded_models if spec.loads_models else spec.models:
            runner = self._runner(m, Options())
            if spec.loads_models:
                self._idle(runner, 0.0)  # left idle by earlier use: its keep_alive runs from the start

    @property
    def active(self) -> list[Stream[T]]:
        return self.gpu.active

    # -- what the daemon polls ----------------------------------------------

    def used_vram(self) -> float:
        return sum(r.vram for r in self.runners.values())

    def snapshot(self) -> Backend:
        """The backend as the daemon's poll would describe it to the core."""
        spec = self.spec
        embedding = {m: frozenset({Modality.EMBEDDINGS}) for m in spec.models if self.model(m).kind == "embedding"}
        # What the daemon reads from Ollama's /api/show: a model that cannot complete runs with one slot.
        one_slot = {m: 1 for m in embedding} if spec.engine == "ollama" and spec.parallel else {}
        if not spec.loads_models:
            return Backend(
                id=spec.name,
                name=spec.name,
                models=frozenset(spec.models),
                loaded_models=frozenset(spec.loaded_models),
                model_modalities=embedding,
                max_concurrent=spec.max_concurrent,
                priority=spec.priority,
                parallel=spec.parallel,
                model_parallel=one_slot,
                prefill_stalls=spec.engine in STALLING_ENGINES,
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
            model_vram={m: round(self._need(m, Options())[1] * GB) for m in spec.models},
            model_sizes={m: round(self.model(m).size * GB) for m in spec.models},
            resident_vram={m: round(r.vram * GB) for m, r in self.runners.items()},
            resident_context={m: r.context.tokens for m, r in self.runners.items()},
            parallel=spec.parallel,
            model_parallel=one_slot,
            max_loaded=spec.max_loaded,
        )

    # -- requests -------------------------------------------------------------

    def accept(
        self,
        tag: T,
        model: str,
        prompt: Prompt,
        completion: int,
        now: float,
        answer: Segment,
        options: Options = NO_OPTIONS,
    ) -> Stream[T]:
        """A request arrives: it uses its model's runner, or joins the server's queue.

        Raises:
            ServerBusy: the queue already holds ``max_queue`` requests.
        """
        stream = Stream(tag, model, prompt, completion, self.spec.rate(model), now, answer, options)
        runner = self.runners.get(model)
        if runner is not None and not self._reloads(runner, stream):
            self._use(runner, stream, now)
            return stream
        if len(self.pending) >= self.spec.max_queue:
            raise ServerBusy("server busy, please try again.  maximum pending requests exceeded")
        self.pending.append(stream)
        self.process(now)
        return stream

    def process(self, now: float) -> None:
        """Ollama's pending loop: place the head, load or evict for it, or stop where it must wait."""
        spec = self.spec
        while self.pending and not self.blocked:
            head = self.pending[0]
            runner = self.runners.get(head.model)
            if runner is not None:
                if runner.loading:
                    return  # blocked on the runner's lock until its load ends
                if not self._reloads(runner, head):
                    self.pending.popleft()
                    self._use(runner, head, now)
                    continue
                victim = runner
            else:
                ctx, need = self._need(head.model, head.options)
                full = spec.max_loaded is not None and len(self.runners) >= spec.max_loaded
                if not full and self._fits(need):
                    self.pending.popleft()
                    self._load(head, ctx, need, now)
                    continue
                ranked = sorted((r for r in self.runners.values() if not r.loading), key=Runner.rank)
                if not ranked:
                    return  # every resident runner is loading: the queue goes on when one is ready
                victim = next((r for r in ranked if not r.refs), ranked[0])
            victim.session = 0.0  # unloads once idle, whatever else happens meanwhile
            victim.chosen = True
            victim.version += 1
            if victim.refs:
                self.blocked = True
                return
            self._unload(victim)
            self.evictions += 1

    def _reloads(self, runner: Runner[T], stream: Stream[T]) -> bool:
        """``needsReload``: the request asks for another context than the runner's (an automatic one never does)."""
        if not self.spec.loads_models:
            return False
        ctx = context(self.spec, runner.model, stream.options.num_ctx)
        return not (ctx.auto and runner.context.auto) and ctx.tokens != runner.context.tokens

    def _need(self, model: str, options: Options) -> tuple[Context, float]:
        spec = self.model(model)
        ctx = context(self.spec, spec, options.num_ctx)
        return ctx, runner_vram(self.spec, spec, ctx)

    def _fits(self, need: float) -> bool:
        assert self.spec.vram is not None
        if not self.runners:
            return True  # the first load goes ahead, fitting or not
        return need <= HEADROOM * (self.spec.vram - self.used_vram()) + 1e-9

    def _runner(self, model: str, options: Options, ctx: Context | None = None, vram: float = 0.0) -> Runner[T]:
        spec = self.model(model)
        if ctx is None:
            ctx, vram = self._need(model, options)
        keep = self.spec.keep_alive if options.keep_alive is None else options.keep_alive
        n = slots(self.spec, spec)
        if self.spec.engine == "llamacpp" and not math.isfinite(n):
            n = self.spec.max_concurrent  # llama-server has as many slots as it serves requests at once
        runner: Runner[T] = Runner(spec, n, ctx, vram, math.inf if keep is None or keep < 0 else keep)
        if spec.kind != "embedding":
            runner.cache = self._cache(spec, int(n) if math.isfinite(n) else self.spec.max_concurrent)
        self.runners[model] = runner
        return runner

    def _cache(self, model: ModelSpec, n: int) -> SlotCache | BlockCache | None:
        engine = self.spec.engine
        if engine in ("ollama", "llamacpp"):
            return SlotCache(n, int(HOST_CACHE_MB / (model.kv_mb_per_token or KV_MB_PER_TOKEN)))
        if engine == "vllm":
            tokens = self.spec.kv_cache_tokens
            return BlockCache(None if tokens is None else tokens // BLOCK)
        return None

    def _load(self, head: Stream[T], ctx: Context, need: float, now: float) -> None:
        seconds = self.spec.load_start_seconds + self.model(head.model).size * self.spec.load_seconds_per_gb
        runner = self._runner(head.model, head.options, ctx, need)
        runner.loading = True
        runner.ready_at = now + seconds
        runner.refs = 1
        head.runner_at = now
        runner.queue.append(head)
        self.loads += 1
        self.load_seconds += seconds
        self.dirty = True
        self.push(runner.ready_at, "loaded", (self, runner))

    def _use(self, runner: Runner[T], stream: Stream[T], now: float) -> None:
        """``useLoadedRunner``: ``stream`` holds ``runner``; it starts when a slot is free and the load is done."""
        runner.refs += 1
        runner.version += 1  # stops its keep_alive timer
        stream.runner_at = now
        keep = stream.options.keep_alive
        if keep is not None:
            runner.session = math.inf if keep < 0 else keep
        if runner.loading:
            runner.queue.append(stream)
            return
        stream.load = now - stream.arrived
        if runner.active < runner.slots:
            self._start(runner, stream, now)
        else:
            runner.queue.append(stream)

    def loaded(self, runner: Runner[T], now: float) -> None:
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

    def _start(self, runner: Runner[T], stream: Stream[T], now: float) -> None:
        runner.active += 1
        runner.last_used = now
        stream.began = now
        cache = runner.cache
        if isinstance(cache, SlotCache):
            stream.slot, stream.cached = cache.take(stream.prompt, now)
        elif isinstance(cache, BlockCache):
            stream.blocks, stream.cached = cache.take(stream.prompt)
        self.gpu.start(stream, now)

    def prefilled(self, stream: Stream[T], now: float) -> float:
        """``stream``'s prompt is read: it decodes from now on; returns its decode rate."""
        return self.gpu.prefilled(stream, now)

    def finish(self, stream: Stream[T], now: float) -> None:
        """``stream`` wrote its last token: free its slot, start the next, maybe time its model out."""
        self._end(stream, stream.completion, now)

    def cancel(self, stream: Stream[T], now: float) -> None:
        """The client left: ``stream`` leaves the queue it waits in, or stops where it is."""
        if stream.phase == DONE:
            return
        if stream.phase == WAITING:
            if stream in self.pending:
                self.pending.remove(stream)
                return
            runner = self.runners[stream.model]
            runner.queue.remove(stream)
            stream.phase = DONE
            runner.refs -= 1
            if not runner.refs:
                self._idle(runner, now)
                self.process(now)
            return
        stream.version += 1  # its prefill and done events no longer stand
        self._end(stream, int(stream.tokens(now)) if stream.phase == DECODE else 0, now)

    def _end(self, stream: Stream[T], produced: int, now: float) -> None:
        stream.phase = DONE
        self.gpu.active.remove(stream)
        runner = self.runners[stream.model]
        answer = (Segment(stream.answer.key, produced),) if produced else ()
        if isinstance(runner.cache, SlotCache):
            runner.cache.release(stream.slot, stream.prompt.segments + answer, now)
        elif isinstance(runner.cache, BlockCache):
            runner.cache.release(stream.blocks, stream.prompt.segments + answer)
        runner.active -= 1
        runner.refs -= 1
        runner.last_used = now
        if runner.queue and runner.active < runner.slots:
            self._start(runner, runner.queue.popleft(), now)
        if not runner.refs:
            self._idle(runner, now)
        self.gpu.retime(now)
        self.process(now)

    def _idle(self, runner: Runner[T], now: float) -> None:
        """``runner``'s last request ended: it unloads now (keep_alive 0) or after its keep_alive."""
        if runner.evicting:
            self._unload(runner)
            self.evictions += runner.chosen
        elif math.isfinite(runner.session):
            runner.version += 1
            self.push(now + runner.session, "expire", (self, runner, runner.version))

    def expire(self, runner: Runner[T], version: int, now: float) -> None:
        """A keep_alive timer ran out: unload the model if it is still idle and the timer still stands."""
        if self.runners.get(runner.model.name) is runner and runner.version == version and not runner.refs:
            self._unload(runner)
            self.expirations += 1
            self.process(now)

    def _unload(self, runner: Runner[T]) -> None:
        del self.runners[runner.model.name]
        runner.version += 1
        self.blocked = False
        self.dirty = True

    def expected_seconds(self, stream: Stream[T], now: float) -> float:
        """How long ``stream``, just accepted, should take: its own timing if it started (and is not waiting for
        another prompt's reading), else a load and a run."""
        if stream.phase != WAITING and math.isfinite(stream.done):
            return stream.done - now
        runner = self.runners.get(stream.model)
        if runner is None:
            wait = self.spec.load_start_seconds + self.model(stream.model).size * self.spec.load_seconds_per_gb
        else:
            wait = max(0.0, runner.ready_at - now)
        return wait + stream.prompt.tokens / stream.rates.prefill + stream.completion / stream.rates.decode
