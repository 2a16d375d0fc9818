"""Perfect placement: the same workload on the same pool, every model resident from the start.

Issue 17's offline bound in its own words ("all models placed perfectly, no
loads"), as a second simulation rather than a formula: the same arrivals and
request sizes (the workload's generators draw the same whatever the pool
does), the same rates, per-model slots, ``max_concurrent``, GPU time-sharing
and scheduler, but each backend holds every model it serves from the start:
no VRAM limit on residency, no loads, no eviction, no keep_alive expiry. What
the real run loses to loads and to models resident in the wrong place is the
difference. Unlike the linear program of ``bound.py``, it runs a model's batch
only as full as its requests make it, so a run can reach it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .figures import throughput
from .runs import Run
from .scenario import BackendSpec, Scenario

__all__ = ["perfect_figures", "perfect_placement"]


def _resident(backend: BackendSpec, scenario: Scenario) -> BackendSpec:
    """``backend`` with every model it serves loaded for good, its VRAM grown to hold them all."""
    if backend.vram is None:  # keeps every model resident already; the core hears all are loaded
        return dataclasses.replace(backend, loaded_models=backend.models)
    held = sum(scenario.model(m).vram for m in backend.models)
    return dataclasses.replace(
        backend,
        loaded_models=backend.models,
        vram=max(backend.vram, held),
        max_loaded=None,
        keep_alive=None,
        load_seconds_per_gb=0.0,
    )


def perfect_placement(scenario: Scenario) -> Scenario | None:
    """``scenario`` with every model placed perfectly, or None when it already is (no second run is needed)."""
    backends = tuple(_resident(b, scenario) for b in scenario.backends)
    return None if backends == scenario.backends else scenario.replace(backends=backends)


def perfect_figures(run: Run, perfect: Run) -> dict[str, Any]:
    """``perfect_placement`` in the report: the perfect run's figures, and the real run's over them.

    Saturation is each run's own (stretches with a request queued in the core), as a live
    pool's is measured, so ``at_saturation`` compares what each delivered while work waited.
    ``perfect`` is ``run`` itself where the scenario is placed perfectly already.
    """
    real, best = throughput(run), throughput(perfect)

    def ratio(key: str) -> float | None:
        mine, theirs = real[key], best[key]
        return None if mine is None or not theirs else round(mine / theirs, 4)

    return {
        **best,
        "run_over_perfect": ratio("tokens_per_second"),
        "run_over_perfect_at_saturation": ratio("tokens_per_second_at_saturation"),
        "loads": sum(b.loads for b in perfect.backends),
        "second_run": perfect is not run,
    }
