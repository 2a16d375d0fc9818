"""The seam between the daemon and one inference server.

The daemon parses what a client sent into a :class:`Call`, asks the scheduler
where to send it, then opens it on that backend's :class:`Adapter`::

    call = Call.from_request(request.path, await request.read())   # RequestError -> 400
    adapter = make_adapter("vllm", url, session, request_timeout=600, connect_timeout=5)
    probe = await adapter.probe()                   # Probe: health, models, load; never raises
    up = await adapter.open(call, "llama3.2")       # Upstream, or BackendError before any byte
    try:
        if up.body is not None:                     # whole answer (non-streaming, or a 4xx)
            return web.Response(body=up.body, status=up.status, headers=up.headers)
        resp = web.StreamResponse(status=up.status, headers=up.headers)
        await resp.prepare(request)
        async for chunk in up:                      # already in the client's dialect
            await resp.write(chunk)
    finally:
        await up.close()                            # client gone: the backend stops generating
    # up.usage: the backend's own token counts; up.error: set if the stream broke

Errors, each raised at one boundary so the daemon never matches strings:

    RequestError (mindrouter.errors)  the client's request cannot be used: 400
    BackendError                      the backend failed; ``before_first_byte``
                                      says whether failing over is still safe

A 4xx from the backend is not a BackendError: it is the client's answer, and
comes back as an Upstream with that status and a body in the client's error
shape. 408 and 429 are the exception: they say "busy", so another backend may
serve. After the first byte nothing raises: a broken stream ends with an error
in the client's dialect and sets ``Upstream.error``.

``open()`` returns only once the first chunk is in hand, so every failure the
client has not yet seen, including a stream that breaks before its first
token, is a ``BackendError(before_first_byte=True)``.
"""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ..errors import RequestError
from . import relay, responses, translate
from ._calls import inspect_body
from ._shapes import dumps, error_body, error_message
from ._types import Dialect, Family, Kind, StreamFailed, Usage
from .upstream import MALFORMED, Upstream, describe

__all__ = [
    "INFERENCE_PATHS",
    "Adapter",
    "BackendError",
    "Call",
    "Dialect",
    "Family",
    "Kind",
    "Probe",
    "Upstream",
    "Usage",
    "model_key",
]

_ROUTES: dict[str, tuple[Dialect, Kind]] = {
    "/v1/chat/completions": ("openai", "chat"),
    "/v1/completions": ("openai", "completion"),
    "/v1/embeddings": ("openai", "embeddings"),
    "/v1/responses": ("openai", "chat"),
    "/api/chat": ("ollama", "chat"),
    "/api/generate": ("ollama", "completion"),
    "/api/embed": ("ollama", "embeddings"),
    "/api/embeddings": ("ollama", "embeddings"),
}
INFERENCE_PATHS = frozenset(_ROUTES)
"""The paths :meth:`Call.from_request` accepts; everything else needs no GPU."""


@dataclass(frozen=True, slots=True)
class Call:
    """One inference request as a client sent it, parsed once by the daemon.

    ``body`` is shared, not copied: treat it as read-only. The hint fields
    (``has_images`` to ``prompt_tokens``) are what the scheduler's Job needs.
    """

    dialect: Dialect
    kind: Kind
    path: str
    body: dict[str, Any]
    raw: bytes
    """The body as received, forwarded unchanged when no translation is needed."""
    stream: bool
    model: str
    wants_usage: bool = False
    """An OpenAI streaming client set ``stream_options.include_usage``."""
    has_images: bool = False
    json_mode: bool = False
    """JSON mode or a JSON schema was asked for (``response_format`` / ``format``)."""
    max_tokens: int | None = None
    context_tokens: int | None = None
    """Ollama ``options.num_ctx``, for the VRAM estimate."""
    prompt_tokens: int = 0
    """Estimate: characters of prompt text / 4."""
    responses: bool = False
    """The client called the Responses API: ``body`` is its chat completions equivalent."""

    @classmethod
    def from_request(cls, path: str, raw: bytes) -> Call:
        """Parse and check a client's body.

        Args:
            path (str): one of :data:`INFERENCE_PATHS`.
            raw (bytes): the request body.

        Raises:
            RequestError: 404 for another path; 400, with one sentence naming
                the field, for a body no backend could use.
        """
        route = _ROUTES.get(path)
        if route is None:
            raise RequestError(f"{path} is not an inference endpoint.", status=404, code="not_found")
        dialect, kind = route
        try:
            body = json.loads(raw)
        except ValueError:
            raise RequestError("The request body is not valid JSON.") from None
        if not isinstance(body, dict):
            raise RequestError("The request body must be a JSON object.")
        api = path == "/v1/responses"
        if api:  # served as chat completions, answered in the Responses API's shapes
            body = responses.to_chat(body)
            path, raw = "/v1/chat/completions", dumps(body)
        hints = inspect_body(dialect, kind, path, body)
        return cls(dialect=dialect, kind=kind, path=path, body=body, raw=raw, responses=api, **hints)


