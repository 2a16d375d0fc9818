"""Admission: from a request's path, headers and body to a queued job with its lease, or the refusal.

Admission runs once per request, on what aiohttp parsed: authenticate, parse
the body, name the person behind a proxy, check the quotas, and queue the job
(or refuse it at once: a full queue is a 429 with ``Retry-After``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ...backends import Call, model_key
from ...backends._shapes import Dialect
from ...errors import RequestError
from ...scheduler import Job, Modality
from ..edge.answers import new_request_id
from ..edge.errorbodies import dialect_of
from ..request.lease import Lease
from ..request.weights import apply_user
from .services import Services

__all__ = ["Admitted", "admit"]

_MODALITY = {"chat": Modality.CHAT, "completion": Modality.COMPLETION, "embeddings": Modality.EMBEDDINGS}


@dataclass(slots=True)
class Admitted:
    """One request after admission: its lease (the job is queued), or why it was refused."""

    rid: str
    dialect: Dialect
    call: Call | None = None
    lease: Lease | None = None
    quota_headers: dict[str, str] | None = None
    error: RequestError | None = None


def admit(services: Services, path: str, headers: Mapping[str, str], body: bytes) -> Admitted:
    """Admit one inference request; a ``RequestError`` is kept in the result, not raised.

    Anything else (a body nested too deeply, a lone surrogate) propagates before
    the request has changed anything, for the caller to answer.
    """
    admitted = Admitted(new_request_id(), dialect_of(path))
    try:
        caller = services.auth.caller(headers.get("Authorization"))
        call = admitted.call = Call.from_request(path, body)
        via = caller.user_id if caller.forwards_to is not None else None  # a proxy's people queue under its cap
        caller = services.auth.on_behalf(caller, headers, call.user)
        scheduler = services.scheduler
        if not scheduler.has_user(caller.user_id):
            apply_user(scheduler, caller.user_id, caller)
        dispatcher = services.dispatcher
        job = Job(
            id=admitted.rid,
            user_id=caller.user_id,
            model=model_key(call.model),
            submitted_at=dispatcher.clock(),
            modality=Modality.VISION if call.has_images else _MODALITY[call.kind],
            json_mode=call.json_mode,
            prompt_tokens=call.prompt_tokens,
            max_tokens=call.max_tokens,
            context_tokens=call.context_tokens,
            stream=call.stream,
            prefix=call.prefix,
            unload_after=call.unload_after,
            via=via,
        )
        quotas = services.quotas
        try:
            admitted.quota_headers = quotas.admit(caller, job)  # 429 before the job queues
        except RequestError as refusal:  # a decision record, as the core's refusals get one
            Lease(dispatcher, job, call, caller.name, caller.group).refuse(refusal)
            raise
        admitted.lease = Lease(dispatcher, job, call, caller.name, caller.group).enter()
    except RequestError as exc:
        admitted.error = exc
    return admitted
