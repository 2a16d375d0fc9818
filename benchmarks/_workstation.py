"""The simulator's workstation (``mindrouter.simulate.workstation``) on asyncio's clock, time-compressed.

bench_pool's fake Ollamas are not a second model of Ollama: each drives the
very object ``mr simulate`` drives, so the simulator-against-live comparison
tests the router and the wire, not two copies of one assumption. This module
is the driver: it keeps the model's timers in a heap, fires those that are
due (at their own lab time) before every request arrives or leaves, and arms
one asyncio timer for the next; requests wait on events that the model's
"prefill" and "done" set. ``_ollama_app.py`` is the HTTP face.

Time: specs are in lab seconds; the workstation runs ``compression`` times
faster than the lab (keep_alive included), and the face reports durations
(``eval_duration`` ...) in the compressed wall time it lives in, so rates
learnt from them agree with the clock a router reads.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mindrouter.simulate.scenario import BackendSpec, ModelSpec
from mindrouter.simulate.workstation import DONE, Options, Prompt, Runner, Segment, ServerBusy, Stream, Workstation

__all__ = ["CHUNK_WALL", "LiveStation", "ServerBusy", "Stats", "Waits"]

CHUNK_WALL = 0.1
"""Wall seconds between two chunks of one stream (tokens are batched so a chunk costs routers alike)."""


@dataclass(slots=True)
class Stats:
    busy: int = 0
    """Requests answered "server busy" (the queue was full)."""
    requests: int = 0
    tokens: int = 0
    prompt_tokens: int = 0
    """Prompt tokens of answered requests, as sent."""
    computed_tokens: int = 0
    """The part of those the engine prefilled (the rest its prompt cache held)."""


@dataclass(slots=True, eq=False)
class Waits:
    """What the face of one request waits for: the end of its prefill, and its last token."""

    prefilled: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class LiveStation:
    """One workstation model on a scaled clock."""

    def __init__(self, spec: BackendSpec, models: Mapping[str, ModelSpec], compression: float) -> None:
        self.spec = spec
        self.models = {name: models[name] for name in spec.models}
        self.compression = compression
        self.stats = Stats()
        self.trace: list[dict[str, Any]] = []
        """Each answered request's times (lab seconds), for bench_pool's ``--trace``."""
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self.station: Workstation[Waits] = Workstation(spec, self.models.__getitem__, self._push, _unused)

    def now(self) -> float:
        """Lab seconds since start."""
        return (self._loop.time() - self._t0) * self.compression

    def wall(self, lab_seconds: float) -> float:
        return lab_seconds / self.compression

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    @property
    def runners(self) -> dict[str, Runner[Waits]]:
        return self.station.runners

    # --- the model's timers ---

    def _push(self, t: float, kind: str, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, payload))
        if self._heap[0][1] == self._seq:
            self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        if self._heap:
            self._timer = self._loop.call_at(self._t0 + self.wall(self._heap[0][0]), self.advance)

    def advance(self) -> float:
        """Fire every timer due by now, in order, each at its own time; returns now."""
        now = self.now()
        while self._heap and self._heap[0][0] <= now:
            t, _, kind, payload = heapq.heappop(self._heap)
            if kind == "loaded":
                self.station.loaded(payload[1], t)
            elif kind == "expire":
                self.station.expire(payload[1], payload[2], t)
            else:
                stream, version = payload
                if not stream.due(version, kind):
                    continue
                if kind == "prefill":
                    self.station.prefilled(stream, t)
                    stream.tag.prefilled.set()
                else:
                    self.station.finish(stream, t)
                    stream.tag.done.set()
        self._arm()
        return now

    # --- requests ---

    def submit(self, model: str, prompt: Prompt, completion: int, answer: Segment, options: Options) -> Stream[Waits]:
        """A request arrives.

        Raises:
            KeyError: the model is not pulled here.
            ServerBusy: the server's queue is full.
        """
        if model not in self.models:
            raise KeyError(model)
        self.stats.requests += 1
        now = self.advance()
        try:
            return self.station.accept(Waits(), model, prompt, completion, now, answer, options)
        except ServerBusy:
            self.stats.busy += 1
            raise

    async def tokens(self, stream: Stream[Waits]) -> AsyncIterator[int]:
        """Tokens as they are produced, a chunk's count at a time: the first at the end of the prefill
        (its time to first token), then every ``CHUNK_WALL``; nothing for an embedding."""
        req = stream.tag
        await req.prefilled.wait()
        sent = 0
        while True:
            finished = req.done.is_set()
            now = self.advance()
            made = stream.completion if finished else min(stream.completion, max(1, int(stream.tokens(now))))
            if made > sent:
                self.stats.tokens += made - sent
                yield made - sent
                sent = made
            if finished or stream.phase == DONE:
                return
            try:
                await asyncio.wait_for(req.done.wait(), CHUNK_WALL)
            except TimeoutError:
                pass

    def leave(self, stream: Stream[Waits]) -> None:
        """The request is over for its client: if the model has not finished it, it is cancelled there."""
        if stream.phase != DONE:
            self.station.cancel(stream, self.advance())
            return
        self.stats.prompt_tokens += stream.prompt.tokens
        self.stats.computed_tokens += stream.computed
        self.trace.append(
            {
                "model": stream.model,
                "prompt": stream.prompt.tokens,
                "cached": stream.cached,
                "out": stream.completion,
                "runner_wait": stream.runner_at - stream.arrived,
                "load_wait": stream.arrived + stream.load - stream.runner_at,
                "slot_wait": stream.began - stream.arrived - stream.load,
                "prefill": stream.prefill_end - stream.began,
                "decode": stream.done - stream.prefill_end,
                "end": stream.done,
            }
        )


_unused: Callable[[Stream[Waits], float, float], None] = lambda stream, old, now: None  # noqa: E731
"""The face reads each stream's rate when it streams; nothing to do when it changes."""
