"""The engines mindrouter speaks to, by the name ``mr backend add --engine`` takes."""

from __future__ import annotations

from typing import Any

import aiohttp

from ..errors import ConfigError
from .base import Adapter
from .llamacpp import LlamaCppAdapter
from .ollama import OllamaAdapter
from .openai import OpenAIAdapter
from .vllm import VllmAdapter

__all__ = ["ENGINES", "make_adapter"]

ENGINES: dict[str, type[Adapter]] = {
    "ollama": OllamaAdapter,
    "openai": OpenAIAdapter,
    "vllm": VllmAdapter,
    "llamacpp": LlamaCppAdapter,
}


def make_adapter(
    engine: str,
    base_url: str,
    session: aiohttp.ClientSession,
    *,
    request_timeout: float,
    connect_timeout: float,
    api_key: str | None = None,
    **limits: Any,
) -> Adapter:
    """The adapter for ``engine`` at ``base_url``.

    ``limits`` are the adapter's ``first_byte_timeout``, ``load_timeout``, ``chunk_timeout``,
    ``stream_timeout``, ``max_line_bytes`` and ``max_answer_bytes``.

    Raises:
        ConfigError: ``engine`` is not one of :data:`ENGINES`.
    """
    try:
        cls = ENGINES[engine]
    except KeyError:
        raise ConfigError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}.") from None
    return cls(
        base_url,
        session,
        request_timeout=request_timeout,
        connect_timeout=connect_timeout,
        api_key=api_key,
        **limits,
    )
