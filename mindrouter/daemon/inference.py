"""The inference API: OpenAI and Ollama routes, translated into jobs for the core.

A request's path through here: authenticate, parse into a ``Call``, submit a
``Job``, wait for its dispatch (a streaming client that has to wait is told its
queue position), open the upstream response, stream it to the client, and tell
the core how it ended. The ``finally`` in ``_serve`` guarantees the job's slot
is released however the handler ends, client disconnects included.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from typing import Any

from aiohttp import web

from ..backends import INFERENCE_PATHS, BackendError, Call, model_key
from ..errors import RequestError
from ..scheduler import Job, Modality
from .keys import AUTH, CONFIG, DISPATCHER, QUOTAS, REGISTRY, SCHEDULER, STATS
from .responses import dialect_of, error_response
from .weights import apply_user

__all__ = ["setup_inference_routes"]

log = logging.getLogger(__name__)

_MODALITY = {"chat": Modality.CHAT, "completion": Modality.COMPLETION, "embeddings": Modality.EMBEDDINGS}
_counter = itertools.count(1)
_prefix = os.urandom(3).hex()


def _request_id() -> str:
    return f"mr-{_prefix}{next(_counter):x}"


async def handle_inference(request: web.Request) -> web.StreamResponse:
    dialect = dialect_of(request.path)
    rid = _request_id()
    app = request.app
    try:
        caller = app[AUTH].caller(request.headers.get("Authorization"))
        raw = await request.read()
        call = Call.from_request(request.path, raw)
        caller = app[AUTH].on_behalf(caller, request.headers, call.body.get("user"))
    except RequestError as exc:
        app[STATS].count_error(exc.status)
        return error_response(exc, dialect)
    scheduler = app[SCHEDULER]
    if not scheduler.has_user(caller.user_id):
        apply_user(scheduler, caller.user_id, caller)
    job = Job(
        id=rid,
        user_id=caller.user_id,
        model=model_key(call.model),
        submitted_at=app[DISPATCHER].clock(),
        modality=Modality.VISION if call.has_images else _MODALITY[call.kind],
        json_mode=call.json_mode,
        prompt_tokens=call.prompt_tokens,
        max_tokens=call.max_tokens,
        context_tokens=call.context_tokens,
        stream=call.stream,
    )
    try:
        app[QUOTAS].admit(request, caller, job)
        return await _serve(request, call, job, caller, dialect)
    except RequestError as exc:
        app[STATS].count_error(exc.status)
        log.info("request=%s user=%s model=%s status=%d %s", rid, caller.name, call.model, exc.status, exc.message)
        return error_response(exc, dialect)


async def _serve(request: web.Request, call: Call, job: Job, caller: Any, dialect: str) -> web.StreamResponse:
    app = request.app
    dispatcher = app[DISPATCHER]
    registry = app[REGISTRY]
    stats = app[STATS]
    max_retries = app[CONFIG].backends.max_retries
    future = dispatcher.submit(job)
    response: web.StreamResponse | None = None
    upstream = None
    started = 0.0
    try:
        if not future.done() and call.stream:
            response = await _prepare_waiting_stream(request, job, dialect)
            dispatch = await _wait_telling_position(request, response, job, future, dialect)
        else:
            dispatch = await dispatcher.wait(job, future)
        attempt = 0
        while True:
            started = time.monotonic()
            try:
                upstream = await registry.entries[dispatch.backend_id].adapter.open(call, call.model)
                break
            except (BackendError, KeyError) as exc:
                error = str(exc) if isinstance(exc, BackendError) else "backend was removed"
                log.warning(
                    "request=%s user=%s backend=%s failed before the first byte: %s",
                    job.id,
                    caller.name,
                    dispatch.backend_id,
                    error,
                )
                registry.request_failed(dispatch.backend_id, error)
                attempt += 1
                if not dispatcher.fail(job.id, retry=attempt <= max_retries):
                    raise RequestError(
                        f"the backend failed ({error}) and no other backend could take the request; try again shortly",
                        status=503,
                        type="service_unavailable",
                        code="backend_failed",
                        retry_after=5,
                    ) from None
                registry.released(dispatch.backend_id)
                dispatch = await dispatcher.wait(job, dispatcher.requeued(job))
        registry.request_succeeded(dispatch.backend_id)
        first_byte = time.monotonic() - started
        headers = {**upstream.headers, "X-Request-Id": job.id}
        if upstream.body is not None:
            if response is None:
                response = web.Response(body=upstream.body, status=upstream.status, headers=headers)
            else:  # prepared while queued: the answer goes into the open stream
                await response.write(upstream.body)
                await response.write_eof()
        else:
            if response is None:
                response = web.StreamResponse(status=upstream.status, headers=headers)
                await response.prepare(request)
            charge = StreamCharge(dispatcher, job.id)
            async for chunk in upstream:
                await response.write(chunk)
                charge.chunk()
            await response.write_eof()
        usage = upstream.usage
        duration = time.monotonic() - started
        if upstream.error is not None:
            log.warning(
                "request=%s user=%s backend=%s stream ended with an error: %s",
                job.id,
                caller.name,
                dispatch.backend_id,
                upstream.error,
            )
            dispatcher.fail(
                job.id,
                retry=False,
                prompt_tokens=usage.prompt_tokens or 0,
                completion_tokens=usage.completion_tokens or 0,
            )
        else:
            dispatcher.finish(
                job.id,
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                latency=first_byte,
                duration=duration,
            )
        stats.completed(caller, job, dispatch.backend_id, usage, upstream.status, held=duration)
        return response
    finally:
        if upstream is not None:
            with contextlib.suppress(Exception):
                await upstream.close()
        if dispatcher.scheduler.is_running(job.id) or dispatcher.scheduler.is_queued(job.id):
            usage = upstream.usage if upstream is not None else None
            dispatcher.abandon(
                job.id,
                prompt_tokens=(usage.prompt_tokens if usage else None),
                completion_tokens=(usage.completion_tokens or 0) if usage else 0,
            )
            stats.cancelled += 1
        if upstream is not None:
            registry.released(dispatch.backend_id)


class StreamCharge:
    """Charges a streaming job's answer as it is produced: every 32 chunks or 100 ms, whichever comes first.

    One upstream event carries about one token, so chunks stand in for tokens
    until the backend's own counts settle the charge at the end.
    """

    __slots__ = ("_chunks", "_dispatcher", "_due", "_job_id", "_next")

    def __init__(self, dispatcher: Any, job_id: str) -> None:
        self._dispatcher = dispatcher
        self._job_id = job_id
        self._chunks = 0
        self._next = 32
        self._due = time.monotonic() + 0.1

    def chunk(self) -> None:
        self._chunks += 1
        if self._chunks >= self._next or time.monotonic() >= self._due:
            self._dispatcher.progress(self._job_id, self._chunks)
            self._next = self._chunks + 32
            self._due = time.monotonic() + 0.1


async def _prepare_waiting_stream(request: web.Request, job: Job, dialect: str) -> web.StreamResponse:
    position = request.app[SCHEDULER].queue_position(job.id)
    content_type = "application/x-ndjson" if dialect == "ollama" else "text/event-stream"
    headers = {"Content-Type": content_type, "X-Request-Id": job.id, "Cache-Control": "no-cache"}
    if position is not None:
        headers["X-Queue-Position"] = str(position[0])
        headers["X-Queue-Length"] = str(position[1])
    response = web.StreamResponse(status=200, headers=headers)
    await response.prepare(request)
    return response


async def _wait_telling_position(
    request: web.Request, response: web.StreamResponse, job: Job, future: asyncio.Future, dialect: str
) -> Any:
    """Wait for dispatch; OpenAI streams get an SSE comment with the position every 2 s."""
    dispatcher = request.app[DISPATCHER]
    scheduler = request.app[SCHEDULER]
    while True:
        if dialect == "openai":
            position = scheduler.queue_position(job.id)
            if position is not None:
                await response.write(f": queued position={position[0]} queue_length={position[1]}\n\n".encode())
        done, _ = await asyncio.wait({future}, timeout=2.0)
        if done:
            return await dispatcher.wait(job, future)


def setup_inference_routes(app: web.Application) -> None:
    for path in sorted(INFERENCE_PATHS):
        app.router.add_post(path, handle_inference)
