"""What a prompt token costs per model, where the service unit follows the GPU (``service_unit = "gpu"``).

A request holds a slot for ``prompt / prefill + answer / decode`` seconds. An
answer token keeps its fixed weight (``completion_token_cost``), so a prompt
token of a model weighs that times ``decode / prefill``, the model's rates as
the pool measured them (the best known per model, ``routing/learning.py``):
the units a request costs then follow the slot time it holds. An embedding
model writes no answer, so its prompt tokens are priced against the pool's
decode rate (the mean of the chat models' measured ones): a second of its slot
costs what a second of writing does. Until a model's rates are measured,
its prompt token weighs ``completion_token_cost / prefill_speedup``, what the
routing estimate assumes.

With ``service_unit = "tokens"`` every prompt token weighs
``prompt_token_cost``, and nothing learned changes a price.
"""

from __future__ import annotations

from ..settings import SchedulerSettings

__all__ = ["Prices"]


class Prices:
    """Per model, the weight of a prompt token in service units. Pure: fed the rates the router learned."""

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings
        self.gpu = settings.service_unit == "gpu"
        self._decode: dict[str, float] = {}
        self._prefill: dict[str, float] = {}
        self._reference = settings.default_decode_rate
        """The decode rate an embedding's prefill is priced against: the mean of the measured ones."""

    def learned(self, model: str, decode: float | None, prefill: float | None) -> None:
        """Take ``model``'s rates as the pool now knows them (tokens per second of one stream; None unknown)."""
        if not self.gpu:
            return
        if decode is not None:
            self._decode[model] = decode
            self._reference = sum(self._decode.values()) / len(self._decode)
        if prefill is not None:
            self._prefill[model] = prefill

    def prompt_weight(self, model: str) -> float:
        settings = self.settings
        if not self.gpu:
            return settings.prompt_token_cost
        prefill = self._prefill.get(model)
        if prefill is None:
            return settings.completion_token_cost / settings.prefill_speedup
        return settings.completion_token_cost * self._decode.get(model, self._reference) / prefill

    def cost(self, model: str, prompt_tokens: float, completion_tokens: float) -> float:
        """A request's service units (``SchedulerSettings.cost`` at its model's prompt weight)."""
        return self.settings.cost(prompt_tokens, completion_tokens, self.prompt_weight(model))
