"""The engines mindrouter speaks to, by the name ``mr backend add --engine`` takes."""

from __future__ import annotations

import aiohttp

from ..config import BackendSettings
from ..errors import ConfigError
from .base import Adapter
from .budget import Budget
from .llamacpp import LlamaCppAdapter
from .ollama import OllamaAdapter
from .openai import OpenAIAdapter
from .vllm import VllmAdapter

__all__ = ["ENGINES", "make_adapter"]

_DEFAULTS = BackendSettings()

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
    settings: BackendSettings = _DEFAULTS,
    *,
    api_key: str | None = None,
    budget: Budget | None = None,
) -> Adapter:
    """The adapter for ``engine`` at ``base_url``, with the ``[backends]`` timeouts and limits of ``settings``
    and the ``budget`` of whole answers every adapter shares.

    Raises:
        ConfigError: ``engine`` is not one of :data:`ENGINES`.
    """
    try:
        cls = ENGINES[engine]
    except KeyError:
        raise ConfigError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}.") from None
    return cls(base_url, session, settings, api_key=api_key, budget=budget)
