"""The streams running on one GPU and how fast each goes: the GPU-sharing law, a setting until measured.

A model's batch of n streams steps ``1 + slowdown (n - 1)`` times slower than
one stream (its weights are read once per step for the whole batch). How
runners of *different* models share the GPU is not measured yet (issue 31),
so it is the backend's ``sharing``:

- "time-share": the models with streams running take equal turns (each
  runner is a process of its own, bound by memory bandwidth), so a stream's
  rates divide by ``(1 + slowdown (streams of its model - 1)) x (models with
  streams)``: two models produce no more tokens together than one;
- "concurrent": every stream on the GPU counts in one batch, whatever its
  model, so rates divide by ``1 + slowdown (streams on the GPU - 1)``: a GPU
  running two models produces more tokens than one (the law of the
  independent harness issue 31 cites).

How prefill shares a step depends on the engine. On Ollama a prefilling
stream slows the others as a decoding one does (its runner builds its steps
as llama-server does; not modelled yet, docs/performance.md). A vLLM engine
(chunked prefill, decode first) fills each step's token budget
(``max_num_batched_tokens``, ``STEP_TOKENS``) with one token of
every decoding stream, then a chunk of the waiting prompts: a step with d
decoding streams and prompts to read takes ``(1 + slowdown (d - 1)) / decode
+ (STEP_TOKENS - d) / prefill`` seconds, so a long uncached prompt delays
every running stream by about its prefill time. llama-server does the same
with its physical batch of 512 tokens (measured on a real one,
``benchmarks/bench_prefill_stall.py``: the slot decoding beside a prompt lost
0.99-1.10 of the prompt's reading). The chunk goes to the prompts
in the order their requests started, as vLLM's scheduler walks its running
requests (``v1/core/sched/scheduler.py``: each takes what is left of the
budget): the oldest prompt is read, the others wait for it (shared equally,
a prompt sent last slowed every one sent before it). Every start, end and
finished prefill re-times the streams still running.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Generic, TypeVar

from ..scenario import BackendSpec
from .streams import DECODE, PREFILL, Stream

__all__ = ["STEP_TOKENS", "Gpu"]

T = TypeVar("T")

STEP_TOKENS = 8192
"""A vLLM step's token budget: ``max_num_batched_tokens`` as vLLM's OpenAI server sets it by default."""
STEPS = {"vllm": STEP_TOKENS, "llamacpp": 512}
"""Prompt tokens a step reads per engine: vLLM's budget, and llama-server's physical batch (``--ubatch-size``):
beside a prompt being read, a decoding slot got one token each 2.5 s on SmolLM2, the time of 512 of its tokens
(``benchmarks/bench_prefill_stall.py``)."""


class Gpu(Generic[T]):
    """The streams running on one backend, timed under its sharing law; ``push`` schedules their ends."""

    def __init__(
        self,
        spec: BackendSpec,
        push: Callable[[float, str, object], None],
        decode_rate_changed: Callable[[Stream[T], float, float], None],
    ) -> None:
        """Args:
        push: schedules ``(time, kind, (stream, version))``; kinds "prefill" and "done".
        decode_rate_changed: called with (stream, old rate, now) when a decoding stream is re-timed.
        """
        self.slowdown = spec.slowdown
        self.concurrent = spec.sharing == "concurrent"
        self.step_tokens = STEPS.get(spec.engine)
        self.push = push
        self.decode_rate_changed = decode_rate_changed
        self.active: list[Stream[T]] = []

    @property
    def shared(self) -> bool:
        """Whether streams slow each other at all."""
        return bool(self.slowdown) or self.step_tokens is not None

    def _batches(self) -> tuple[dict[str, list[int]], int]:
        """Decoding and prefilling streams per batch (a model's, or the GPU's when concurrent), and models running."""
        batches: dict[str, list[int]] = {}
        models = set()
        for stream in self.active:
            models.add(stream.model)
            counts = batches.setdefault("" if self.concurrent else stream.model, [0, 0])
            counts[0 if stream.phase == DECODE else 1] += 1
        return batches, len(models)

    def rate(self, stream: Stream[T], phase: int) -> float:
        """Tokens a second ``stream`` makes in ``phase`` with the streams running now."""
        base = stream.rates.prefill if phase == PREFILL else stream.rates.decode
        if not self.shared:
            return base
        batches, models = self._batches()
        decoding, prefilling = batches["" if self.concurrent else stream.model]
        turns = 1 if self.concurrent else models
        if self.step_tokens is None:
            return base / ((1.0 + self.slowdown * (decoding + prefilling - 1)) * turns)
        if phase == DECODE and stream.phase != DECODE:  # its decode, once its own prompt is read
            decoding, prefilling = decoding + 1, prefilling - 1
        step = (1.0 + self.slowdown * (decoding - 1)) / stream.rates.decode if decoding else 0.0
        chunk = max(1, self.step_tokens - decoding) if prefilling else 0
        step = (step + chunk / stream.rates.prefill) * turns
        if phase == DECODE:
            return 1.0 / step
        return chunk / step if stream is self._reading(stream.model) else 0.0

    def _reading(self, model: str) -> Stream[T] | None:
        """The prompt its batch reads now: the one whose request started first."""
        return next((s for s in self.active if s.phase == PREFILL and (self.concurrent or s.model == model)), None)

    def start(self, stream: Stream[T], now: float) -> None:
        """``stream`` got a slot: it prefills what its cache lacks, then decodes."""
        stream.phase = PREFILL
        self.active.append(stream)
        self.retime(now, new=stream)

    def retime(self, now: float, new: Stream[T] | None = None) -> None:
        """Time ``new``'s prefill and decode and, when streams slow each other, re-time every other one."""
        if new is not None:
            new.t0 = now
            new.rate = self.rate(new, PREFILL)
            self._timed(new, now, new.computed)
        if not self.shared:
            return
        for stream in self.active:
            if stream is new:
                continue
            rate = self.rate(stream, stream.phase)
            if stream.rate == rate:
                continue
            stream.work0 = stream.tokens(now)
            stream.t0 = now
            old = stream.rate
            stream.rate = rate
            stream.version += 1
            if stream.phase == PREFILL:
                self._timed(stream, now, max(0.0, stream.computed - stream.work0))
            else:
                stream.done = now + max(0.0, stream.completion - stream.work0) / stream.rate
                self.decode_rate_changed(stream, old, now)
                self.push(stream.done, "done", (stream, stream.version))

    def _timed(self, stream: Stream[T], now: float, left: float) -> None:
        """Time the end of ``stream``'s prefill, ``left`` tokens at its rate now, and of its answer after it; a
        prompt waiting behind another's (rate 0) gets no events until it is re-timed."""
        if not stream.rate:
            stream.prefill_end = stream.done = math.inf
            return
        stream.prefill_end = now + left / stream.rate
        stream.done = stream.prefill_end + stream.completion / self.rate(stream, DECODE)
        self.push(stream.prefill_end, "prefill", (stream, stream.version))
        self.push(stream.done, "done", (stream, stream.version))

    def prefilled(self, stream: Stream[T], now: float) -> float:
        """``stream``'s prompt is read: it decodes from now on; returns its decode rate."""
        stream.phase = DECODE
        stream.t0 = now
        stream.work0 = 0.0
        stream.rate = self.rate(stream, DECODE)
        if self.step_tokens is not None:  # its decode rate and the others' change with the prompts left to read
            stream.version += 1
            stream.done = now + stream.completion / stream.rate
            self.push(stream.done, "done", (stream, stream.version))
            self.retime(now)
        return stream.rate
