"""The seam between the daemon and one inference server: :class:`Adapter` and :class:`BackendError`.

A request arrives parsed as a :class:`~mindrouter.backends.call.Call` (call.py);
what polling learns is a :class:`~mindrouter.backends.probe.Probe` (probe.py).

The daemon parses what a client sent into a :class:`Call`, asks the scheduler
where to send it, then opens it on that backend's :class:`Adapter`::

    call = Call.from_request(request.path, await request.read())   # RequestError -> 400
    adapter = make_adapter("vllm", url, session, config.backends)
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
import time
from abc import ABC, abstractmethod
from typing import Any

import aiohttp

from ..config import BackendSettings
from ..errors import RequestError
from . import events as reading
from . import relay, responses_api, translate, whole
from ._shapes import PROMPT_SLACK, Family, Fault, StreamFailed, Usage, error_body, error_message, not_supported
from .budget import Budget, Holding
from .call import Call
from .probe import Probe, Reply, model_key
from .translate import Plan
from .upstream import MALFORMED, Upstream, describe, fault_of

__all__ = ["Adapter", "BackendError"]

_DEFAULTS = BackendSettings()
_PROBE_BYTES = 16 << 20
"""The largest probe answer read (/api/tags of a big library, vLLM's /metrics)."""
_ERROR_BYTES = 64 << 10
"""What is read of an error answer: enough for its message."""


class BackendError(Exception):
    """The backend could not serve the request.

    Attributes:
        before_first_byte (bool): nothing reached the client, so the daemon may
            retry on another backend.
        status (int | None): the backend's HTTP status, if it answered at all.
        fault (Fault): whose fault it was, for the circuit breaker; DOWN (no answer) unless said.
    """

    def __init__(
        self,
        message: str,
        *,
        before_first_byte: bool = True,
        status: int | None = None,
        fault: Fault = Fault.DOWN,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.before_first_byte = before_first_byte
        self.status = status
        self.fault = fault


class _TooLong(Exception):
    """An answer was longer than what is read of it."""


async def _read(
    resp: aiohttp.ClientResponse, limit: int, *, truncate: bool = False, holding: Holding | None = None
) -> bytearray:
    """The body, at most ``limit`` bytes: beyond it, the rest is dropped (``truncate``) or ``_TooLong`` raised.

    With a ``holding``, each piece is taken from the budget of whole answers as it comes (``NoRoom``
    when there is none left), and the body grows in one buffer: joining the pieces at the end would
    hold the answer twice.
    """
    body = bytearray()
    try:
        async for data in resp.content.iter_any():
            if len(body) + len(data) > limit:
                if truncate:
                    body += data[: limit - len(body)]
                    break
                raise _TooLong(f"the backend's answer was longer than {limit} bytes")
            if holding is not None:
                holding.take(len(data))
            body += data
    except BaseException:
        body.clear()  # freed now, not when the traceback that holds this frame goes
        raise
    return body


_RETRYABLE_4XX = frozenset({408, 429})
"""Busy, not wrong: another backend may serve."""
_NETWORK_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


class Adapter(ABC):
    """One backend server. Subclasses say how to probe it; requests go through :meth:`open`.

    Args:
        base_url (str): the server's root, e.g. ``http://gpu1:11434``.
        session (aiohttp.ClientSession): the daemon's one pooled session.
        settings (BackendSettings): the ``[backends]`` settings: its timeouts (``connect_timeout``,
            ``first_byte_timeout``, ``load_timeout``, ``chunk_timeout``, ``stream_timeout``,
            ``request_timeout``) and limits (``max_line_bytes``, ``max_answer_bytes``). Defaults to
            the defaults.
        api_key (str | None): sent as ``Authorization: Bearer`` when set. Defaults to None.
        budget (Budget | None): the bytes all whole answers may hold at once, shared by every adapter.
            Defaults to one of this adapter's own, of ``settings.max_held_answer_bytes``.
    """

    engine: str = ""
    family: Family = "openai"
    serves_responses = False
    """The engine has the Responses API: /v1/responses calls pass through instead of becoming chat."""

    def __init__(
        self,
        base_url: str,
        session: aiohttp.ClientSession,
        settings: BackendSettings = _DEFAULTS,
        *,
        api_key: str | None = None,
        budget: Budget | None = None,
    ) -> None:
        self.base_url = self.normalize_url(base_url)
        self.session = session
        self.settings = settings
        self.budget = budget or Budget(settings.max_held_answer_bytes)
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        connect = settings.connect_timeout
        self._probe_timeout = aiohttp.ClientTimeout(total=2 * connect, sock_connect=connect)
        self._stream_timeout = aiohttp.ClientTimeout(sock_connect=connect)
        self._body_timeout = aiohttp.ClientTimeout(total=settings.request_timeout, sock_connect=connect)
        self._spellings: dict[str, str] = {}
        """model_key -> the name this backend lists, learnt by :meth:`poll`."""
        self._resident: frozenset[str] = frozenset()
        """model_keys loaded at the last :meth:`poll`: a stream for any other may first wait for a load."""
        self._listed: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
        """The models and the loaded ones the last healthy :meth:`poll` listed, as this backend spells them."""

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
            self._listed = (probe.models, probe.loaded_models)
            self.respell()
        return probe

    def respell(self) -> None:
        """Key the models the last poll listed by ``model_key`` again (the model aliases changed)."""
        models, loaded = self._listed
        self._spellings = {model_key(m): m for m in models}
        self._resident = frozenset(map(model_key, loaded))

    async def get(self, path: str, *, method: str = "GET", json_body: Any = None) -> Reply:
        """One probe request; failures come back as a Reply, never as an exception."""
        try:
            async with self.session.request(
                method,
                self.base_url + path,
                json=json_body,
                headers=self._headers,
                timeout=self._probe_timeout,
                allow_redirects=False,
            ) as resp:
                return Reply(resp.status, bytes(await _read(resp, _PROBE_BYTES)))
        except _NETWORK_ERRORS as exc:
            return Reply(None, error=describe(exc))
        except _TooLong as exc:
            return Reply(None, error=str(exc))

    def down(self, reply: Reply, what: str) -> Probe:
        """The unhealthy Probe for a failed ``what`` request."""
        if reply.status is None:
            return Probe(healthy=False, error=f"{self.base_url}: {reply.error}.")
        detail = error_message(reply.body, reply.status)
        return Probe(healthy=False, error=f"{self.base_url}{what} answered HTTP {reply.status}: {detail}.")

    async def open(self, call: Call, model: str) -> Upstream:
        """Send ``call`` to this backend as ``model`` (in the backend's spelling) and wait for its first chunk.

        Raises:
            BackendError: connection failure, timeout (``connect_timeout``, then
                ``first_byte_timeout`` for a stream, plus ``load_timeout`` when the model was not
                loaded at the last poll, or ``request_timeout`` for a whole
                answer), 5xx, 408/429, or a stream that broke before its first chunk;
                always before the first byte. Once open, a stream silent for
                ``chunk_timeout`` ends with an error tail.
            RequestError: the call cannot be expressed for this engine (400), or a whole answer was
                cut because whole answers held at once would pass the budget, this one the largest (503).
        """
        if call.responses and self.serves_responses:
            return (await self._open(call.as_sent(), model)).rendered(responses_api.error_event)
        up = await self._open(call, model)
        return up.rendered(responses_api.renderer(up.stream)) if call.responses else up

    async def _open(self, call: Call, model: str) -> Upstream:
        """The answer in the client's chat or completion dialect."""
        plan = translate.plan(call, self._spellings.get(model_key(model), model), self.engine)
        opened_at, opened_ns = time.monotonic(), time.monotonic_ns()
        if plan.synthetic is not None:  # answered without the backend (an Ollama "load model" call)
            return Upstream(dialect=call.dialect, body=plan.synthetic, opened_at=opened_at, first_byte_at=opened_at)
        if not plan.stream:
            return await self._whole(call, plan, opened_at, opened_ns)
        resp: aiohttp.ClientResponse | None = None
        settings = self.settings
        wait = settings.first_byte_timeout + (0 if model_key(model) in self._resident else settings.load_timeout)
        try:
            async with asyncio.timeout(wait):
                resp = await self.session.post(
                    self.base_url + plan.path,
                    data=plan.data,
                    headers=self._headers,
                    timeout=self._stream_timeout,
                    allow_redirects=False,
                )
                if resp.status >= 300:
                    return await self._refused(call, resp, opened_at)
                rel = relay.make_relay(plan)
                limits = reading.Limits(
                    settings.max_line_bytes,
                    reading.answer_limit(call.max_tokens, call.n),
                    settings.stream_timeout or None,
                    settings.chunk_timeout,
                )
                events = reading.events(resp.content, rel, sse=self.family == "openai", limits=limits)
                first = await events.__anext__()
                first_at = time.monotonic()
        except StopAsyncIteration:
            _close(resp)
            raise BackendError("the backend ended the stream before any output") from None
        except TimeoutError:
            _close(resp)
            raise BackendError(f"the backend sent nothing for {wait:g} s", fault=Fault.ERROR) from None
        except BackendError:
            _close(resp)
            raise
        except (*_NETWORK_ERRORS, StreamFailed, *MALFORMED) as exc:
            _close(resp)
            raise BackendError(describe(exc), fault=fault_of(exc)) from exc
        except BaseException:
            _close(resp)
            raise
        _read_timeout(resp, settings.chunk_timeout)
        sent = len(plan.data)
        return Upstream(
            dialect=call.dialect,
            first=first,
            events=events,
            response=resp,
            usage=rel.usage,
            opened_at=opened_at,
            first_byte_at=first_at,
            counter=rel,
            vet=lambda: self._vet(rel.usage, call, sent, rel.bytes),
        )

    def _vet(self, usage: Usage, call: Call, sent: int, received: int) -> None:
        """Drop counts no request of ``sent`` bytes and answer of ``received`` bytes could hold, logging once."""
        allowed = reading.answer_limit(call.max_tokens, call.n)
        usage.vet(self.base_url, sent + PROMPT_SLACK, received if allowed is None else min(received, allowed))

    async def _whole(self, call: Call, plan: Plan, opened_at: float, opened_ns: int) -> Upstream:
        """A non-streaming answer: the whole body within ``request_timeout``, within ``max_answer_bytes``
        and what the request's ``max_tokens`` allows, its bytes held in the budget until it is written."""
        holding: Holding | None = None
        allowed = reading.answer_bytes(call.max_tokens, call.n, len(plan.data))
        limit = self.settings.max_answer_bytes if allowed is None else min(allowed, self.settings.max_answer_bytes)
        try:
            async with self.session.post(
                self.base_url + plan.path,
                data=plan.data,
                headers=self._headers,
                timeout=self._body_timeout,
                allow_redirects=False,
            ) as resp:
                first_at = time.monotonic()  # its head: the backend has begun to answer
                if resp.status >= 300:
                    return await self._refused(call, resp, opened_at)
                holding = self.budget.holding(resp.close)
                raw = await _read(resp, limit, holding=holding)
                holding.read()
                body, usage = whole.convert_body(plan, raw, time.monotonic_ns() - opened_ns)
        except BaseException as exc:
            if holding is not None:
                holding.give_back()
                if holding.cut:  # by this read or by another's: the budget's cut, whatever the read raised
                    raise _no_room(self.budget) from None
            if isinstance(exc, _TooLong):
                why = "" if limit == self.settings.max_answer_bytes else " (more than its max_tokens allows)"
                raise BackendError(f"{exc}{why}, and was cut", fault=Fault.CUT) from None
            if isinstance(exc, (*_NETWORK_ERRORS, *MALFORMED)):
                raise BackendError(describe(exc), fault=fault_of(exc)) from exc
            raise
        self._vet(usage, call, len(plan.data), len(raw))
        return Upstream(
            dialect=call.dialect, body=body, usage=usage, opened_at=opened_at, first_byte_at=first_at, holding=holding
        )

    async def _refused(self, call: Call, resp: aiohttp.ClientResponse, opened_at: float) -> Upstream:
        """A 4xx is the client's answer, in its dialect; a 5xx, 408 or 429 is the backend's failure,
        and a "not supported" (501) says what the backend lacks. A redirect is a bad answer: followed,
        it would send the client's request (and its answer back) wherever the backend points."""
        if resp.status < 400:
            resp.release()
            raise BackendError(
                f"the backend answered HTTP {resp.status}, a redirect, which the router does not follow "
                "(an admin should give the backend the URL it serves at)",
                status=resp.status,
                fault=Fault.ERROR,
            )
        raw = bytes(await _read(resp, _ERROR_BYTES, truncate=True))
        message = error_message(raw, resp.status)
        resp.release()
        if not_supported(resp.status, raw):
            raise BackendError(message, status=resp.status, fault=Fault.UNSUPPORTED)
        if resp.status >= 500 or resp.status in _RETRYABLE_4XX:
            raise BackendError(
                f"the backend answered HTTP {resp.status}: {message}", status=resp.status, fault=Fault.ERROR
            )
        body = error_body(call.dialect, resp.status, message)
        return Upstream(dialect=call.dialect, status=resp.status, body=body, error=message, opened_at=opened_at)


def _no_room(budget: Budget) -> RequestError:
    return RequestError(
        f"the answer was cut: with the other large answers the router holds now it would have passed the "
        f"{budget.limit:,} bytes they may take together; ask for a shorter one (max_tokens), stream it, or "
        "send it again shortly",
        status=503,
        type="service_unavailable",
        code="answer_too_large",
        retry_after=5,
    )


def _close(resp: aiohttp.ClientResponse | None) -> None:
    if resp is not None:
        resp.close()


def _read_timeout(resp: aiohttp.ClientResponse, seconds: float) -> None:
    """From now on, cut the stream after ``seconds`` without data (aiohttp's sock_read, set mid-response)."""
    connection = resp.connection
    protocol = connection.protocol if connection is not None else None
    if protocol is not None:
        protocol.read_timeout = seconds
        protocol.start_timeout()
