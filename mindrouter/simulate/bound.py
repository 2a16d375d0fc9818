"""The offline bound: the most completion tokens per second the pool could give the offered load.

Every model is placed perfectly and nothing is ever loaded. For backend ``b``
and model ``m`` (with ``s_b`` its slowdown):

    solo_{b,m} = p_m / prefill_{b,m} + c_m / decode_{b,m}
                 seconds one request takes alone, p_m and c_m the mean prompt and
                 completion tokens of the requests the users sent for m
    n_{b,m}    = streams m may run there at once: parallel (1 for an embedding model
                 or a single-slot family on an Ollama), at most max_concurrent
    k_b        = streams b may run at once: the most slots of any set of its models
                 that fits in its vram together (at most max_loaded of them), at most
                 max_concurrent; without parallel, max_concurrent
    g(n)       = n / (1 + s_b * (n - 1)): solo-seconds of work n streams side by side
                 do per second, which grows with n

and the bound is the linear program (``_lp.maximize``), y_{b,m} being the
requests per second of m sent to b:

    maximize    sum over b, m of c_m * y_{b,m}
    subject to  sum over m of solo_{b,m} * y_{b,m} <= g(k_b)     for every backend b
                sum over m of solo_{b,m} * y_{b,m} / g(n_{b,m}) <= 1
                                                                 for every backend b with a slowdown
                                                                 whose models time-share the GPU
                solo_{b,m} * y_{b,m} <= g(n_{b,m})               for every pair (b, m)
                sum over b of y_{b,m} <= lambda_m                for every model m

(the second: with a slowdown and ``sharing = "time-share"``, models take turns on
the GPU (``workstation/gpu.py``), and model m does at most g(n_{b,m}) solo-seconds
of work per second of its turn; under "concurrent" every stream is in one batch,
which the first already bounds). Prompts count whole: a prompt cache that
spares prefill lets a run pass the bound by that prefill.

where ``lambda_m`` is the offered request rate of m: the requests the users
sent for it over the seconds considered (the run, or its saturated stretches:
``figures.offers``). Since g grows with n, no placement and no order of
service does more work per second than g of the most streams that fit, and
none serves more than was sent, so the figure is an upper bound of the
simulated pool (at saturation, but for the work already running when a
stretch began).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._lp import maximize
from .scenario import BackendSpec, ModelSpec, Scenario
from .workstation.ollama import context, runner_vram
from .workstation.ollama import slots as runner_slots

__all__ = ["Offer", "offline_bound", "slots", "streams"]


@dataclass(frozen=True, slots=True)
class Offer:
    """What the users offered one model: requests per second and their mean sizes."""

    rate: float
    prompt: float
    completion: float


def slots(backend: BackendSpec, model: ModelSpec) -> int:
    """``n_{b,m}``: the streams ``model`` may run on ``backend`` at once."""
    return int(min(backend.max_concurrent, runner_slots(backend, model)))


def streams(backend: BackendSpec, scenario: Scenario) -> int:
    """``k_b``: the most streams ``backend`` can run at once (see the module docstring)."""
    if backend.parallel is None:
        return backend.max_concurrent
    models = [scenario.model(m) for m in backend.models]
    room = math.inf if backend.vram is None else backend.vram
    most = backend.max_loaded or len(models)
    best = 0
    for size in range(1, min(most, len(models)) + 1):
        for group in itertools.combinations(models, size):
            if sum(runner_vram(backend, m, context(backend, m, None)) for m in group) <= room + 1e-9:
                best = max(best, sum(slots(backend, m) for m in group))
    return min(backend.max_concurrent, best)


def offline_bound(scenario: Scenario, offered: Mapping[str, Offer], *, mix: bool = False) -> dict[str, Any]:
    """The bound for ``offered`` (per model), with how each backend reaches it.

    Args:
        mix: instead of capping each model by its rate, serve the offered mix as fast as
            possible (``t`` times every rate, ``t`` maximized). Defaults to False.
    """
    pairs = []
    for backend in scenario.backends:
        k = streams(backend, scenario)
        for name in backend.models:
            if name in offered:
                rates, offer = backend.rate(name), offered[name]
                solo = offer.prompt / rates.prefill + offer.completion / rates.decode
                pairs.append((backend, name, solo, k))
    if not pairs:
        return {"tokens_per_second": 0.0, "backends": {}}

    def g(backend: BackendSpec, n: int) -> float:
        return n / (1 + backend.slowdown * (n - 1))

    extra = [0.0] if mix else []  # the mix's factor t, as one more variable
    rows: list[list[float]] = []
    bounds: list[float] = []
    for backend in scenario.backends:
        rows.append([solo if b is backend else 0.0 for b, _, solo, _ in pairs] + extra)
        bounds.append(g(backend, streams(backend, scenario)))
        if backend.slowdown and backend.sharing == "time-share":  # their shares of its time add up to at most 1
            rows.append(
                [solo / g(b, min(k, slots(b, scenario.model(m)))) if b is backend else 0.0 for b, m, solo, k in pairs]
                + extra
            )
            bounds.append(1.0)
    for i, (backend, name, solo, k) in enumerate(pairs):
        rows.append([solo if j == i else 0.0 for j in range(len(pairs))] + extra)
        bounds.append(g(backend, min(k, slots(backend, scenario.model(name)))))
    for model in sorted(offered):
        rate = offered[model].rate
        if mix:  # t * rate <= what is sent to its backends
            rows.append([-1.0 if m == model else 0.0 for _, m, _, _ in pairs] + [rate])
            bounds.append(0.0)
        else:
            rows.append([1.0 if m == model else 0.0 for _, m, _, _ in pairs])
            bounds.append(rate)
    gain = [offered[m].completion for _, m, _, _ in pairs]
    objective = [0.0] * len(pairs) + [sum(o.rate * o.completion for o in offered.values())] if mix else gain
    value, y = maximize(objective, rows, bounds)
    per_backend: dict[str, dict[str, Any]] = {}
    for (backend, model, _, k), rate, tokens in zip(pairs, y, gain, strict=False):
        entry = per_backend.setdefault(backend.name, {"streams": k, "tokens_per_second": 0.0, "models": {}})
        if rate > 1e-12:
            entry["models"][model] = round(rate * tokens, 3)
            entry["tokens_per_second"] += rate * tokens
    for entry in per_backend.values():
        entry["tokens_per_second"] = round(entry["tokens_per_second"], 3)
    return {"tokens_per_second": round(value, 3), "backends": per_backend}
