"""An in-process backend: the daemon's adapter answers without a socket (as httpx's MockTransport does).

``await d.backend("b1", InProcess(models=("llama3",)))`` on a daemon from the test
harness (tests/harness.py) serves that backend row from this object. It is a vLLM
that lives in the test: it answers chat and completion calls, whole or streamed, and
the daemon's own translation, relay and whole-answer code turn its answers into the
client's dialect, as they do for a real vLLM's bytes. Everything is in the test's
hands instead of a clock's:

- ``held=True`` (or ``hold()``) holds every answer before its first byte until ``open_gate()``,
  or one at a time with ``let_one()``;
- a completion is the fakes' ``tok0 tok1 ...`` (tests/fakes/), ``completion_tokens``
  long or the call's ``max_tokens`` when that is smaller; prompt tokens are the
  prompt's words, as the fakes count them;
- ``tokens_per_second`` paces generation (None: at once); ``first_byte_delay``: seconds before it starts;
- ``tokens_allowed``: streams stop before that token until ``allow_tokens`` raises it (None: no stop);
- ``fail_next(n)``: the next n calls fail as a 500 would, before any byte;
- ``healthy = False``: probes report the backend down.

Counters: ``requests``, ``in_flight`` (held, generating, or streaming), ``max_seen_in_flight``,
``completed``, ``cancelled`` (the daemon let go before the end), ``failed``; ``received`` holds
the body of every call as the backend got it.

Tests about the daemon's queue, fairness, weights, quotas or accounting use it; tests
about the wire (framing, dialects byte by byte, connections that fail) use the fake
servers on 127.0.0.1 (tests/fakes/).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, cast

from mindrouter.backends import BackendError, Call, Probe, Upstream
from mindrouter.backends import relay as relays
from mindrouter.backends._shapes import Fault
from mindrouter.backends.base import Adapter
from mindrouter.backends.probe import model_key
from mindrouter.backends.translate import Plan, plan
from mindrouter.backends.whole import convert_body

from .fakes import content_words, token

_URLS = itertools.count(1)


class InProcess:
    """One backend's state and behaviour (what the tests set and read), and its adapter factory."""

    def __init__(
        self,
        models: tuple[str, ...] = ("m",),
        completion_tokens: int = 3,
        held: bool = False,
        tokens_per_second: float | None = None,
        tokens_allowed: int | None = None,
        first_byte_delay: float = 0.0,
    ) -> None:
        self.url = f"http://in-process-{next(_URLS)}:8000"
        """The row URL the harness routes to this object (no socket listens there)."""
        self.models = frozenset(models)
        self.completion_tokens = completion_tokens
        self.tokens_per_second = tokens_per_second
        self.tokens_allowed = tokens_allowed
        self.first_byte_delay = first_byte_delay
        self._allowance: asyncio.Future[None] | None = None
        self.healthy = True
        self.requests = self.in_flight = self.max_seen_in_flight = 0
        self.completed = self.cancelled = self.failed = 0
        self.received: list[dict[str, Any]] = []
        self._open = not held
        self._held: deque[asyncio.Future[None]] = deque()
        self._fail = 0
        self._ids = itertools.count(1)

    def __call__(self, row: Any) -> Adapter:
        """The adapter for ``row`` (``create_app(adapters=...)`` takes this object as the factory)."""
        return _Adapter(self, row.url)

    # ---- what a test controls ----

    def hold(self) -> None:
        """Hold every answer from now on (as ``held=True`` does from the start)."""
        self._open = False

    def open_gate(self) -> None:
        """Stop holding answers, and let every held one go."""
        self._open = True
        while self._held:
            self.let_one()

    def let_one(self) -> None:
        """Let the longest-held answer go (a backend that finishes one request)."""
        while self._held:
            held = self._held.popleft()
            if not held.done():
                held.set_result(None)
                return

    def allow_tokens(self, n: int | None) -> None:
        """Let streams run to token ``n`` (None: to their end)."""
        self.tokens_allowed = n
        allowance, self._allowance = self._allowance, None
        if allowance is not None and not allowance.done():
            allowance.set_result(None)

    async def _may_send(self, i: int) -> None:
        while self.tokens_allowed is not None and i >= self.tokens_allowed:
            if self._allowance is None:
                self._allowance = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._allowance)

    def fail_next(self, n: int = 1) -> None:
        """The next ``n`` calls fail before any byte, as an HTTP 500 does."""
        self._fail += n

    # ---- answering ----

    async def answer(self, call: Call, sent: Plan) -> Upstream:
        """The answer to ``call``, sent to this backend as ``sent``, in the client's dialect."""
        opened_at = time.monotonic()  # as a real adapter: from the request's start, so a held answer took that long
        body = json.loads(sent.data)
        self.received.append(body)
        self.requests += 1
        self.in_flight += 1
        self.max_seen_in_flight = max(self.max_seen_in_flight, self.in_flight)
        streaming = False
        try:
            if self._fail:
                self._fail -= 1
                self.failed += 1
                raise BackendError("the backend answered HTTP 500: injected failure", status=500, fault=Fault.ERROR)
            if not self._open:
                held = asyncio.get_running_loop().create_future()
                self._held.append(held)
                await held
            if self.first_byte_delay:
                await asyncio.sleep(self.first_byte_delay)
            limit = body.get("max_completion_tokens", body.get("max_tokens"))
            n = min(self.completion_tokens, limit) if isinstance(limit, int) and limit >= 0 else self.completion_tokens
            finish = "length" if n < self.completion_tokens else "stop"
            chat = "messages" in body
            prompt = (
                sum(content_words(m.get("content")) for m in body["messages"] if isinstance(m, dict))
                if chat
                else content_words(body.get("prompt"))
            )
            if not sent.stream:
                await self._pace(time.monotonic(), n)
                whole, usage = convert_body(sent, self._whole(body, chat, prompt, n, finish), 0)
                self.completed += 1
                return Upstream(dialect=call.dialect, body=whole, usage=usage, opened_at=opened_at)
            relay = relays.make_relay(sent)
            streaming = True  # from here the stream's own end counts it
            events = self._stream(relay, body, chat, prompt, n, finish)
            first = await events.__anext__()
            return Upstream(
                dialect=call.dialect, first=first, events=events, usage=relay.usage, opened_at=opened_at, counter=relay
            )
        except asyncio.CancelledError:
            if not streaming:
                self.cancelled += 1
            raise
        finally:
            if not streaming:
                self.in_flight -= 1

    async def _pace(self, started: float, tokens: int) -> None:
        if self.tokens_per_second:
            delay = started + tokens / self.tokens_per_second - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

    def _head(self, body: dict[str, Any], chat: bool, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
        return {"id": f"cmpl-inprocess{next(self._ids)}", "object": kind, "created": 0, "model": body["model"]}

    @staticmethod
    def _usage(prompt: int, n: int) -> dict[str, int]:
        return {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}

    def _whole(self, body: dict[str, Any], chat: bool, prompt: int, n: int, finish: str) -> bytes:
        text = "".join(token(i) for i in range(n))
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            if chat
            else {"index": 0, "text": text, "finish_reason": finish}
        )
        answer = dict(self._head(body, chat, False), choices=[choice], usage=self._usage(prompt, n))
        return json.dumps(answer).encode()

    async def _stream(
        self, relay: relays.Relay, body: dict[str, Any], chat: bool, prompt: int, n: int, finish: str
    ) -> AsyncIterator[bytes]:
        """vLLM's SSE events, one a token, through the daemon's relay (as events.py feeds it a socket's)."""
        head = self._head(body, chat, True)

        def event(text: str | None, reason: str | None) -> bytes:
            if chat:
                delta = {} if text is None else {"content": text}
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": reason}
            return json.dumps(dict(head, choices=[choice])).encode()

        def feed(payload: bytes) -> bytes:
            relay.fed += 1
            return relay.feed(payload)

        started, ended = time.monotonic(), False
        try:
            for i in range(n):
                await self._may_send(i)
                await self._pace(started, i)
                out = feed(event(token(i), None))
                if out:
                    yield out
            tail = [event(None, finish), json.dumps(dict(head, choices=[], usage=self._usage(prompt, n))).encode()]
            out = b"".join(feed(payload) for payload in (*tail, b"[DONE]")) + relay.end()
            ended = True
            self.completed += 1
            if out:
                yield out
        finally:
            if not ended:
                self.cancelled += 1
            self.in_flight -= 1


class _Adapter(Adapter):
    engine = "vllm"

    def __init__(self, backend: InProcess, url: str) -> None:
        super().__init__(url, cast(Any, None))  # no session: no sockets
        self.backend = backend

    async def probe(self) -> Probe:
        if not self.backend.healthy:
            return Probe(healthy=False, error=f"{self.base_url}: the in-process backend is down.")
        return Probe(healthy=True, models=self.backend.models, loaded_models=self.backend.models)

    async def _open(self, call: Call, model: str) -> Upstream:
        sent = plan(call, self._spellings.get(model_key(model), model), self.engine)
        if sent.synthetic is not None:  # answered without the backend (an Ollama "load model" call)
            return Upstream(dialect=call.dialect, body=sent.synthetic)
        return await self.backend.answer(call, sent)
