"""Any OpenAI-compatible server: models from /v1/models, health from /health where there is one.

A server that serves a model has it ready, so every listed model counts as
loaded. The vLLM and llama.cpp adapters extend :meth:`OpenAIAdapter.telemetry`
with what their /metrics and /slots say.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from ._shapes import error_message
from .base import Adapter
from .probe import Probe, Reply

__all__ = ["OpenAIAdapter"]


class OpenAIAdapter(Adapter):
    engine = "openai"
    family = "openai"
    serves_responses = True
    extra_paths: tuple[str, ...] = ("/health",)
    """Polled alongside /v1/models; a 404 or 501 from any of them means "not offered"."""

    @staticmethod
    def normalize_url(url: str) -> str:
        return url.rstrip("/").removesuffix("/v1")

    async def probe(self) -> Probe:
        listed, *extra = await asyncio.gather(self.get("/v1/models"), *(self.get(p) for p in self.extra_paths))
        if not listed.ok:
            return self.down(listed, "/v1/models")
        data = listed.json()
        entries = data.get("data") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            return Probe(
                healthy=False,
                error=f"{self.base_url}/v1/models did not list models; is this an OpenAI-compatible server?",
            )
        details = {e["id"]: e for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)}
        ids = frozenset(details)
        return self.telemetry(
            Probe(healthy=True, models=ids, loaded_models=ids, details=details),
            dict(zip(self.extra_paths, extra, strict=True)),
        )

    def telemetry(self, probe: Probe, replies: dict[str, Reply]) -> Probe:
        """Add what the extra endpoints say to a healthy probe."""
        health = replies["/health"]
        if health.ok or health.missing:
            return probe
        if health.status is None:
            return replace(probe, healthy=False, error=f"{self.base_url}/health: {health.error}.")
        detail = error_message(health.body, health.status)
        return replace(probe, healthy=False, error=f"{self.base_url}/health answered HTTP {health.status}: {detail}.")
