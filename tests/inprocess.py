"""An in-process backend: the daemon's adapter answers without a socket (as httpx's MockTransport does).

``create_app(config, adapters=InProcess(...))`` gives every backend row this
adapter. It answers OpenAI chat completions as a whole body, in the shape vLLM
sends; ``held=True`` holds every answer until ``open_gate``, or one at a time
with ``let_one``. Tests that are
about the daemon's queue, fairness or weights, not the wire, use it instead of
a fake server on a port.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any, cast

from mindrouter.backends import Call, Probe, Upstream
from mindrouter.backends._shapes import Usage
from mindrouter.backends.base import Adapter


class InProcess:
    """The adapter factory and the backends' shared state (what the tests read)."""

    def __init__(self, models: tuple[str, ...] = ("m",), completion_tokens: int = 3, held: bool = False) -> None:
        self.models = frozenset(models)
        self.completion_tokens = completion_tokens
        self.requests = 0
        self.in_flight = 0
        self._open = not held
        self._held: list[asyncio.Future[None]] = []
        self._ids = itertools.count(1)

    def __call__(self, row: Any) -> Adapter:
        return _Adapter(self, row.url)

    def open_gate(self) -> None:
        self._open = True
        while self._held:
            self.let_one()

    def let_one(self) -> None:
        """Let the longest-held answer go (a backend that finishes one request)."""
        while self._held:
            held = self._held.pop(0)
            if not held.done():
                held.set_result(None)
                return

    async def answer(self, call: Call, model: str) -> Upstream:
        self.requests += 1
        self.in_flight += 1
        opened_at = time.monotonic()  # as a real adapter, from the request's start: a held answer took that long
        try:
            if not self._open:
                held = asyncio.get_running_loop().create_future()
                self._held.append(held)
                await held
            prompt, completion = call.prompt_tokens, self.completion_tokens
            message = {"role": "assistant", "content": " ".join(["word"] * completion)}
            body = {
                "id": f"chatcmpl-{next(self._ids)}",
                "object": "chat.completion",
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            }
            usage = Usage(prompt_tokens=prompt, completion_tokens=completion)
            return Upstream(dialect="openai", body=json.dumps(body).encode(), usage=usage, opened_at=opened_at)
        finally:
            self.in_flight -= 1


class _Adapter(Adapter):
    engine = "vllm"

    def __init__(self, backends: InProcess, url: str) -> None:
        super().__init__(url, cast(Any, None))  # no session: no sockets
        self.backends = backends

    async def probe(self) -> Probe:
        return Probe(healthy=True, models=self.backends.models, loaded_models=self.backends.models)

    async def open(self, call: Call, model: str) -> Upstream:
        return await self.backends.answer(call, model)
