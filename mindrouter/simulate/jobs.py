"""The core's ``Job`` for a simulated request, as the daemon would build it from the request it received."""

from __future__ import annotations

from ..scheduler import Job, Modality, chain
from .conversations import Conversation, single
from .scenario import UserSpec

__all__ = ["job_for"]


def job_for(
    job_id: str,
    user: int,
    spec: UserSpec,
    kind: str,
    now: float,
    prompt: int,
    conv: Conversation | None,
    turn: int,
) -> Job:
    """The job phase ``spec`` of ``user`` sends at ``now`` to a model of ``kind`` (turn ``turn`` of ``conv``
    where it is one)."""
    modality = Modality.EMBEDDINGS if kind == "embedding" else Modality.CHAT
    # The prompt as the daemon hashes a chat's messages: one block per segment (embeddings are not cached).
    segments = () if kind == "embedding" else (conv.prompt(turn) if conv else single(job_id, prompt)[0]).segments
    return Job(
        job_id,
        user,
        spec.model,
        now,
        modality=modality,
        prompt_tokens=prompt,
        max_tokens=spec.max_tokens,
        stream=spec.stream,
        json_mode=spec.json_mode,
        context_tokens=spec.num_ctx,
        unload_after=spec.keep_alive == 0,
        prefix=chain((s.key, s.tokens) for s in segments),
    )
