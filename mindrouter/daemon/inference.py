"""The inference API: OpenAI and Ollama routes, translated into jobs for the core.

This module only translates HTTP: authenticate, parse the body into a
``Call``, and let the request's :class:`~.lease.Lease` (from
``dispatcher.lease``) do everything with the slot, from waiting in the queue
to failing over and settling the usage. The handler prepares the response,
writes the chunks, and ends it; a streaming client that has to wait gets its
headers at once and its queue position, and every stream whose headers went
out gets an end: the answer, or the dialect's error tail and a close.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Awaitable, Callable

from aiohttp import web

from ..backends import INFERENCE_PATHS, Call, model_key
from ..backends._shapes import error_tail
from ..errors import RequestError
from ..scheduler import Job, Modality
from .keys import AUTH, DISPATCHER, QUOTAS, SCHEDULER, STATS
from .lease import Lease
from .responses import dialect_of, error_response
from .weights import apply_user

__all__ = ["setup_inference_routes"]

log = logging.getLogger(__name__)

_MODALITY = {"chat": Modality.CHAT, "completion": Modality.COMPLETION, "embeddings": Modality.EMBEDDINGS}
_counter = itertools.count(1)
_prefix = os.urandom(3).hex()
_CONTENT_TYPES = {"ollama": "application/x-ndjson", "openai": "text/event-stream"}


def _request_id() -> str:
    return f"mr-{_prefix}{next(_counter):x}"


async def handle_inference(request: web.Request) -> web.StreamResponse:
    dialect = dialect_of(request.path)
    rid = _request_id()
    app = request.app
    response: web.StreamResponse | None = None
    try:
        caller = app[AUTH].caller(request.headers.get("Authorization"))
        call = Call.from_request(request.path, await request.read())
        caller = app[AUTH].on_behalf(caller, request.headers, call.body.get("user"))
        scheduler = app[SCHEDULER]
        if not scheduler.has_user(caller.user_id):
            apply_user(scheduler, caller.user_id, caller)
        dispatcher = app[DISPATCHER]
        job = Job(
            id=rid,
            user_id=caller.user_id,
            model=model_key(call.model),
            submitted_at=dispatcher.clock(),
            modality=Modality.VISION if call.has_images else _MODALITY[call.kind],
            json_mode=call.json_mode,
            prompt_tokens=call.prompt_tokens,
            max_tokens=call.max_tokens,
            context_tokens=call.context_tokens,
            stream=call.stream,
        )
        app[QUOTAS].admit(request, caller, job)  # 429 before the job queues; leaves the quota headers
        async with dispatcher.lease(job, call, user=caller.name, group=caller.group) as lease:
            if call.stream and lease.queued:
                response = await _prepare_waiting_stream(request, lease, dialect)
                upstream = await lease.open(heartbeat=_position_teller(response, lease, dialect))
            else:
                upstream = await lease.open()
            if response is None and upstream.body is not None:
                headers = {**upstream.headers, "X-Request-Id": rid}
                response = web.Response(body=upstream.body, status=upstream.status, headers=headers)
            else:
                if response is None:
                    headers = {**upstream.headers, "X-Request-Id": rid}
                    response = web.StreamResponse(status=upstream.status, headers=headers)
                    await response.prepare(request)
                if upstream.body is None:
                    async for chunk in lease.chunks():
                        await response.write(chunk)
                elif upstream.error is None:  # headers went out while queued: the answer goes into the stream
                    await response.write(upstream.body)
                else:
                    await response.write(error_tail(dialect, upstream.error))
                await response.write_eof()
            lease.finish()
        return response
    except ConnectionError:  # the client hung up mid-write; its lease has settled, and no one is listening
        return response if response is not None else web.Response(status=499)
    except RequestError as exc:
        app[STATS].count_error(exc.status)
        log.info("request=%s status=%d %s", rid, exc.status, exc.message)
        if response is not None and response.prepared:  # a stream whose headers went out ends in its dialect
            await response.write(error_tail(dialect, exc.message))
            await response.write_eof()
            return response
        answer = error_response(exc, dialect)
        answer.headers["X-Request-Id"] = rid
        return answer


async def _prepare_waiting_stream(request: web.Request, lease: Lease, dialect: str) -> web.StreamResponse:
    headers = {"Content-Type": _CONTENT_TYPES[dialect], "X-Request-Id": lease.job.id, "Cache-Control": "no-cache"}
    position = request.app[SCHEDULER].queue_position(lease.job.id)
    if position is not None:
        headers["X-Queue-Position"] = str(position[0])
        headers["X-Queue-Length"] = str(position[1])
    response = web.StreamResponse(status=200, headers=headers)
    await response.prepare(request)
    return response


def _position_teller(response: web.StreamResponse, lease: Lease, dialect: str) -> Callable[[], Awaitable[None]] | None:
    """OpenAI streams get an SSE comment with their queue position every 2 s; NDJSON has no comments."""
    if dialect != "openai":
        return None
    scheduler = lease.dispatcher.scheduler

    async def tell() -> None:
        position = scheduler.queue_position(lease.job.id)
        if position is not None:
            await response.write(f": queued position={position[0]} queue_length={position[1]}\n\n".encode())

    return tell


def setup_inference_routes(app: web.Application) -> None:
    for path in sorted(INFERENCE_PATHS):
        app.router.add_post(path, handle_inference)
