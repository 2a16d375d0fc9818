"""Fake inference servers for tests: real aiohttp servers on 127.0.0.1 that speak the real wire formats.

    async with FakeOllama(models=["llama3.2:latest"], loaded=["llama3.2:latest"]) as ollama:
        ...  # point a backend at ollama.url
        assert ollama.requests == 1 and ollama.cancelled == 0

    async with FakeOpenAI(flavor="vllm", models=["qwen"], max_concurrent=2) as vllm: ...

Every number is deterministic, so tests can assert exact values:

- A completion is the words ``tok0 tok1 ... tok{n-1}``, one token per word and
  one stream chunk per token. ``n`` is ``completion_tokens`` (default 8), or
  the client's ``max_tokens`` / ``max_completion_tokens`` / ``num_predict``
  when that is smaller, and then the finish reason is "length", else "stop".
- Prompt tokens are the whitespace-separated words of all the prompt text:
  every message's text, the prompt and system, or the embedding inputs.
- Usage is reported in the engine's real fields: OpenAI ``usage`` (for
  streams only with ``stream_options.include_usage``), Ollama
  ``prompt_eval_count`` / ``eval_count`` on the final line.

Load and faults, all settable while the server runs:

- ``tokens_per_second``: pace of generation (None: as fast as possible).
- ``prefill_tokens_per_second``: pace of prompt processing: a request spends prompt tokens / this
  before its first token, holding its ``max_concurrent`` slot, as vLLM and Ollama do (Ollama's
  ``prompt_eval_duration`` reports it). None (the default): prompts take no time.
- ``max_concurrent``: requests beyond it wait in the fake's own FIFO and count
  as ``waiting`` (vLLM ``num_requests_waiting``, llama.cpp ``requests_deferred``).
- ``fail_next(n, status)``: the next n inference requests get that status.
- ``drop_next(after_chunks, times)``: cut the connection after K chunks (0:
  before any response).
- ``first_byte_delay``: seconds before the answer starts.
- ``hang_after``: after that many chunks a stream falls silent, its connection open (a hung GPU).
- ``load_seconds`` (Ollama): a request for a model that is not loaded waits this long first, sending
  nothing, as Ollama does while it loads one.
- ``await go_down()`` / ``await come_up()``: stop listening (connections are
  refused) and listen again on the same port.

Lies, as a backend on someone's workstation may tell them:

- ``usage_lies``: fields merged into the usage the fake reports (Ollama's final
  line, OpenAI's ``usage``), e.g. ``{"eval_count": -1000000}``; a :class:`Raw`
  value is written as it is, so ``Raw("1e400")`` or ``Raw("NaN")`` reach the wire.
- ``ignore_limits``: generate ``completion_tokens`` whatever ``max_tokens`` says.
- ``endless_line``: after that many chunks, a stream sends one line that never
  ends (bytes, no newline); None (the default) for none.
- ``embeddings_supported`` (llamacpp): False answers embeddings 501, as
  llama-server started without ``--embeddings`` does.

Counters: ``requests`` (inference requests received), ``in_flight`` (open now,
waiting ones included), ``max_seen_in_flight``, ``running``, ``waiting``,
``completed``, ``cancelled`` (the client went away before the end: proof that
the upstream connection was closed), ``dropped``, ``failed``; ``received``
holds (path, parsed body) of every inference request.

Fixtures ``fake_ollama``, ``fake_openai``, ``fake_vllm`` and ``fake_llamacpp``
are defined here; import them into a test module, or list this module in
``pytest_plugins``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import socket
import struct
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self

import pytest
from aiohttp import web

__all__ = [
    "FakeOllama",
    "FakeOpenAI",
    "Raw",
    "Received",
    "fake_llamacpp",
    "fake_ollama",
    "fake_openai",
    "fake_vllm",
]

DEFAULT_SIZE = 2_000_000_000


def _words(text: Any) -> int:
    return len(text.split()) if isinstance(text, str) else 0


def content_words(content: Any) -> int:
    """The prompt tokens a fake counts in one message's content: its whitespace-separated words."""
    if isinstance(content, list):
        kinds = ("text", "input_text", "output_text")
        return sum(_words(p.get("text")) for p in content if isinstance(p, dict) and p.get("type") in kinds)
    return _words(content)


def token(i: int) -> str:
    """Piece ``i`` of every fake's answer: ``tok0``, then `` tok1``, `` tok2``..."""
    return f"tok{i}" if i == 0 else f" tok{i}"


TOOL_ARGUMENTS = {"city": "Paris"}
"""What every fake passes when it calls a tool: the first tool the request offers."""


