"""vLLM: the OpenAI adapter, plus load from /metrics and the version from /version.

``vllm:kv_cache_usage_perc`` (a 0..1 fraction despite its name) replaced
``vllm:gpu_cache_usage_perc`` in vLLM's V1 engine; either is read.
"""

from __future__ import annotations

from dataclasses import replace

from ..reported import fraction
from ._prometheus import Samples
from .openai import OpenAIAdapter
from .probe import Probe, Reply

__all__ = ["VllmAdapter"]

_METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)


class VllmAdapter(OpenAIAdapter):
    engine = "vllm"
    extra_paths = ("/health", "/metrics", "/version")

    def telemetry(self, probe: Probe, replies: dict[str, Reply]) -> Probe:
        probe = super().telemetry(probe, replies)
        if not probe.healthy:
            return probe
        m = Samples(replies["/metrics"], _METRICS, self.base_url)
        version = replies["/version"].json() if replies["/version"].ok else None
        return replace(
            probe,
            running=m.count("vllm:num_requests_running"),
            waiting=m.count("vllm:num_requests_waiting"),
            kv_cache_usage=fraction(m.highest("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
            prompt_tokens_total=m.count("vllm:prompt_tokens_total"),
            completion_tokens_total=m.count("vllm:generation_tokens_total"),
            version=version.get("version") if isinstance(version, dict) else None,
        )
