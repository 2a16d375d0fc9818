"""The GPU-sharing law of the workstation model (simulate/workstation/gpu.py), with numbers.

A vLLM engine spends each step's token budget on one token of every decoding
stream, then a chunk of the prompts being read: a long uncached prompt delays
every running stream by about its own prefill time. Ollama's streams slow
each other by ``slowdown`` whatever their phase.
"""

from __future__ import annotations

import pytest

from mindrouter.simulate.scenario import BackendSpec, Rates
from mindrouter.simulate.workstation import DECODE, Prompt, Segment, Stream
from mindrouter.simulate.workstation.gpu import STEP_TOKENS, Gpu

RATES = Rates(decode=100.0, prefill=8000.0)


def spec(engine: str) -> BackendSpec:
    return BackendSpec(
        name="b",
        models=("m",),
        max_concurrent=64,
        tokens_per_second=100.0,
        prefill_tokens_per_second=8000.0,
        loaded_models=("m",),
        slowdown=0.05,
        engine=engine,
    )


def stream(name: str, prompt: int, completion: int = 1000) -> Stream[str]:
    return Stream(name, "m", Prompt((Segment(name, prompt),)), completion, RATES, 0.0, Segment((name, "a"), 10))


def gpu(engine: str) -> tuple[Gpu[str], list[tuple[float, str, object]]]:
    pushed: list[tuple[float, str, object]] = []
    return Gpu(spec(engine), lambda t, kind, ev: pushed.append((t, kind, ev)), lambda s, old, now: None), pushed


def decoding(g: Gpu[str], name: str) -> Stream[str]:
    s = stream(name, 1)
    g.start(s, 0.0)
    g.prefilled(s, 0.0)
    return s


def test_vllm_a_long_uncached_prompt_delays_every_decoding_stream_by_about_its_prefill_time() -> None:
    g, _ = gpu("vllm")
    a, b = decoding(g, "a"), decoding(g, "b")
    alone = a.rate
    assert alone == pytest.approx(100.0 / 1.05)  # two decoding streams: 5% slower each
    long = stream("long", 3000)
    g.start(long, 1.0)
    step = 1.05 / 100.0 + (STEP_TOKENS - 2) / 8000.0  # two decode tokens and a prefill chunk
    assert a.rate == b.rate == pytest.approx(1.0 / step)
    assert long.rate == pytest.approx((STEP_TOKENS - 2) / step)
    prefill = 3000 / long.rate
    assert prefill == pytest.approx(0.376, abs=0.005)  # the prompt at about the engine's prefill rate
    # While it reads, the others lose nearly all of it: about 0.37 s of their decode.
    lost = prefill - prefill * a.rate / alone
    assert lost == pytest.approx(0.37, abs=0.01)
    assert g.prefilled(long, 1.0 + prefill) == pytest.approx(100.0 / 1.10)
    assert a.rate == pytest.approx(100.0 / 1.10)  # three decoding streams, nothing to read
    assert a.phase == DECODE and a.done == pytest.approx(1.0 + prefill + (1000 - a.tokens(1.0 + prefill)) / a.rate)


def test_llamacpp_a_prompt_stalls_the_slot_decoding_beside_it_for_about_its_reading() -> None:
    """As measured on a real llama-server (benchmarks/bench_prefill_stall.py: 0.99-1.10 of the prompt's reading
    lost, one token each 512 of the prompt's tokens); it was taken as one more stream's 5%."""
    g, _ = gpu("llamacpp")
    a = decoding(g, "a")
    alone = a.rate
    assert alone == pytest.approx(100.0)
    long = stream("long", 2000)
    g.start(long, 1.0)
    step = 1 / 100.0 + 511 / 8000.0  # its token and a 511-token chunk of the prompt
    assert a.rate == pytest.approx(1.0 / step)
    prefill = 2000 / long.rate
    lost = prefill - prefill * a.rate / alone
    assert lost / (2000 / 8000) == pytest.approx(1.0, abs=0.15)
    assert g.prefilled(long, 1.0 + prefill) == pytest.approx(100.0 / 1.05)


def test_vllm_reads_prompts_in_the_order_their_requests_started() -> None:
    """vLLM's scheduler gives each step's budget to its running requests in order: a prompt sent after another
    waits for it, and slows it not at all (shared equally, both read by 1.0 s; in order, x by 0.5 s)."""
    g, _ = gpu("vllm")
    x, y = stream("x", 4000), stream("y", 4000)
    g.start(x, 0.0)
    assert x.rate == pytest.approx(8000.0)  # nothing decoding: the whole step is prefill
    g.start(y, 0.0)
    assert x.rate == pytest.approx(8000.0) and x.prefill_end == pytest.approx(0.5)
    assert y.rate == 0.0
    g.prefilled(x, 0.5)
    assert y.prefill_end == pytest.approx(0.5 + 4000 / (8000 / (1 + 8000 / (STEP_TOKENS - 1) / 100)), rel=1e-3)


def test_ollama_a_prefilling_stream_slows_the_others_as_a_decoding_one_does() -> None:
    g, _ = gpu("ollama")
    a, _b = decoding(g, "a"), decoding(g, "b")
    g.start(stream("long", 3000), 1.0)
    assert a.rate == pytest.approx(100.0 / 1.10)
