"""The workstation model as Ollama runs (ollama/ollama fb30760), stepped by hand with a recording ``push``.

Slots per model (1 by default; embeddings and some families always 1), a context chosen by the
GPU's VRAM and a KV cache sized for it, reloads for other load options, keep_alive per request,
80% of the free VRAM for a load beside others, the server's queue limit, cancelled requests,
prompt caches, and the two laws of GPU sharing.
"""

from __future__ import annotations

from typing import Any

import pytest

from mindrouter.simulate.conversations import Conversation, Turn, single
from mindrouter.simulate.scenario import GB, BackendSpec, ModelSpec
from mindrouter.simulate.workstation import DECODE, DONE, Options, ServerBusy, Stream, Workstation
from mindrouter.simulate.workstation.ollama import context, default_context, runner_vram, slots

MODELS = {
    "a": ModelSpec("a", size=5, vram=10),
    "big": ModelSpec("big", size=6, vram=12),
    "small": ModelSpec("small", size=5, vram=11),
    "vl": ModelSpec("vl", size=5, vram=5, family="qwen3vl"),
    "e": ModelSpec("e", size=0.5, vram=0.5, kind="embedding"),
    "kv": ModelSpec("kv", size=5, vram=5, kv_mb_per_token=0.131, context_length=131072),
}


def station(**changes: Any) -> tuple[Workstation[str], list[tuple[float, str, object]]]:
    """A 24 GB Ollama loading at 1 s per GB, 4 slots per model; returns it and what it pushed."""
    fields: dict[str, Any] = {
        "name": "g",
        "models": tuple(MODELS),
        "max_concurrent": 16,
        "tokens_per_second": 50.0,
        "prefill_tokens_per_second": 1000.0,
        "loaded_models": (),
        "vram": 24.0,
        "load_seconds_per_gb": 1.0,
        "max_loaded": 3,
        "keep_alive": 300.0,
        "parallel": 4,
    }
    fields.update(changes)
    events: list[tuple[float, str, object]] = []
    ws: Workstation[str] = Workstation(
        BackendSpec(**fields), MODELS.__getitem__, lambda t, k, p: events.append((t, k, p)), lambda *a: None
    )
    return ws, events


def send(ws: Workstation[str], n: int, model: str, now: float, prompt: int = 100, **options: Any) -> Stream[str]:
    p, answer = single(str(n), prompt)
    return ws.accept(str(n), model, p, 100, now, answer, Options(**options))


def loaded(ws: Workstation[str], model: str, now: float) -> None:
    ws.loaded(ws.runners[model], now)


# -- Ollama's rules --------------------------------------------------------------------


def test_the_default_context_follows_the_gpus_vram_as_ollama_sets_it():
    # routes.go: 256k from 47 GiB, 32k from 23 GiB, else 4k, "slightly lower than 48/24" to let those cards in
    assert [default_context(gb) for gb in (80, 48, 46.9, 24, 22.9, 16)] == [262144, 262144, 32768, 32768, 4096, 4096]
    ws = BackendSpec("g", ("kv",), 4, 50.0, 500.0, (), vram=80.0, parallel=1)
    assert context(ws, MODELS["kv"], None).tokens == 131072  # never beyond what the model was trained for
    assert context(ws, MODELS["kv"], 8192).auto is False


def test_a_runners_vram_holds_the_kv_cache_of_every_slots_context_cut_until_it_fits():
    spec = BackendSpec("g", ("kv",), 4, 50.0, 500.0, (), vram=24.0, parallel=2)
    ctx = context(spec, MODELS["kv"], None)
    assert (ctx.tokens, ctx.auto) == (32768, True)
    assert runner_vram(spec, MODELS["kv"], ctx) == pytest.approx(5 + 0.131 * 32768 * 2 / 1000)  # 13.6 GB
    crowded = BackendSpec("g", ("kv",), 8, 50.0, 500.0, (), vram=24.0, parallel=8)  # 8 x 32k would not fit
    assert context(crowded, MODELS["kv"], None).tokens == 4096  # Ollama's retry after an out-of-memory load
    ws, _ = station(vram=24.0, parallel=2)
    send(ws, 1, "kv", 0.0)
    assert ws.snapshot().resident_vram["kv"] == round((5 + 0.131 * 32768 * 2 / 1000) * GB)


def test_embeddings_and_single_slot_families_get_one_slot_whatever_num_parallel_says():
    spec = BackendSpec("g", tuple(MODELS), 16, 50.0, 500.0, (), vram=24.0, parallel=4)
    assert [slots(spec, MODELS[m]) for m in ("a", "vl", "e")] == [4, 1, 1]
    assert BackendSpec("g", ("a",), 4, 50.0, 500.0, (), vram=24.0).parallel == 1  # OLLAMA_NUM_PARALLEL's default
    cpp = BackendSpec("g", ("vl",), 4, 50.0, 500.0, ("vl",), engine="llamacpp", parallel=4)
    assert slots(cpp, MODELS["vl"]) == 4  # Ollama's rule, not llama-server's


