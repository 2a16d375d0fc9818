"""Value types shared by the request and response halves of the backends package.

They live apart from base.py so that translate.py and relay.py, which base.py
uses, need not import it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Dialect", "Family", "Kind", "Plan", "StreamFailed", "Usage"]

Dialect = Literal["openai", "ollama"]
"""What a client speaks: OpenAI's /v1 API or Ollama's /api."""
Family = Dialect
"""What an engine speaks: Ollama, or OpenAI for the openai, vllm and llamacpp engines."""
Kind = Literal["chat", "completion", "embeddings"]


@dataclass(slots=True)
class Usage:
    """Token counts as the backend reported them; ``None`` where it reported none."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    @property
    def total_tokens(self) -> int | None:
        if self.prompt_tokens is None and self.completion_tokens is None:
            return None
        return (self.prompt_tokens or 0) + (self.completion_tokens or 0)


class StreamFailed(Exception):
    """A stream broke, or carried an error event, after the backend said 200."""


@dataclass(frozen=True, slots=True)
class Plan:
    """How one call goes upstream, and how its answer comes back (see translate.plan)."""

    path: str
    """Backend path to POST to."""
    data: bytes
    stream: bool
    client: Dialect
    client_kind: Kind
    upstream: Family
    upstream_kind: Kind
    model: str
    """The name the client used, echoed in translated answers."""
    wants_usage: bool = False
    legacy_embeddings: bool = False
    """The client used Ollama's old /api/embeddings (one ``embedding``)."""
    base64_embeddings: bool = False
    """The OpenAI client asked for ``encoding_format: base64``."""
    synthetic: bytes | None = None
    """A complete answer made without the backend (an Ollama "load model" call)."""

    @property
    def passthrough(self) -> bool:
        return self.client == self.upstream
