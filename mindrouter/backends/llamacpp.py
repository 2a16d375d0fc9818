"""llama.cpp's llama-server: the OpenAI adapter, plus /slots, /metrics and /props.

/slots and /metrics are off unless the server was started with them
(``--slots``, ``--metrics``): a 404 or 501 leaves those numbers unknown, it
does not make the server unhealthy. /props gives the slot count and build
when /slots is off, and whether the model sees images (``modalities.vision``,
``multimodal`` before 2025). /health answers 503 while the model loads.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..reported import counter, fraction
from ._prometheus import Samples
from .openai import OpenAIAdapter
from .probe import Probe, Reply

__all__ = ["LlamaCppAdapter"]


def _busy(slot: dict[str, Any]) -> bool:
    if "is_processing" in slot:
        return bool(slot["is_processing"])
    return slot.get("state", 0) != 0  # before is_processing: 0 idle, 1 processing


class LlamaCppAdapter(OpenAIAdapter):
    engine = "llamacpp"
    serves_responses = False
    extra_paths = ("/health", "/slots", "/metrics", "/props")

    def telemetry(self, probe: Probe, replies: dict[str, Reply]) -> Probe:
        probe = super().telemetry(probe, replies)
        if not probe.healthy:
            return probe
        slots = replies["/slots"].json() if replies["/slots"].ok else None
        slots = [s for s in slots if isinstance(s, dict)] if isinstance(slots, list) else None
        props = replies["/props"].json() if replies["/props"].ok else None
        props = props if isinstance(props, dict) else {}
        m = Samples(replies["/metrics"], ("llamacpp:",), self.base_url)
        busy = sum(map(_busy, slots)) if slots is not None else None
        modalities = props.get("modalities")
        vision = modalities.get("vision") if isinstance(modalities, dict) else props.get("multimodal")
        capabilities = (
            {m: frozenset({"completion", "vision"} if vision else {"completion"}) for m in probe.models}
            if isinstance(vision, bool)
            else {}
        )
        total = len(slots) if slots is not None else props.get("total_slots")
        running = m.count("llamacpp:requests_processing")
        return replace(
            probe,
            running=running if running is not None else busy,
            waiting=m.count("llamacpp:requests_deferred"),
            kv_cache_usage=fraction(m.highest("llamacpp:kv_cache_usage_ratio")),
            slots_total=counter(total),
            slots_busy=busy,
            prompt_tokens_total=m.count("llamacpp:prompt_tokens_total"),
            completion_tokens_total=m.count("llamacpp:tokens_predicted_total"),
            capabilities=capabilities,
            version=props.get("build_info") if isinstance(props.get("build_info"), str) else None,
        )
