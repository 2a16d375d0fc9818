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

Without a slowdown, streams never slow each other. Every start and end
re-times the streams still running (processor sharing); a prefilling stream
slows the others as a decoding one does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from ..scenario import BackendSpec
from .streams import DECODE, PREFILL, Stream

__all__ = ["Gpu"]

T = TypeVar("T")


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
        self.push = push
        self.decode_rate_changed = decode_rate_changed
        self.active: list[Stream[T]] = []

    def speeds(self) -> dict[str, float]:
        """Each running model's share of one stream's rates alone on the GPU."""
        batch: dict[str, int] = {}
        for stream in self.active:
            batch[stream.model] = batch.get(stream.model, 0) + 1
        if self.concurrent:
            speed = 1.0 / (1.0 + self.slowdown * (len(self.active) - 1))
            return dict.fromkeys(batch, speed)
        turns = len(batch)
        return {m: 1.0 / ((1.0 + self.slowdown * (n - 1)) * turns) for m, n in batch.items()}

    def start(self, stream: Stream[T], now: float) -> None:
        """``stream`` got a slot: it prefills what its cache lacks, then decodes."""
        self.active.append(stream)
        self.retime(now, new=stream)

    def retime(self, now: float, new: Stream[T] | None = None) -> None:
        """Time ``new``'s prefill and decode and, when streams slow each other, re-time every other one."""
        speeds = self.speeds() if self.slowdown else {}
        if new is not None:
            speed = speeds.get(new.model, 1.0)
            new.phase = PREFILL
            new.t0 = now
            new.rate = new.rates.prefill * speed
            new.prefill_end = now + new.computed / new.rate
            new.done = new.prefill_end + new.completion / (new.rates.decode * speed)
            self.push(new.prefill_end, "prefill", (new, new.version))
            self.push(new.done, "done", (new, new.version))
        if not self.slowdown:
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
                stream.prefill_end = now + max(0.0, stream.computed - stream.work0) / stream.rate
                stream.done = stream.prefill_end + stream.completion / (stream.rates.decode * speed)
                self.push(stream.prefill_end, "prefill", (stream, stream.version))
            else:
                stream.done = now + max(0.0, stream.completion - stream.work0) / stream.rate
                self.decode_rate_changed(stream, old, now)
            self.push(stream.done, "done", (stream, stream.version))

    def prefilled(self, stream: Stream[T], now: float) -> float:
        """``stream``'s prompt is read: it decodes from now on; returns its decode rate."""
        stream.phase = DECODE
        stream.t0 = now
        stream.work0 = 0.0
        stream.rate = stream.rates.decode * (self.speeds()[stream.model] if self.slowdown else 1.0)
        return stream.rate