def tool_to_call(body: dict[str, Any]) -> str | None:
    """The tool a fake model calls: the first one offered, unless it just got a tool's answer or may not.

    Chat nests a tool's name in ``function``; the Responses API does not, and answers a call with a
    ``function_call_output`` input item instead of a ``tool`` message.
    """
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools or body.get("tool_choice") == "none":
        return None
    turns = body.get("messages", body.get("input"))
    last = turns[-1] if isinstance(turns, list) and turns else None
    if isinstance(last, dict) and (last.get("role") == "tool" or last.get("type") == "function_call_output"):
        return None
    first = tools[0] if isinstance(tools[0], dict) else {}
    fn = first.get("function", first)
    name = fn.get("name") if isinstance(fn, dict) else None
    return name if isinstance(name, str) else None


def argument_pieces() -> list[str]:
    """TOOL_ARGUMENTS as a fake streams them: in two fragments, one token each."""
    text = json.dumps(TOOL_ARGUMENTS)
    return [text[: len(text) // 2], text[len(text) // 2 :]]


def _pieces(gen: _Generation, json_wanted: bool) -> list[str]:
    """The completion, one piece per token; in JSON mode one JSON object holding it, ending "stop"."""
    if json_wanted:
        return [json.dumps({"answer": gen.text})]
    return [token(i) for i in range(gen.n)]


def logprobs_of(body: dict[str, Any], pieces: list[str], start: int = 0) -> list[dict[str, Any]] | None:
    """What a fake reports when asked for ``logprobs``: piece i has logprob -(i+1)/10, alternatives below it."""
    if not body.get("logprobs"):
        return None
    top = body.get("top_logprobs") or 0
    out = []
    for i, piece in enumerate(pieces, start):
        entry = {"token": piece, "logprob": -(i + 1) / 10, "bytes": list(piece.encode())}
        alternatives = [{"token": f"alt{j}", "logprob": -(i + 2 + j) / 10, "bytes": []} for j in range(top - 1)]
        entry["top_logprobs"] = [dict(entry), *alternatives][:top]
        out.append(entry)
    return out


def _message(item_id: str, status: str, content: list[Any]) -> dict[str, Any]:
    """A Responses API output message item."""
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def _is_base64(value: Any) -> bool:
    try:
        base64.b64decode(value, validate=True)
    except (ValueError, TypeError):
        return False
    return isinstance(value, str)


class Raw(str):
    """A value written into the fake's JSON as it is (``1e400``, ``NaN``): what json.dumps would not write."""


def _compact(obj: Any) -> bytes:
    raws: list[Raw] = []

    def mark(value: Any) -> Any:
        if isinstance(value, Raw):
            raws.append(value)
            return f"__raw{len(raws) - 1}__"
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        return value

    out = _plain(mark(obj))
    for i, raw in enumerate(raws):
        out = out.replace(f'"__raw{i}__"'.encode(), raw.encode())
    return out


def _plain(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def embedding(text: str, dim: int) -> list[float]:
    """The fake's embedding of ``text``: deterministic, so tests can compare vectors."""
    return [((len(text) * (j + 1)) % 97) / 97 for j in range(dim)]


@dataclass(frozen=True)
class Received:
    path: str
    body: dict[str, Any]
    raw: bytes


@dataclass(frozen=True)
class _Generation:
    prompt_tokens: int
    n: int
    finish: str

    @property
    def text(self) -> str:
        return "".join(token(i) for i in range(self.n))


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


class FakeOllama(_FakeServer):
    """Ollama's /api: tags, ps, version, show, chat, generate, embed and the older embeddings.

    Args:
        autoload: a request for a model that is not loaded loads it, as Ollama does. Defaults to True.
        load_seconds: how long that load takes, sending nothing. Defaults to 0.
        capabilities: /api/show ``capabilities`` per model. Defaults to ["completion", "tools"]. As
            real Ollama: chat to a model without "completion" and tools to one without "tools" are 400,
            images to one without "vision" a 500.
        version: what /api/version says.
    """

    def __init__(
        self,
        *,
        autoload: bool = True,
        capabilities: Mapping[str, list[str]] | None = None,
        version: str = "0.6.5",
        load_seconds: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.autoload = autoload
        self.load_seconds = load_seconds
        self.capabilities = dict(capabilities or {})
        self.version = version
        self.show_requests = 0

    def add_routes(self, router: web.UrlDispatcher) -> None:
        self.route(router, "GET", "/", self._root)
        self.route(router, "GET", "/api/tags", self._tags)
        self.route(router, "GET", "/api/ps", self._ps)
        self.route(router, "GET", "/api/version", self._version)
        self.route(router, "POST", "/api/show", self._show)
        self.route(router, "POST", "/api/chat", self._chat, inference=True)
        self.route(router, "POST", "/api/generate", self._generate, inference=True)
        self.route(router, "POST", "/api/embed", self._embed, inference=True)
        self.route(router, "POST", "/api/embeddings", self._embed, inference=True)

    async def _root(self, request: web.Request) -> web.Response:
        return web.Response(text="Ollama is running")

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.version})

    def error(self, status: int, message: str) -> web.Response:
        return web.Response(status=status, body=_compact({"error": message}), content_type="application/json")

    def known(self, model: str) -> str | None:
        for name in (model, model + ":latest"):
            if name in self.models:
                return name
        return None

    def _entry(self, name: str) -> dict[str, Any]:
        return {
            "name": name,
            "model": name,
            "modified_at": "2025-01-01T00:00:00.000000000Z",
            "size": self.models[name],
            "digest": hashlib.sha256(name.encode()).hexdigest(),
            "details": {
                "parent_model": "",
                "format": "gguf",
                "family": "llama",
                "families": ["llama"],
                "parameter_size": "3.2B",
                "quantization_level": "Q4_K_M",
            },
        }

    async def _tags(self, request: web.Request) -> web.Response:
        return web.json_response({"models": [self._entry(m) for m in self.models]})

    async def _ps(self, request: web.Request) -> web.Response:
        running = [
            dict(self._entry(m), expires_at="2030-01-01T00:00:00Z", size_vram=self.models[m])
            for m in self.models
            if m in self.loaded
        ]
        return web.json_response({"models": running})

    async def _show(self, request: web.Request) -> web.Response:
        self.show_requests += 1
        body = await request.json()
        name = self.known(body.get("model") or body.get("name") or "")
        if name is None:
            return self.error(404, f"model '{body.get('model')}' not found")
        entry = self._entry(name)
        return web.json_response(
            {
                "modelfile": f"FROM {name}",
                "parameters": "",
                "template": "{{ .Prompt }}",
                "details": entry["details"],
                "model_info": {"general.architecture": "llama"},
                "capabilities": self.caps(name),
            }
        )

    def caps(self, name: str) -> list[str]:
        return self.capabilities.get(name, ["completion", "tools"])

    def _refuse(self, name: str, body: dict[str, Any], images: list[Any]) -> web.Response | None:
        """What real Ollama answers to a request the model cannot take, or None."""
        caps = self.caps(name)
        if "completion" not in caps:
            return self.error(400, f'"{name}" does not support generate')
        if body.get("tools") and "tools" not in caps:
            return self.error(400, f"registry.ollama.ai/library/{name} does not support tools")
        if not all(_is_base64(i) for i in images):
            return self.error(400, "illegal base64 data at input byte 4")
        if images and "vision" not in caps:
            return self.error(500, "this model is missing data required for image input")
        return None

    def _now(self) -> str:
        return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def _resolve(self, body: dict[str, Any]) -> str | web.Response:
        name = self.known(str(body.get("model", "")))
        if name is None:
            return self.error(404, f'model "{body.get("model")}" not found, try pulling it first')
        if name not in self.loaded:
            if not self.autoload:
                return self.error(500, f'model "{name}" is not loaded')
            self.loaded.add(name)
        return name

    async def _chat(self, request: web.Request, body: dict[str, Any], drop_after: int | None) -> web.StreamResponse:
        messages = body.get("messages")
        if messages is not None and not isinstance(messages, list):
            return self.error(400, "messages must be a list")
        prompt = sum(content_words(m.get("content")) for m in messages or ())
        images = [i for m in messages or () if isinstance(m, dict) for i in m.get("images") or ()]
        return await self._answer(request, body, prompt, "message", drop_after, empty=not messages, images=images)

    async def _generate(self, request: web.Request, body: dict[str, Any], drop_after: int | None) -> web.StreamResponse:
        prompt = body.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            return self.error(400, "prompt must be a string")
        words = _words(prompt) + _words(body.get("system"))
        images = body.get("images") or []
        return await self._answer(
            request, body, words, "response", drop_after, empty=not prompt and not images, images=images
        )

    async def _answer(
        self,
        request: web.Request,
        body: dict[str, Any],
        prompt: int,
        key: str,
        drop_after: int | None,
        empty: bool,
        images: list[Any],
    ) -> web.StreamResponse:
        cold = self.known(str(body.get("model", ""))) not in self.loaded
        name = self._resolve(body)
        if isinstance(name, web.Response):
            return name
        if cold and self.load_seconds:
            await asyncio.sleep(self.load_seconds)
        if (refused := self._refuse(name, body, images)) is not None:
            return refused
        model = body["model"]
        stream = body.get("stream", True) is not False
        tool = tool_to_call(body) if key == "message" else None

        def part(text: str, call: bool = False) -> dict[str, Any]:
            if key == "response":
                return {"response": text}
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if call:
                message["tool_calls"] = [{"function": {"name": tool, "arguments": TOOL_ARGUMENTS}}]
            return {"message": message}

        if empty:  # Ollama's "load the model" call
            return web.Response(
                body=_compact(
                    {"model": model, "created_at": self._now(), **part(""), "done_reason": "load", "done": True}
                ),
                content_type="application/json",
            )
        gen = self.generation(prompt, (body.get("options") or {}).get("num_predict"))
        begun = time.monotonic_ns()
        prefill_ns = await self.prefill(gen)
        started = time.monotonic_ns()
        final = {
            "model": model, "created_at": "", **part(""), "done_reason": gen.finish, "done": True,
            "total_duration": 0, "load_duration": 1000, "prompt_eval_count": gen.prompt_tokens,
            "prompt_eval_duration": prefill_ns or 1000, "eval_count": gen.n, "eval_duration": 0,
        }  # fmt: skip
        if key == "response":
            final["context"] = [1, 2, 3]
        final.update(self.usage_lies)
        pieces = [] if tool else _pieces(gen, bool(body.get("format")))
        if body.get("format"):
            final["done_reason"] = "stop"  # a JSON answer is always a whole object
        if not stream:
            await self.pace(time.monotonic(), gen.n)
            if (logprobs := logprobs_of(body, pieces)) is not None:
                final["logprobs"] = logprobs
            final.update(
                part("".join(pieces), call=tool is not None),
                created_at=self._now(),
                total_duration=time.monotonic_ns() - begun,
                eval_duration=max(1, time.monotonic_ns() - started),
            )
            self.count(gen)
            return web.Response(body=_compact(final), content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)

        def lines() -> Iterable[bytes]:
            if tool:
                yield _compact({"model": model, "created_at": self._now(), **part("", True), "done": False}) + b"\n"
            for i, piece in enumerate(pieces):
                line = {"model": model, "created_at": self._now(), **part(piece), "done": False}
                if (logprobs := logprobs_of(body, [piece], i)) is not None:
                    line["logprobs"] = logprobs
                yield _compact(line) + b"\n"
            final.update(
                created_at=self._now(),
                total_duration=time.monotonic_ns() - begun,
                eval_duration=max(1, time.monotonic_ns() - started),
            )
            yield _compact(final) + b"\n"

        await self.write_chunks(request, resp, lines(), drop_after)
        self.count(gen)
        await resp.write_eof()
        return resp

    async def _embed(self, request: web.Request, body: dict[str, Any], drop_after: int | None) -> web.StreamResponse:
        name = self._resolve(body)
        if isinstance(name, web.Response):
            return name
        if request.path == "/api/embeddings":
            prompt = body.get("prompt", "")
            self.prompt_tokens_total += _words(prompt)
            return web.json_response({"embedding": embedding(prompt, self.embedding_dim)})
        inputs = body.get("input")
        inputs = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(inputs, list) or not all(isinstance(x, str) for x in inputs):
            return self.error(400, "input must be a string or a list of strings")
        if any(0xD800 <= ord(c) <= 0xDFFF for x in inputs for c in x):  # a lone UTF-16 surrogate, as Ollama fails it
            return self.error(500, "failed to encode response: json: invalid UTF-8 in string")
        words = sum(map(_words, inputs))
        self.prompt_tokens_total += words
        vectors = [embedding(x, self.embedding_dim) for x in inputs]
        answer = {
            "model": body["model"],
            "embeddings": vectors,
            "total_duration": 1000,
            "load_duration": 10,
            "prompt_eval_count": words,
            **self.usage_lies,
        }
        return web.Response(body=_compact(answer), content_type="application/json")


class FakeOpenAI(_FakeServer):
    """An OpenAI-compatible server: /v1/models, chat, completions, embeddings and (not llamacpp) responses.

    Args:
        flavor: "openai" (no /health, no /metrics; ``"usage": null`` on every
            chunk of a usage stream, as OpenAI does), "vllm" (/health,
            /metrics, /version) or "llamacpp" (/health, /slots, /metrics, /props).
        slots: llama.cpp's slot count. Defaults to ``max_concurrent`` or 4.
        vision: the model takes images (llama.cpp: /props ``modalities.vision``, a multimodal projector is
            loaded). Without it, vLLM and llama-server refuse image parts (400 and 500). Defaults to False.

    As vLLM does, an assistant tool call without ``id``/``type``/``function.name`` and a tool message
    without ``tool_call_id`` are 400. Embeddings take token arrays as well as text. /v1/responses calls
    the first function tool offered (a ``function_call`` item, or vLLM's events for it) unless the input
    ends with its ``function_call_output``, and refuses a tool without a top-level ``name`` or a call or
    output without ``call_id`` (400), as vLLM does.
    """

    def __init__(
        self, *, flavor: str = "openai", slots: int | None = None, vision: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if flavor not in ("openai", "vllm", "llamacpp"):
            raise ValueError(f"unknown flavor {flavor!r}")
        self.flavor = flavor
        self.slots = slots or self.max_concurrent or 4
        self.vision = vision
        self.metrics_enabled = True
        self.slots_enabled = True
        self.legacy_metrics = False
        """vLLM: export vllm:gpu_cache_usage_perc instead of vllm:kv_cache_usage_perc."""
        self.usage_in_final_chunk = False
        """Put stream usage on the finish_reason chunk instead of a separate chunk (older servers)."""
        self.kv_cache_usage: float | None = None
        """Override the exported KV-cache usage (default: running / slots)."""
        self.embeddings_supported = True
        """llamacpp: False answers /v1/embeddings 501, as llama-server without --embeddings does."""
        self._ids = 0

    def add_routes(self, router: web.UrlDispatcher) -> None:
        self.route(router, "GET", "/v1/models", self._models)
        self.route(router, "POST", "/v1/chat/completions", self._chat, inference=True)
        self.route(router, "POST", "/v1/completions", self._completion, inference=True)
        self.route(router, "POST", "/v1/embeddings", self._embeddings, inference=True)
        if self.flavor != "llamacpp":
            self.route(router, "POST", "/v1/responses", self._responses, inference=True)
        if self.flavor != "openai":
            self.route(router, "GET", "/health", self._health)
            self.route(router, "GET", "/metrics", self._metrics)
        if self.flavor == "vllm":
            self.route(router, "GET", "/version", self._version)
        if self.flavor == "llamacpp":
            self.route(router, "GET", "/slots", self._slots)
            self.route(router, "GET", "/props", self._props)

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.9.1"})

    async def _props(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "total_slots": self.slots,
                "build_info": "b5000-fake",
                "model_path": "/models/fake.gguf",
                "modalities": {"vision": self.vision, "audio": False},
            }
        )

    def error(self, status: int, message: str) -> web.Response:
        kind = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "server_error")
        if self.flavor == "vllm":
            err: dict[str, Any] = {
                "message": message,
                "type": "BadRequestError" if status < 500 else "InternalServerError",
                "param": None,
                "code": status,
            }
        elif self.flavor == "llamacpp":
            err = {"code": status, "message": message, "type": kind}
        else:
            err = {"message": message, "type": kind, "param": None, "code": None}
        return web.Response(status=status, body=_compact({"error": err}), content_type="application/json")

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "created": 1700000000, "owned_by": self.flavor} for m in self.models]
        if self.flavor == "vllm":
            data = [dict(d, root=d["id"], parent=None, max_model_len=4096) for d in data]
        return web.json_response({"object": "list", "data": data})

    async def _health(self, request: web.Request) -> web.Response:
        if self.health_status != 200:
            if self.flavor == "llamacpp":
                return self.error(self.health_status, "Loading model")
            return web.Response(status=self.health_status)
        return web.json_response({"status": "ok"}) if self.flavor == "llamacpp" else web.Response()

    def _not_enabled(self, what: str) -> web.Response:
        err = {
            "code": 501,
            "message": f"This server does not support {what} endpoint. Start it with `--{what}`",
            "type": "not_supported_error",
        }
        return web.Response(status=501, body=_compact({"error": err}), content_type="application/json")

    async def _slots(self, request: web.Request) -> web.Response:
        if not self.slots_enabled:
            return self._not_enabled("slots")
        busy = min(self.running, self.slots)
        return web.json_response(
            [
                {
                    "id": i,
                    "id_task": i if i < busy else -1,
                    "n_ctx": 2048,
                    "speculative": False,
                    "is_processing": i < busy,
                    "params": {"n_predict": -1},
                }
                for i in range(self.slots)
            ]
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        if not self.metrics_enabled:
            return self._not_enabled("metrics") if self.flavor == "llamacpp" else web.Response(status=404)
        kv = self.kv_cache_usage if self.kv_cache_usage is not None else min(1.0, self.running / self.slots)
        if self.flavor == "llamacpp":
            rows = [
                ("prompt_tokens_total", "counter", self.prompt_tokens_total),
                ("tokens_predicted_total", "counter", self.completion_tokens_total),
                ("n_decode_total", "counter", self.completed),
                ("predicted_tokens_seconds", "gauge", self.tokens_per_second or 0),
                ("requests_processing", "gauge", self.running), ("requests_deferred", "gauge", self.waiting),
                ("n_busy_slots_per_decode", "gauge", float(self.running)),
            ]  # fmt: skip
            text = "".join(f"# HELP llamacpp:{n} {n}\n# TYPE llamacpp:{n} {t}\nllamacpp:{n} {v}\n" for n, t, v in rows)
        else:
            label = f'{{engine="0",model_name="{next(iter(self.models))}"}}'
            rows = [
                ("num_requests_running", "gauge", self.running), ("num_requests_waiting", "gauge", self.waiting),
                ("gpu_cache_usage_perc" if self.legacy_metrics else "kv_cache_usage_perc", "gauge", kv),
                ("prompt_tokens_total", "counter", self.prompt_tokens_total),
                ("generation_tokens_total", "counter", self.completion_tokens_total),
            ]  # fmt: skip
            text = "".join(
                f"# HELP vllm:{n} {n}\n# TYPE vllm:{n} {t}\nvllm:{n}{label} {float(v)}\n" for n, t, v in rows
            )
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    def _check(self, body: dict[str, Any]) -> web.Response | None:
        if not isinstance(body.get("model"), str) or body["model"] not in self.models:
            return self.error(404, f"The model `{body.get('model')}` does not exist.")
        if body.get("stream_options") is not None and not body.get("stream"):
            return self.error(400, "The 'stream_options' parameter is only allowed when 'stream' is enabled.")
        return None

    def _check_messages(self, messages: list[Any]) -> web.Response | None:
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                return self.error(400, "each message needs a role")
            for c in m.get("tool_calls") or ():
                fn = c.get("function") if isinstance(c, dict) else None
                if not (isinstance(fn, dict) and isinstance(fn.get("name"), str) and c.get("id") and c.get("type")):
                    return self.error(400, "1 validation error: tool_calls.0.id Field required")
            if m["role"] == "tool" and not m.get("tool_call_id"):
                return self.error(400, "1 validation error: tool_call_id Field required")
            content = m.get("content")
            parts = content if isinstance(content, list) else ()
            if any(isinstance(p, dict) and p.get("type") == "image_url" for p in parts) and not self.vision:
                if self.flavor == "llamacpp":
                    return self.error(500, "image input is not supported - hint: you may need to provide the mmproj")
                return self.error(400, "this model does not support image input")
        return None

    async def _chat(self, request: web.Request, body: dict[str, Any], drop_after: int | None) -> web.StreamResponse:
        if (bad := self._check(body)) is not None:
            return bad
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return self.error(400, "messages must be a non-empty list")
        if (bad := self._check_messages(messages)) is not None:
            return bad
        prompt = sum(content_words(m.get("content")) for m in messages if isinstance(m, dict))
        return await self._answer(request, body, prompt, True, drop_after)

    def _check_responses(self, body: dict[str, Any]) -> web.Response | None:
        """As vLLM validates a Responses body: a function tool names itself, a call and its output name the call."""
        tools = body.get("tools")
        for i, tool in enumerate(tools if isinstance(tools, list) else ()):
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                return self.error(400, f"1 validation error: tools.{i}.name Field required")
        given = body.get("input")
        for i, item in enumerate(given if isinstance(given, list) else ()):
            kind = item.get("type") if isinstance(item, dict) else None
            if kind in ("function_call", "function_call_output") and not isinstance(item.get("call_id"), str):
                return self.error(400, f"1 validation error: input.{i}.call_id Field required")
        return None

    async def _responses(
        self, request: web.Request, body: dict[str, Any], drop_after: int | None
    ) -> web.StreamResponse:
        """The Responses API: text, or a call of the first function tool offered, as OpenAI and vLLM answer.

        A tool's answer (``function_call_output``) counts as prompt words; a call is TOOL_ARGUMENTS, one
        token per fragment of :func:`argument_pieces`.
        """
        if (bad := self._check(body) or self._check_responses(body)) is not None:
            return bad
        given = body.get("input")
        if isinstance(given, str):
            prompt = _words(given)
        elif isinstance(given, list):
            items = [i for i in given if isinstance(i, dict)]
            prompt = sum(content_words(i.get("content")) + _words(i.get("output")) for i in items)
        else:
            return self.error(400, "input must be a string or a list of items")
        prompt += _words(body.get("instructions"))
        tool = tool_to_call(body)
        pieces = argument_pieces() if tool else []
        gen = (
            _Generation(prompt, len(pieces), "stop") if tool else self.generation(prompt, body.get("max_output_tokens"))
        )
        await self.prefill(gen)
        self._ids += 1
        rid, mid, created = f"resp_fake{self._ids}", f"msg_fake{self._ids}", int(time.time())
        status = "incomplete" if gen.finish == "length" else "completed"
        usage = {
            "input_tokens": gen.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": gen.n,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": gen.prompt_tokens + gen.n,
        }
        done = {"type": "output_text", "text": gen.text, "annotations": []}
        call = {
            "id": f"fc_fake{self._ids}",
            "type": "function_call",
            "status": "completed",
            "call_id": f"call_fake{self._ids}",
            "name": tool,
            "arguments": "".join(pieces),
        }
        item = call if tool else _message(mid, "completed", [done])

        def response(state: str, output: list[Any], used: dict[str, Any] | None) -> dict[str, Any]:
            return {
                "id": rid,
                "object": "response",
                "created_at": created,
                "status": state,
                "incomplete_details": {"reason": "max_output_tokens"} if state == "incomplete" else None,
                "model": body["model"],
                "output": output,
                "parallel_tool_calls": True,
                "tool_choice": body.get("tool_choice", "auto"),
                "tools": body.get("tools") or [],
                "usage": used,
            }

        if not body.get("stream"):
            await self.pace(time.monotonic(), gen.n)
            self.count(gen)
            return web.Response(body=_compact(response(status, [item], usage)), content_type="application/json")
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        seq = iter(range(10_000))

        def event(kind: str, **data: Any) -> bytes:
            payload = _compact({"type": kind, "sequence_number": next(seq), **data})
            return f"event: {kind}\ndata: ".encode() + payload + b"\n\n"

        chunks = [
            event("response.created", response=response("in_progress", [], None)),
            event("response.in_progress", response=response("in_progress", [], None)),
        ]
        if tool:  # as vLLM streams a call: its item with empty arguments, the fragments, then the whole
            at: dict[str, Any] = {"item_id": call["id"], "output_index": 0}
            added = dict(call, status="in_progress", arguments="")
            chunks.append(event("response.output_item.added", output_index=0, item=added))
            chunks += [event("response.function_call_arguments.delta", delta=piece, **at) for piece in pieces]
            chunks.append(event("response.function_call_arguments.done", arguments=call["arguments"], name=tool, **at))
        else:
            at = {"item_id": mid, "output_index": 0, "content_index": 0}
            chunks.append(event("response.output_item.added", output_index=0, item=_message(mid, "in_progress", [])))
            chunks.append(event("response.content_part.added", part=dict(done, text=""), **at))
            chunks += [event("response.output_text.delta", delta=token(i), logprobs=[], **at) for i in range(gen.n)]
            chunks.append(event("response.output_text.done", text=gen.text, logprobs=[], **at))
            chunks.append(event("response.content_part.done", part=done, **at))
        chunks.append(event("response.output_item.done", output_index=0, item=item))
        chunks.append(event(f"response.{status}", response=response(status, [item], usage)))
        await self.write_chunks(request, resp, chunks, drop_after)
        self.count(gen)
        await resp.write_eof()
        return resp

    async def _completion(
        self, request: web.Request, body: dict[str, Any], drop_after: int | None
    ) -> web.StreamResponse:
        if (bad := self._check(body)) is not None:
            return bad
        prompt = body.get("prompt")
        words = sum(map(_words, prompt)) if isinstance(prompt, list) else _words(prompt)
        return await self._answer(request, body, words, False, drop_after)

    async def _answer(
        self, request: web.Request, body: dict[str, Any], prompt: int, chat: bool, drop_after: int | None
    ) -> web.StreamResponse:
        gen = self.generation(prompt, body.get("max_completion_tokens", body.get("max_tokens")))
        await self.prefill(gen)
        self._ids += 1
        head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-fake{self._ids}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": body["model"],
        }
        usage = {
            "prompt_tokens": gen.prompt_tokens,
            "completion_tokens": gen.n,
            "total_tokens": gen.prompt_tokens + gen.n,
            **self.usage_lies,
        }
        tool = tool_to_call(body) if chat else None
        call_id = f"chatcmpl-tool-{self._ids}"
        fmt = body.get("response_format")
        json_wanted = isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")
        pieces = [] if tool else _pieces(gen, json_wanted)
        finish = "tool_calls" if tool else "stop" if json_wanted else gen.finish  # JSON is always a whole object
        if not body.get("stream"):
            await self.pace(time.monotonic(), gen.n)
            if chat:
                message: dict[str, Any] = {"role": "assistant", "content": "".join(pieces) if not tool else None}
                if tool:
                    arguments = json.dumps(TOOL_ARGUMENTS)
                    message["tool_calls"] = [
                        {"id": call_id, "type": "function", "function": {"name": tool, "arguments": arguments}}
                    ]
                logprobs = logprobs_of(body, pieces)
                choice = {
                    "index": 0,
                    "message": message,
                    "logprobs": None if logprobs is None else {"content": logprobs},
                    "finish_reason": finish,
                }
            else:
                choice = {"text": "".join(pieces), "index": 0, "logprobs": None, "finish_reason": finish}
            self.count(gen)
            return web.Response(
                body=_compact(dict(head, choices=[choice], usage=usage)), content_type="application/json"
            )
        include = bool((body.get("stream_options") or {}).get("include_usage"))
        if chat:
            head["object"] = "chat.completion.chunk"
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)

        def event(choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> bytes:
            obj = dict(head, choices=choices)
            if include and self.flavor == "openai":
                obj["usage"] = None
            obj.update(extra or {})
            return b"data: " + _compact(obj) + b"\n\n"

        def make_choice(
            text: str | None, finish: str | None, first: bool = False, calls: list[Any] | None = None, i: int = 0
        ) -> dict[str, Any]:
            if not chat:
                return {"text": text or "", "index": 0, "logprobs": None, "finish_reason": finish}
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            if calls:
                delta["tool_calls"] = calls
            logprobs = logprobs_of(body, [text], i) if text else None
            return {
                "index": 0,
                "delta": delta,
                "logprobs": None if logprobs is None else {"content": logprobs},
                "finish_reason": finish,
            }

        def chunks() -> Iterable[bytes]:
            if tool:  # as vLLM streams a call: id and name first, then the arguments in fragments
                head_call = {"index": 0, "id": call_id, "type": "function", "function": {"name": tool, "arguments": ""}}
                yield event([make_choice(None, None, first=True, calls=[head_call])])
                for fragment in argument_pieces():
                    yield event([make_choice(None, None, calls=[{"index": 0, "function": {"arguments": fragment}}])])
            for i, piece in enumerate(pieces):
                yield event([make_choice(piece, None, first=i == 0, i=i)])
            last = {"usage": usage} if include and self.usage_in_final_chunk else None
            tail = event([make_choice(None, finish)], last)
            if include and not self.usage_in_final_chunk:
                tail += event([], {"usage": usage})
            yield tail + b"data: [DONE]\n\n"

        await self.write_chunks(request, resp, chunks(), drop_after)
        self.count(gen)
        await resp.write_eof()
        return resp

    async def _embeddings(
        self, request: web.Request, body: dict[str, Any], drop_after: int | None
    ) -> web.StreamResponse:
        if not self.embeddings_supported:  # llama-server's own words and shape
            err = {
                "code": 501,
                "message": "This server does not support embeddings. Start it with `--embeddings`",
                "type": "not_supported_error",
            }
            return web.Response(status=501, body=_compact({"error": err}), content_type="application/json")
        if (bad := self._check(body)) is not None:
            return bad
        inputs = body.get("input")
        if isinstance(inputs, str) or (isinstance(inputs, list) and inputs and all(isinstance(x, int) for x in inputs)):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs or not all(isinstance(x, (str, list)) for x in inputs):
            return self.error(400, "input must be a string, a list of strings or token arrays")
        inputs = [x if isinstance(x, str) else " ".join(f"t{t}" for t in x) for x in inputs]  # a token is a word
        words = sum(map(_words, inputs))
        self.prompt_tokens_total += words
        data = []
        for i, text in enumerate(inputs):
            vec: Any = embedding(text, self.embedding_dim)
            if body.get("encoding_format") == "base64":
                vec = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
            data.append({"object": "embedding", "index": i, "embedding": vec})
        answer = {
            "object": "list",
            "data": data,
            "model": body["model"],
            "usage": {"prompt_tokens": words, "total_tokens": words, **self.usage_lies},
        }
        return web.Response(body=_compact(answer), content_type="application/json")


@pytest.fixture
async def fake_ollama() -> AsyncIterator[FakeOllama]:
    async with FakeOllama(models=["llama3.2:latest", "nomic-embed-text:latest"], loaded=["llama3.2:latest"]) as fake:
        yield fake


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(flavor="openai", models=["gpt-test", "embed-test"]) as fake:
        yield fake


@pytest.fixture
async def fake_vllm() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(flavor="vllm", models=["qwen"], max_concurrent=4) as fake:
        yield fake


@pytest.fixture
async def fake_llamacpp() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(flavor="llamacpp", models=["tiny"], max_concurrent=2) as fake:
        yield fake
