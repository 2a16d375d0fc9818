"""Placement (issue 31): a load the core triggered counts at once, with what it evicts, in the VRAM it expects."""

from __future__ import annotations

import dataclasses

from mindrouter.scheduler import REASONS, Backend, Job, Modality, Scheduler

GB = 10**9
RTX4080 = Backend(
    1,
    "4080",
    models=frozenset({"llama", "coder"}),
    loaded_models=frozenset({"coder"}),
    max_concurrent=8,
    parallel=4,
    max_loaded=3,
    vram_free=5 * GB,
    vram_total=16 * GB,
    model_vram={"llama": int(6.5 * GB), "coder": 11 * GB},
    resident_vram={"coder": 11 * GB},
    model_sizes={"llama": int(4.9 * GB), "coder": 9 * GB},
)


def test_a_model_is_not_expected_to_load_beside_one_loading_in_the_place_it_just_left():
    """The issue's RTX 4080: the 8B went there evicting the idle coder; a coder request must not be counted
    as fitting beside the loading 8B (6.5 + 11 GB > 16 GB), before a poll and after one mid-load."""
    s = Scheduler()
    s.set_backend(RTX4080)
    s.set_user("u", 1.0)
    assert s.submit(Job("a", "u", "llama", 0.0, prompt_tokens=10, max_tokens=10), 0.0) is None
    [d] = s.dispatch(0.0)
    assert d.record.to_dict()["score_components"]["1"]["evicts"] == ["coder"]
    assert s.submit(Job("b", "u", "coder", 0.1, prompt_tokens=10, max_tokens=10), 0.1) is None
    assert s.dispatch(0.1) == []
    closed = s.router.classes.get(("coder", Modality.CHAT, False)).closed
    assert closed == {1: (REASONS["memory"],)}
    mid_load = dataclasses.replace(RTX4080, loaded_models=frozenset(), vram_free=16 * GB, resident_vram={})
    s.set_backend(mid_load)  # the coder is gone, the 8B not listed yet, the reading taken before it allocated
    assert s.dispatch(0.2) == []