def test_a_request_for_another_context_reloads_the_runner_once_it_is_idle():
    ws, _ = station()
    first = send(ws, 1, "a", 0.0)
    loaded(ws, "a", 6.0)
    other = send(ws, 2, "a", 6.5, num_ctx=8192)  # needsReload: its own num_ctx against the automatic one
    assert list(ws.pending) == [other] and ws.runners["a"].evicting and ws.blocked
    same = send(ws, 3, "a", 6.6)  # an automatic context still matches the resident runner: it goes there
    assert same.phase != 0 and not ws.runners["a"].loading
    ws.finish(first, 8.2)
    ws.finish(same, 8.8)
    assert ws.loads == 2 and ws.runners["a"].context.tokens == 8192 and ws.runners["a"].loading
    assert ws.evictions == 1 and not ws.pending


def test_a_requests_keep_alive_becomes_its_runners():
    ws, events = station()
    s = send(ws, 1, "a", 0.0, keep_alive=0.0)
    loaded(ws, "a", 5.0)
    ws.finish(s, 7.1)
    assert "a" not in ws.runners and ws.evictions == 0  # unloaded at once, not evicted
    s = send(ws, 2, "a", 10.0, keep_alive=600.0)
    loaded(ws, "a", 15.0)
    ws.finish(s, 17.1)
    assert events[-1][:2] == (pytest.approx(617.1), "expire")
    s = send(ws, 3, "a", 20.0, keep_alive=float("inf"))
    ws.finish(s, 22.1)
    assert events[-1][1] != "expire"  # forever: no timer


@pytest.mark.parametrize(("model", "resident"), [("small", {"a", "small"}), ("big", {"big"})])
def test_beside_other_runners_a_load_must_fit_in_80_percent_of_the_free_vram(model, resident):
    """10 GB resident and idle, 14 GB free: 11 GB loads beside it, 12 GB (more than 0.8 x 14) evicts it first."""
    ws, _ = station()
    first = send(ws, 1, "a", 0.0)
    loaded(ws, "a", 5.0)
    ws.finish(first, 7.1)
    send(ws, 2, model, 8.0)
    assert set(ws.runners) == resident and ws.evictions == len({"a"} - resident)


def test_the_servers_queue_answers_busy_when_full():
    ws, _ = station(max_queue=2, max_loaded=1)
    send(ws, 1, "a", 0.0)  # loads a
    send(ws, 2, "big", 0.1)  # waits for a to go
    send(ws, 3, "small", 0.2)
    with pytest.raises(ServerBusy, match="server busy"):
        send(ws, 4, "e", 0.3)


def test_a_cancelled_request_leaves_its_queue_or_frees_its_slot_for_the_next():
    ws, _ = station(parallel=1, loaded_models=("a",))
    running = send(ws, 1, "a", 0.0)
    waiting = send(ws, 2, "a", 0.0)
    gone = send(ws, 3, "a", 0.0)
    ws.cancel(gone, 0.5)
    assert list(ws.runners["a"].queue) == [waiting] and gone.phase == DONE
    ws.cancel(running, 1.0)
    assert waiting.began == 1.0 and waiting in ws.active and ws.runners["a"].refs == 1


# -- prompt caches through the station ----------------------------------------------------

CONV = Conversation("c", "webui", 1000, (Turn(100, 50, 0.0), Turn(100, 50, 5.0)))


@pytest.mark.parametrize(("engine", "cached"), [("ollama", 1150), ("llamacpp", 1150), ("vllm", 1136), ("openai", 0)])
def test_the_next_turn_prefills_only_what_its_engines_cache_lacks(engine, cached):
    vram = 24.0 if engine == "ollama" else None
    ws, _ = station(engine=engine, vram=vram, loaded_models=("a",), parallel=4 if engine != "vllm" else None)
    first = ws.accept("t0", "a", CONV.prompt(0), 50, 0.0, CONV.answer(0))
    ws.prefilled(first, first.prefill_end)
    ws.finish(first, first.done)
    second = ws.accept("t1", "a", CONV.prompt(1), 50, 10.0, CONV.answer(1))
    assert (second.prompt.tokens, second.cached) == (1250, cached)  # vLLM: whole blocks, 71 of 16
    assert second.prefill_end - second.began == pytest.approx((1250 - cached) / 1000)


def test_an_unload_drops_the_runners_cache():
    ws, events = station()
    first = ws.accept("t0", "a", CONV.prompt(0), 50, 0.0, CONV.answer(0))
    loaded(ws, "a", 5.0)
    ws.finish(first, first.done)
    t, _, (_, runner, version) = events[-1]  # type: ignore[misc]
    ws.expire(runner, version, t)
    second = ws.accept("t1", "a", CONV.prompt(1), 50, t + 1, CONV.answer(1))
    loaded(ws, "a", t + 6)
    assert second.cached == 0


# -- the GPU-sharing law -----------------------------------------------------------------


@pytest.mark.parametrize(("sharing", "done"), [("time-share", 4.2), ("concurrent", 3.15)])
def test_two_models_share_the_gpu_by_its_law(sharing, done):
    """One stream of each of two models, slowdown 0.5: taking turns, each runs at half speed; in one
    batch, at 1 / 1.5 (a GPU running two models makes 1.33x the tokens of one)."""
    ws, _ = station(loaded_models=("a", "small"), slowdown=0.5, sharing=sharing)
    one, other = send(ws, 1, "a", 0.0), send(ws, 2, "small", 0.0)
    assert one.done == pytest.approx(done) and other.done == pytest.approx(done)
    ws.prefilled(one, one.prefill_end)
    assert one.phase == DECODE
