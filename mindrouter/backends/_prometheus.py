"""Reading an engine's Prometheus /metrics, tolerant of servers that switch it off.

prometheus_client's parser does the text format (escaping, labels, TYPE
lines); this keeps only sample values by name, every label set kept. Lines
for other metrics are dropped before parsing: vLLM's /metrics is mostly
histograms nobody here reads, and a poll should cost little CPU.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from ..reported import COUNTER_LIMIT, counter, distrust, number
from .probe import Reply

__all__ = ["Samples"]


class Samples:
    """Sample values by sample name (``vllm:prompt_tokens_total``, not the family name)."""

    def __init__(self, reply: Reply, names: tuple[str, ...], source: str = "") -> None:
        """A sample that is NaN, infinite, negative or past ``COUNTER_LIMIT`` is dropped (logged once)."""
        self.values: dict[str, list[float]] = {}
        if not reply.ok:
            return
        text = reply.body.decode(errors="replace")
        keep = [
            line
            for line in text.splitlines()
            if line.startswith(names) or (line.startswith("#") and any(n in line for n in names))
        ]
        try:
            for family in text_string_to_metric_families("\n".join(keep) + "\n"):
                for sample in family.samples:
                    value = number(float(sample.value), COUNTER_LIMIT)
                    if value is None:
                        distrust(source, sample.name, sample.value)
                        continue
                    self.values.setdefault(sample.name, []).append(float(value))
        except ValueError:  # not Prometheus text: treat as no metrics, as for a 404
            self.values.clear()

    def __bool__(self) -> bool:
        return bool(self.values)

    def total(self, *names: str) -> float | None:
        """The sum over label sets of the first of ``names`` present."""
        for name in names:
            if name in self.values:
                return sum(self.values[name])
        return None

    def count(self, *names: str) -> int | None:
        value = self.total(*names)
        return None if value is None else counter(round(value))

    def highest(self, *names: str) -> float | None:
        """The largest value over label sets of the first of ``names`` present."""
        for name in names:
            if name in self.values:
                return max(self.values[name])
        return None