def model_key(name: str) -> str:
    """The one name a model goes by in the pool: Ollama's ``llama3.2`` and ``llama3.2:latest`` are one model."""
    return name.removesuffix(":latest")


@dataclass(frozen=True, slots=True)
class Probe:
    """What one poll of a backend found. ``None`` means the backend does not say."""

    healthy: bool
    models: frozenset[str] = frozenset()
    """As the backend spells them (Ollama: ``name:tag``)."""
    loaded_models: frozenset[str] = frozenset()
    """Resident now (Ollama /api/ps); OpenAI-family engines: all of ``models``."""
    loaded_vram: dict[str, int] = field(default_factory=dict)
    """Bytes of GPU memory per loaded model (Ollama ``size_vram``)."""
    model_sizes: dict[str, int] = field(default_factory=dict)
    """Bytes on disk per model (Ollama /api/tags), a floor for the VRAM estimate."""
    capabilities: dict[str, frozenset[str]] = field(default_factory=dict)
    """Per model, where the backend says: {"completion", "vision", "embedding", "tools"} (Ollama
    /api/show; llama-server /props: "completion", plus "vision" with a multimodal projector)."""
    details: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per model, the backend's own entry for it: Ollama's /api/tags entry merged with its /api/ps one
    (digest, size, modified_at, details, expires_at, size_vram), or the /v1/models entry."""
    running: int | None = None
    waiting: int | None = None
    """Requests queued inside the backend (vLLM num_requests_waiting, llama.cpp deferred)."""
    kv_cache_usage: float | None = None
    """0..1."""
    slots_total: int | None = None
    slots_busy: int | None = None
    prompt_tokens_total: int | None = None
    """The engine's own counters since it started, for throughput from deltas."""
    completion_tokens_total: int | None = None
    error: str | None = None
    """One sentence when unhealthy."""
    version: str | None = None


