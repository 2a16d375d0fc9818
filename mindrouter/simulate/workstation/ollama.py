"""Ollama's rules for a runner, read from its code (ollama/ollama fb30760): slots, context, VRAM, reloads.

- Slots (``server/sched.go`` ``load``): ``OLLAMA_NUM_PARALLEL`` (default 1),
  but an embedding model and the architectures that do not support parallel
  requests always get 1.
- Context (``server/routes.go``): a request's ``num_ctx`` if it sends one,
  else ``OLLAMA_CONTEXT_LENGTH``, else a default by the GPU's VRAM: 256k
  from 47 GiB, 32k from 23 GiB, else 4k ("slightly lower thresholds than
  48/24 GiB"); never beyond what the model was trained for
  (``effectiveContext``). llama-server is started with ``-c num_ctx x
  parallel``, and its KV cache is sized for all of it.
- VRAM (``llm.PredictServerVRAM``): the weights plus the KV cache of that
  context. Beside other runners, a load must fit in 80% of the free VRAM,
  else one is evicted first; the first load always goes ahead. An automatic
  context that does not fit at all is cut to 32k, then 4k, as Ollama retries
  after an out-of-memory load (``nextLowerAutoNumCtx``).
- Reloads (``needsReload``): a request whose load options differ from the
  runner's (here: an explicit ``num_ctx`` other than the runner's) unloads
  the runner and loads it again; two automatic contexts never differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...gpu.vram import SINGLE_SLOT_FAMILIES
from ..scenario import BackendSpec, ModelSpec

__all__ = ["HEADROOM", "SINGLE_SLOT_FAMILIES", "Context", "context", "default_context", "runner_vram", "slots"]


HEADROOM = 0.8
"""Beside other runners, a load's estimate must fit in this part of the free VRAM."""


@dataclass(frozen=True, slots=True)
class Context:
    """A runner's context per slot, and whether Ollama chose it (an automatic one never forces a reload)."""

    tokens: int
    auto: bool


def slots(spec: BackendSpec, model: ModelSpec) -> float:
    """Requests one runner of ``model`` serves at once on ``spec``."""
    if spec.engine == "ollama" and (model.kind == "embedding" or model.family in SINGLE_SLOT_FAMILIES):
        return 1
    return spec.parallel or math.inf


def default_context(vram_gb: float) -> int:
    """Ollama's automatic ``num_ctx`` for a GPU of ``vram_gb``.

    Ollama's thresholds are 47 and 23 GiB, just under 48 and 24 so that the cards sold as such pass
    (an RTX 4090 has 24 GiB); a scenario gives the size a card is sold as, so they apply to it as is.
    """
    return 262144 if vram_gb >= 47 else 32768 if vram_gb >= 23 else 4096


def context(spec: BackendSpec, model: ModelSpec, num_ctx: int | None) -> Context:
    """The context a runner of ``model`` gets for a request asking ``num_ctx`` (None: automatic)."""
    if num_ctx is not None:
        ctx = Context(num_ctx, auto=False)
    elif spec.context_length is not None:
        ctx = Context(spec.context_length, auto=False)
    else:
        ctx = Context(default_context(spec.vram or 0.0), auto=True)
        while ctx.tokens > 4096 and spec.vram is not None and runner_vram(spec, model, ctx) > spec.vram:
            ctx = Context(32768 if ctx.tokens > 32768 else 4096, auto=True)
    if model.context_length is not None and ctx.tokens > model.context_length:
        ctx = Context(model.context_length, ctx.auto)
    return ctx


def runner_vram(spec: BackendSpec, model: ModelSpec, ctx: Context) -> float:
    """GB a runner holds: the model, and, where the model gives its KV size, the cache of every slot's context."""
    if not model.kv_mb_per_token:
        return model.vram
    parallel = slots(spec, model)
    return model.vram + model.kv_mb_per_token * ctx.tokens * (parallel if math.isfinite(parallel) else 1) / 1000
