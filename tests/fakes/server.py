"""What every fake server shares: lifecycle, the concurrency gate, pacing, faults and counters."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, Self

from aiohttp import web

from .wire import Received, _Generation

DEFAULT_SIZE = 2_000_000_000


class _Gate:
    """A FIFO concurrency limit whose queue length is visible."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.active = 0
        self.queue: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        if self.limit is None or (self.active < self.limit and not self.queue):
            self.active += 1
            return
        fut = asyncio.get_running_loop().create_future()
        self.queue.append(fut)
        try:
            await fut  # release() hands its slot over: active is unchanged
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()
            else:
                self.queue.remove(fut)
            raise

    def release(self) -> None:
        while self.queue:
            fut = self.queue.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.active -= 1


class _Drop(Exception):
    pass


class _FakeServer:
    """What both fakes share: lifecycle, counters, pacing and faults."""

    def __init__(
        self,
        *,
        models: Iterable[str] | Mapping[str, int] = ("m1",),
        loaded: Iterable[str] | None = None,
        tokens_per_second: float | None = None,
        prefill_tokens_per_second: float | None = None,
        completion_tokens: int = 8,
        max_concurrent: int | None = None,
        embedding_dim: int = 4,
        first_byte_delay: float = 0.0,
    ) -> None:
        self.models: dict[str, int] = dict(models) if isinstance(models, Mapping) else {m: DEFAULT_SIZE for m in models}
        self.loaded: set[str] = set(self.models if loaded is None else loaded)
        self.tokens_per_second = tokens_per_second
        self.prefill_tokens_per_second = prefill_tokens_per_second
        self.completion_tokens = completion_tokens
        self.embedding_dim = embedding_dim
        self.first_byte_delay = first_byte_delay
        self.health_status = 200
        self.usage_lies: dict[str, Any] = {}
        self.ignore_limits = False
        self.endless_line: int | None = None
        self.hang_after: int | None = None
        self._gate = _Gate(max_concurrent)
        self._fail: deque[int] = deque()
        self._drops: deque[int] = deque()
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._stopping = False
        self.reset_counters()

    # ---- lifecycle ----

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def max_concurrent(self) -> int | None:
        return self._gate.limit

    @max_concurrent.setter
    def max_concurrent(self, value: int | None) -> None:
        self._gate.limit = value

    async def start(self) -> None:
        app = web.Application()
        self.add_routes(app.router)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            self._stopping = True
            try:
                await runner.cleanup()
            finally:
                self._stopping = False

    async def go_down(self) -> None:
        """Stop listening and cut open connections: new connections are refused."""
        await self.stop()

    async def come_up(self) -> None:
        """Listen again, on the same port."""
        if self._runner is None:
            await self.start()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- faults and counters ----

    def open_gate(self) -> None:
        """Lift ``max_concurrent`` and let every request waiting for it through."""
        self._gate.limit = None
        while self._gate.queue:
            self._gate.release()
            self._gate.active += 1  # release() handed a slot over; with no limit each waiter gets its own

    def fail_next(self, n: int = 1, status: int = 500) -> None:
        self._fail.extend([status] * n)

    def drop_next(self, after_chunks: int = 0, times: int = 1) -> None:
        self._drops.extend([after_chunks] * times)

    def reset_counters(self) -> None:
        self.requests = self.in_flight = self.max_seen_in_flight = 0
        self.completed = self.cancelled = self.dropped = self.failed = 0
        self.prompt_tokens_total = self.completion_tokens_total = 0
        self.received: list[Received] = []

    @property
    def running(self) -> int:
        return self._gate.active

    @property
    def waiting(self) -> int:
        return len(self._gate.queue)

    # ---- serving ----

    def add_routes(self, router: web.UrlDispatcher) -> None:
        raise NotImplementedError

    def route(
        self, router: web.UrlDispatcher, method: str, path: str, handler: Any, *, inference: bool = False
    ) -> None:
        """Register ``handler``; an inference handler runs inside :meth:`inference`, with counters and faults."""
        if not inference:
            router.add_route(method, path, handler)
            return

        async def serve(request: web.Request) -> web.StreamResponse:
            return await self.inference(request, handler)

        router.add_route(method, path, serve)

    def error(self, status: int, message: str) -> web.Response:
        raise NotImplementedError

    def known(self, model: str) -> str | None:
        return model if model in self.models else None

    def generation(self, prompt_tokens: int, limit: Any) -> _Generation:
        n = self.completion_tokens
        if not self.ignore_limits and isinstance(limit, int) and not isinstance(limit, bool) and 0 <= limit < n:
            return _Generation(prompt_tokens, limit, "length")
        return _Generation(prompt_tokens, n, "stop")

    async def pace(self, started: float, tokens: int) -> None:
        """Sleep until ``tokens`` tokens would be done at ``tokens_per_second``."""
        if self.tokens_per_second:
            delay = started + tokens / self.tokens_per_second - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

    async def prefill(self, gen: _Generation) -> int:
        """Process ``gen``'s prompt at ``prefill_tokens_per_second``; the nanoseconds it took (0 with no rate)."""
        if not self.prefill_tokens_per_second:
            return 0
        started = time.monotonic_ns()
        await asyncio.sleep(gen.prompt_tokens / self.prefill_tokens_per_second)
        return time.monotonic_ns() - started

    def _drop(self, request: web.Request) -> None:
        self.dropped += 1
        assert request.transport is not None
        request.transport.close()
        raise _Drop

    async def write_chunks(
        self, request: web.Request, resp: web.StreamResponse, chunks: Iterable[bytes], drop_after: int | None
    ) -> None:
        """Write chunk i at i / tokens_per_second: the first token at once, the terminator after the last."""
        started = time.monotonic()
        for i, chunk in enumerate(chunks):
            while i == self.endless_line:  # one line that never ends: the client must cut it
                await resp.write(b'{"message":{"content":"' + b"x" * 65536)
                await asyncio.sleep(0.001)
            if i == self.hang_after:
                await asyncio.sleep(3600)  # the client's close cancels this handler
            await self.pace(started, i)
            if i == drop_after:
                self._drop(request)
            await resp.write(chunk)

    async def inference(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Count, apply faults and the concurrency limit, then run ``handler(request, body, drop_after)``."""
        self.requests += 1
        self.in_flight += 1
        self.max_seen_in_flight = max(self.max_seen_in_flight, self.in_flight)
        try:
            raw = await request.read()
            try:
                body = json.loads(raw)
            except ValueError:
                return self.error(400, "invalid JSON body")
            if not isinstance(body, dict):
                return self.error(400, "body must be a JSON object")
            self.received.append(Received(request.path, body, raw))
            if self._fail:
                self.failed += 1
                return self.error(self._fail.popleft(), "injected failure")
            drop_after = self._drops.popleft() if self._drops else None
            await self._gate.acquire()
            try:
                if self.first_byte_delay:
                    await asyncio.sleep(self.first_byte_delay)
                if drop_after == 0:
                    self._drop(request)
                resp = await handler(request, body, drop_after)
            finally:
                self._gate.release()
            if resp.status < 400:
                self.completed += 1
            return resp
        except _Drop:
            await asyncio.sleep(3600)  # the closed transport cancels this handler
            raise AssertionError("unreachable") from None
        except (asyncio.CancelledError, ConnectionResetError):
            if not self._stopping:  # the client went away (a drop above never gets here)
                self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1

    def count(self, gen: _Generation) -> None:
        self.prompt_tokens_total += gen.prompt_tokens
        self.completion_tokens_total += gen.n