class BackendError(Exception):
    """The backend could not serve the request.

    Attributes:
        before_first_byte (bool): nothing reached the client, so the daemon may
            retry on another backend.
        status (int | None): the backend's HTTP status, if it answered at all.
    """

    def __init__(self, message: str, *, before_first_byte: bool = True, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.before_first_byte = before_first_byte
        self.status = status


_RETRYABLE_4XX = frozenset({408, 429})
"""Busy, not wrong: another backend may serve."""
_NETWORK_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


@dataclass(frozen=True, slots=True)
class Reply:
    """A probe's GET: the status and body, or why there was none (``status`` None)."""

    status: int | None
    body: bytes = b""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def missing(self) -> bool:
        """The server has no such endpoint, or it is switched off (404, 405, 501)."""
        return self.status in (404, 405, 501)

    def json(self) -> Any:
        """The body as JSON, or None if it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None


class Adapter(ABC):
    """One backend server. Subclasses say how to probe it; requests go through :meth:`open`.

    Args:
        base_url (str): the server's root, e.g. ``http://gpu1:11434``.
        session (aiohttp.ClientSession): the daemon's one pooled session.
        request_timeout (float): seconds for a whole non-streaming answer, or
            the longest silence within a stream.
        connect_timeout (float): seconds to open a connection; probes get twice this.
        api_key (str | None): sent as ``Authorization: Bearer`` when set. Defaults to None.
    """

    engine: str = ""
    family: Family = "openai"

    def __init__(
        self,
        base_url: str,
        session: aiohttp.ClientSession,
        *,
        request_timeout: float,
        connect_timeout: float,
        api_key: str | None = None,
    ) -> None:
        self.base_url = self.normalize_url(base_url)
        self.session = session
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._probe_timeout = aiohttp.ClientTimeout(total=2 * connect_timeout, sock_connect=connect_timeout)
        self._stream_timeout = aiohttp.ClientTimeout(sock_connect=connect_timeout, sock_read=request_timeout)
        self._body_timeout = aiohttp.ClientTimeout(total=request_timeout, sock_connect=connect_timeout)
        self._spellings: dict[str, str] = {}
        """model_key -> the name this backend lists, learnt by :meth:`poll`."""

    @staticmethod
    def normalize_url(url: str) -> str:
        return url.rstrip("/")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"

    @abstractmethod
    async def probe(self) -> Probe:
        """Poll health, models and load. Never raises: an unreachable server is an unhealthy Probe."""

    async def poll(self) -> Probe:
        """:meth:`probe`, remembering how this backend spells its models for :meth:`open`."""
        probe = await self.probe()
        if probe.healthy:
            self._spellings = {model_key(m): m for m in probe.models}
        return probe

    async def get(self, path: str, *, method: str = "GET", json_body: Any = None) -> Reply:
        """One probe request; failures come back as a Reply, never as an exception."""
        try:
            async with self.session.request(
                method, self.base_url + path, json=json_body, headers=self._headers, timeout=self._probe_timeout
            ) as resp:
                return Reply(resp.status, await resp.read())
        except _NETWORK_ERRORS as exc:
            return Reply(None, error=describe(exc))

    def down(self, reply: Reply, what: str) -> Probe:
        """The unhealthy Probe for a failed ``what`` request."""
        if reply.status is None:
            return Probe(healthy=False, error=f"{self.base_url}: {reply.error}.")
        detail = error_message(reply.body, reply.status)
        return Probe(healthy=False, error=f"{self.base_url}{what} answered HTTP {reply.status}: {detail}.")

    async def open(self, call: Call, model: str) -> Upstream:
        """Send ``call`` to this backend as ``model`` (in the backend's spelling) and wait for its first chunk.

        Raises:
            BackendError: connection failure, timeout, 5xx, 408/429, or a stream
                that broke before its first chunk; always before the first byte.
            RequestError: the call cannot be expressed for this engine (400).
        """
        up = await self._open(call, model)
        return up.rendered(responses.renderer(up.stream)) if call.responses else up

    async def _open(self, call: Call, model: str) -> Upstream:
        """The answer in the client's chat or completion dialect."""
        plan = translate.plan(call, self._spellings.get(model_key(model), model), self.engine)
        opened_at, opened_ns = time.monotonic(), time.monotonic_ns()
        if plan.synthetic is not None:  # answered without the backend (an Ollama "load model" call)
            return Upstream(dialect=call.dialect, body=plan.synthetic, opened_at=opened_at)
        timeout = self._stream_timeout if plan.stream else self._body_timeout
        try:
            resp = await self.session.post(
                self.base_url + plan.path, data=plan.data, headers=self._headers, timeout=timeout
            )
        except _NETWORK_ERRORS as exc:
            raise BackendError(describe(exc)) from exc
        try:
            if resp.status >= 500 or resp.status in _RETRYABLE_4XX:
                detail = error_message(await resp.read(), resp.status)
                raise BackendError(f"the backend answered HTTP {resp.status}: {detail}", status=resp.status)
            if resp.status >= 400:
                message = error_message(await resp.read(), resp.status)
                body = error_body(call.dialect, resp.status, message)
                resp.release()
                return Upstream(dialect=call.dialect, status=resp.status, body=body, error=message, opened_at=opened_at)
            if not plan.stream:
                body, usage = relay.convert_body(plan, await resp.read(), time.monotonic_ns() - opened_ns)
                resp.release()
                return Upstream(dialect=call.dialect, body=body, usage=usage, opened_at=opened_at)
            rel = relay.make_relay(plan)
            events = relay.events(resp.content, rel, sse=self.family == "openai")
            first = await events.__anext__()
        except StopAsyncIteration:
            resp.close()
            raise BackendError("the backend ended the stream before any output") from None
        except BackendError:
            resp.close()
            raise
        except (*_NETWORK_ERRORS, StreamFailed, *MALFORMED) as exc:
            resp.close()
            raise BackendError(describe(exc)) from exc
        except BaseException:
            resp.close()
            raise
        return Upstream(
            dialect=call.dialect, first=first, events=events, response=resp, usage=rel.usage, opened_at=opened_at
        )
