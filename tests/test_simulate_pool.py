"""The simulator's Ollama-like workstations (issue 17): loads, eviction, keep_alive, per-model slots,
streams sharing a GPU, what the core is told, and the pool figures of `mr simulate`.

The workstation is stepped by hand (as h11's state machine is) with a recording
``push``; whole scenarios check the numbers end to end.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time

import pytest
from typer.testing import CliRunner

from mindrouter.cli import app
from mindrouter.simulate import (
    ScenarioError,
    arrivals,
    build,
    load_example,
    parse_scenario,
    run_scenario,
    simulate,
)
from mindrouter.simulate._lp import maximize
from mindrouter.simulate.conversations import single
from mindrouter.simulate.runs import RequestTrace
from mindrouter.simulate.scenario import BackendSpec, ModelSpec
from mindrouter.simulate.workload import draw_sizes, expected_sizes
from mindrouter.simulate.workstation import DECODE, Runner, Stream, Workstation

MODELS = {  # two fit in 10 GB (the second in 80% of what the first leaves, as Ollama asks), three do not
    "a": ModelSpec("a", size=4, vram=4),
    "b": ModelSpec("b", size=4, vram=4),
    "c": ModelSpec("c", size=2, vram=4),
    "e": ModelSpec("e", size=0.5, vram=0.5, kind="embedding"),
}


def station(**changes):
    """A 10 GB backend loading at 1 s per GB; returns it and the events it pushed."""
    fields = {
        "name": "g",
        "models": ("a", "b", "c", "e"),
        "max_concurrent": 8,
        "tokens_per_second": 50.0,
        "prefill_tokens_per_second": 1000.0,
        "loaded_models": (),
        "vram": 10.0,
        "load_seconds_per_gb": 1.0,
        "max_loaded": 3,
        "keep_alive": 300.0,
    }
    fields.update(changes)
    events: list[tuple[float, str, object]] = []
    ws = Workstation(BackendSpec(**fields), MODELS.__getitem__, lambda t, k, p: events.append((t, k, p)), _no_rate)
    return ws, events


def _no_rate(stream: Stream, old: float, now: float) -> None:
    pass


def req(n: int, prompt: int = 100, completion: int = 100) -> RequestTrace:
    return RequestTrace(str(n), 0, prompt, completion, 0.0)


def send(ws: Workstation[RequestTrace], r: RequestTrace, model: str, now: float) -> Stream[RequestTrace]:
    """``r`` arrives at ``ws``: a single request, sharing no prefix with any other."""
    prompt, answer = single(r.id, r.prompt)
    return ws.accept(r, model, prompt, r.completion, now, answer)


def last(events, kind):
    return next(e for e in reversed(events) if e[1] == kind)


def load(ws: Workstation, events, model: str, now: float) -> Runner:
    """Finish the load of ``model`` that ``ws`` started."""
    _, _, (_, runner) = last(events, "loaded")
    assert runner.model.name == model
    ws.loaded(runner, now)
    return runner


# -- loading, eviction, keep_alive ------------------------------------------------


def test_a_request_loads_its_model_then_prefills_and_decodes():
    ws, events = station()
    s = send(ws, req(1), "a", 0.0)
    assert last(events, "loaded")[0] == 4.0  # 4 GB at 1 s/GB
    assert ws.snapshot().loaded_models == {"a"}  # Ollama lists a loading model in /api/ps
    assert ws.snapshot().vram_free == 6e9
    load(ws, events, "a", 4.0)
    assert s.load == 4.0 and s.prefill_end == pytest.approx(4.1) and s.done == pytest.approx(6.1)
    assert (ws.loads, ws.load_seconds) == (1, 4.0)


def test_a_request_behind_a_load_of_its_model_waits_for_it_and_reports_the_wait_as_its_load():
    """Ollama's getRunner gives a request the runner of its model at once, loading or not: it waits for
    the load on the runner, not in the server's queue (where it would hold up loads of other models)."""
    ws, _ = station(parallel=2)
    send(ws, req(1), "a", 0.0)
    s2 = send(ws, req(2), "a", 1.0)
    assert ws.loads == 1 and not ws.pending and list(ws.runners["a"].queue)[1:] == [s2]
    sb = send(ws, req(3), "b", 1.5)  # another model's load is not held up behind a
    assert ws.loads == 2 and not ws.pending and sb in ws.runners["b"].queue
    ws.loaded(ws.runners["a"], 4.0)
    assert s2.load == 3.0 and s2.phase != 0 and not ws.pending


def test_eviction_takes_the_first_idle_model_by_name_as_ollama_does():
    """Ollama's findRunnerToUnload sorts by keep_alive, then name (model path): not least recently used."""
    ws, events = station()
    for model, t in (("b", 0.0), ("a", 10.0)):  # b used first, so b is the LRU one, but a < b by name
        s = send(ws, req(1), model, t)
        load(ws, events, model, t + 4)
        ws.finish(s, t + 6.1)
    send(ws, req(3), "c", 20.0)  # 5 + 5 + 5 GB > 10 GB: one idle model must go
    assert set(ws.runners) == {"b", "c"} and ws.evictions == 1


def test_with_every_model_busy_the_first_by_name_is_waited_for_even_if_another_goes_idle_first():
    ws, events = station()
    sa = send(ws, req(1, completion=500), "a", 0.0)
    load(ws, events, "a", 4.0)
    sb = send(ws, req(2), "b", 5.0)
    load(ws, events, "b", 9.0)
    sc = send(ws, req(3), "c", 10.0)
    ws.finish(sb, 10.5)  # b goes idle first, but Ollama already chose a
    assert list(ws.pending) == [sc] and set(ws.runners) == {"a", "b"}
    ws.finish(sa, 14.1)
    assert set(ws.runners) == {"b", "c"} and ws.evictions == 1 and not ws.pending


def test_with_every_resident_model_busy_a_load_waits_for_one_to_go_idle():
    ws, events = station()
    sa = send(ws, req(1, completion=500), "a", 0.0)
    load(ws, events, "a", 4.0)
    send(ws, req(2), "b", 5.0)
    sc = send(ws, req(3), "c", 5.5)  # a busy, b loading: nothing to evict
    assert list(ws.pending) == [sc] and set(ws.runners) == {"a", "b"}
    ws.finish(sa, 14.1)
    assert set(ws.runners) == {"b", "c"} and ws.evictions == 1 and not ws.pending
    assert last(events, "loaded")[0] == pytest.approx(16.1)  # c: 2 GB from 14.1


def test_max_loaded_evicts_even_when_memory_would_fit():
    ws, events = station(vram=80.0, max_loaded=2)
    for n, model in enumerate(("a", "b")):
        s = send(ws, req(n), model, 10.0 * n)
        load(ws, events, model, 10.0 * n + 4)
        ws.finish(s, 10.0 * n + 6.1)
    send(ws, req(9), "c", 30.0)
    assert set(ws.runners) == {"b", "c"}


def test_keep_alive_unloads_an_idle_model_and_a_new_request_restarts_the_timer():
    ws, events = station()
    s = send(ws, req(1), "a", 0.0)
    runner = load(ws, events, "a", 4.0)
    ws.finish(s, 6.1)
    t, kind, (_, _, version) = last(events, "expire")
    assert (t, kind) == (pytest.approx(306.1), "expire")
    s2 = send(ws, req(2), "a", 100.0)  # used again: that timer no longer stands
    ws.expire(runner, version, 306.1)
    assert "a" in ws.runners
    ws.finish(s2, 102.2)
    t, _, (_, _, version) = last(events, "expire")
    ws.expire(runner, version, t)
    assert "a" not in ws.runners and ws.expirations == 1 and ws.snapshot().loaded_models == frozenset()


# -- slots --------------------------------------------------------------------------


def test_parallel_slots_are_per_loaded_model():
    ws, events = station(parallel=2)
    streams = [send(ws, req(n), "a", 0.0) for n in range(3)]
    load(ws, events, "a", 4.0)
    assert len(ws.active) == 2 and list(ws.runners["a"].queue) == [streams[2]]
    sb = [send(ws, req(10 + n), "b", 4.0) for n in range(2)]
    load(ws, events, "b", 8.0)
    assert len(ws.active) == 4 and all(s in ws.active for s in sb)  # another model, its own 2 slots
    ws.finish(streams[0], 9.0)
    assert streams[2] in ws.active and streams[2].began == 9.0


def test_an_embedding_model_serves_one_request_at_a_time_as_ollama_loads_it():
    ws, events = station(parallel=4)
    first, second = (send(ws, req(n, completion=0), "e", 0.0) for n in range(2))
    load(ws, events, "e", 0.5)
    assert ws.active == [first] and list(ws.runners["e"].queue) == [second]
    assert first.done == pytest.approx(0.6)  # prefill only: 100 tokens at 1000/s


def test_streams_sharing_a_gpu_slow_each_other():
    ws, _ = station(loaded_models=("a",), slowdown=0.5, parallel=4)
    one = send(ws, req(1), "a", 0.0)
    assert one.done == pytest.approx(2.1)  # alone: 0.1 s prefill + 2 s decode
    two = send(ws, req(2), "a", 0.0)
    # side by side each runs at 1 / (1 + 0.5): 0.15 s prefill + 3 s decode
    assert one.done == pytest.approx(3.15) and two.done == pytest.approx(3.15)


def test_models_with_streams_running_time_share_the_gpu_as_the_benchmark_workstations_do():
    """Each model is a runner of its own: a second model halves everyone's turn (benchmarks/_workstation.py)."""
    ws, _ = station(loaded_models=("a", "b"), slowdown=0.5, parallel=4)
    one = send(ws, req(1), "a", 0.0)
    two = send(ws, req(2), "a", 0.0)
    other = send(ws, req(3), "b", 0.0)
    # a's batch of two steps 1.5x slower and gets half the GPU: 0.3 s prefill + 6 s decode;
    # b alone in its batch, half the GPU: 0.2 s + 4 s
    assert one.done == pytest.approx(6.3) and two.done == pytest.approx(6.3)
    assert other.done == pytest.approx(4.2)


def test_a_decoding_stream_is_re_timed_when_another_starts():
    ws, _ = station(loaded_models=("a",), slowdown=0.5, parallel=4)
    one = send(ws, req(1), "a", 0.0)
    ws.prefilled(one, 0.1)
    assert one.phase == DECODE
    send(ws, req(2), "a", 1.1)  # one has 50 tokens done; the other 50 now take 50 / (50 / 1.5) = 1.5 s
    assert one.done == pytest.approx(2.6)


# -- scenarios end to end ---------------------------------------------------------

ONE = """
duration = {duration}
[models.a]
size = 4
[[backends]]
name = "g"
models = ["a"]
max_concurrent = 4
tokens_per_second = 50
prefill_tokens_per_second = 1000
vram = 10
load_seconds_per_gb = 0.5
poll_interval = {poll}
[[users]]
name = "u"
model = "a"
concurrency = 1
requests = 2
prompt_tokens = 100
completion_tokens = 100
"""


def test_a_scenario_loads_once_and_the_core_learns_from_the_timings():
    run = simulate(parse_scenario(ONE.format(duration=100, poll=0)), trace=True)
    first, second = run.trace  # type: ignore[misc]
    assert (first.dispatched, first.prefill_end, first.done) == (0.0, pytest.approx(2.1), pytest.approx(4.1))
    assert (second.prefill_end, second.done) == (pytest.approx(4.2), pytest.approx(6.2))  # resident: no load
    result = build(run)
    assert result["loads"] == {
        "count": 1,
        "seconds": 2.0,
        "per_hour": 36.0,
        "seconds_per_hour": 72.0,
        "evictions": 0,
        "expirations": 0,
    }
    learned = run.scheduler.load("g")
    assert learned is not None and learned.load_bytes_per_second == pytest.approx(4e9 / 2.0)
    assert learned.speeds["a"].decode == pytest.approx(50.0) and learned.speeds["a"].prefill == pytest.approx(1000)
    assert result["models"]["a"]["ttft_p50"] == pytest.approx(0.1) and result["models"]["a"]["ttft_p95"] == 2.1


@pytest.mark.parametrize(("poll", "seen"), [(0, {"a"}), (5, set())])
def test_the_core_hears_of_a_load_at_once_or_at_the_next_poll(poll, seen):
    run = simulate(parse_scenario(ONE.format(duration=4.5, poll=poll)))
    backend = run.scheduler.backend("g")
    assert backend is not None and backend.loaded_models == seen


def test_a_backend_without_vram_is_told_to_the_core_as_before():
    sc = load_example("scenario3")
    run = simulate(sc.replace(duration=10))
    backend = run.scheduler.backend(sc.backends[0].name)
    assert backend is not None
    assert backend.loaded_models == backend.models and backend.vram_total is None and backend.parallel is None
    assert build(run)["loads"]["count"] == 0


def test_the_offline_bound_for_two_slots_by_hand():
    text = """
duration = 210
[[backends]]
name = "g"
models = ["a"]
max_concurrent = 2
tokens_per_second = 50
prefill_tokens_per_second = 1000
[[users]]
name = "u"
model = "a"
concurrency = 4
prompt_tokens = 100
completion_tokens = 100
"""
    result = build(simulate(parse_scenario(text)))
    # Two streams, each request 0.1 s of prefill and 2 s of decode: 2 x 100 / 2.1 tokens/s.
    assert result["offline_bound"]["tokens_per_second_at_saturation"] == pytest.approx(200 / 2.1, abs=1e-3)
    assert result["throughput"]["tokens_per_second_at_saturation"] == pytest.approx(200 / 2.1, rel=1e-3)


def test_the_simplex_on_a_small_program():
    value, x = maximize([1, 1], [[1, 2], [3, 1]], [4, 6])
    assert value == pytest.approx(2.8) and x == [pytest.approx(1.6), pytest.approx(1.2)]


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda t: t.replace("vram = 10\n", ""), "backends[0].load_seconds_per_gb needs backends[0].vram"),
        (lambda t: t.replace("vram = 10\n", "vram = 3\n"), "which holds 4 GB, more than backends[0].vram (3 GB)"),
        (lambda t: t.replace("[models.a]\nsize = 4\n", ""), "which has no [models.'a'] size"),
        (lambda t: t.replace("size = 4", 'size = 4\nkind = "image"'), 'models.a.kind must be "chat" or "embedding"'),
        (
            lambda t: t.replace("poll_interval = 0", "poll_interval = -1"),
            "backends[0].poll_interval must be at least 0",
        ),
        (
            lambda t: t.replace("poll_interval = 0", "rates = { b = { decode = 5 } }"),
            "backends[0].rates.b names a model",
        ),
        (lambda t: t.replace("size = 4", 'size = 4\nkind = "embedding"'), "'a' is an embedding model"),
    ],
)
def test_new_keys_are_checked_and_named(change, needle):
    with pytest.raises(ScenarioError) as info:
        parse_scenario(change(ONE.format(duration=10, poll=0)), source="lab.toml")
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_rates_per_model_default_to_the_backend_rates():
    text = ONE.format(duration=10, poll=0).replace("poll_interval = 0", "rates = { a = { decode = 20 } }")
    (backend,) = parse_scenario(text).backends
    assert (backend.rate("a").decode, backend.rate("a").prefill) == (20, 200)  # prefill: 10 x its decode
    assert backend.keep_alive == 300 and backend.max_loaded == 3 and backend.loaded_models == ()


# -- the lab-pool example -----------------------------------------------------------


@pytest.fixture(scope="module")
def lab():
    # CPU seconds, not wall: the simulator runs on one thread, and on a shared machine
    # (CI's included) waiting for a core tripled the wall time while the work stayed 4.4 s.
    began = time.process_time()
    result, run = run_scenario(load_example("lab-pool"))
    return result, run, time.process_time() - began


def test_lab_pool_reports_the_pool_figures(lab):
    result, run, _ = lab
    assert set(result["models"]) == {"llama3.1:8b", "qwen2.5-coder:14b", "llama3.1:70b", "nomic-embed-text"}
    for row in result["models"].values():
        assert set(row) >= {"ttft_p50", "ttft_p95", "e2e_p50", "e2e_p95", "timed_out", "completed"}
        assert row["ttft_p50"] <= row["ttft_p95"] <= row["e2e_p95"]
    assert result["models"]["nomic-embed-text"]["completion_tokens"] == 0
    assert set(result["loads"]) == {"count", "seconds", "per_hour", "seconds_per_hour", "evictions", "expirations"}
    assert result["loads"]["count"] > 4  # the pool starts empty: at least one load per backend
    assert set(result["lost"]) == {"requests", "timed_out", "rejected"}
    t, bound = result["throughput"], result["offline_bound"]
    assert t["saturated_seconds"] > 200  # the burst saturates the pool
    assert 0 < t["tokens_per_second_at_saturation"] <= bound["tokens_per_second_at_saturation"]
    assert t["tokens_per_second"] <= bound["tokens_per_second"] + 1e-6
    assert all(set(b) >= {"loads", "load_seconds", "evictions", "expirations"} for b in result["backends"])
    run.scheduler.check()


@pytest.mark.timing
def test_lab_pool_is_fast(lab):
    assert lab[2] < 10  # CPU seconds, with the deprioritization baseline run


def test_lab_pool_same_seed_same_json():
    sc = load_example("lab-pool").replace(duration=300)
    assert json.dumps(build(simulate(sc))) == json.dumps(build(simulate(sc)))
    assert json.dumps(build(simulate(sc))) != json.dumps(build(simulate(sc.replace(seed=18))))


def test_cli_json_and_table_for_lab_pool():
    result = CliRunner().invoke(app, ["simulate", "--example", "lab-pool", "--json", "--duration", "240"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"users", "pools", "windows", "models", "throughput", "loads", "lost", "offline_bound"} <= set(data)
    table = CliRunner().invoke(app, ["simulate", "--example", "lab-pool", "--duration", "240"])
    assert table.exit_code == 0 and "Model loads" in table.stdout and "offline bound" in table.stdout


# -- the workload, for a live replay ------------------------------------------------


def test_arrivals_are_the_requests_the_simulator_submits():
    sc = load_example("lab-pool").replace(duration=400)
    run = simulate(sc, trace=True)
    assert run.trace is not None
    names = [u.name for u in run.users]
    simulated = [(r.submitted, names[r.user], r.model, r.prompt, r.completion) for r in run.trace]
    listed = [(a.at, a.user, a.model, a.prompt_tokens, a.completion_tokens) for a in arrivals(sc)]
    assert listed == simulated and len(listed) > 500


@pytest.mark.parametrize(
    ("completion", "max_tokens", "leave_after"),
    [((10, 400), None, None), ((10, 400), 100, None), ((10, 400), 500, 50), ((300, 300), None, 10), ((7, 9), 3, None)],
)
def test_expected_sizes_are_the_mean_of_what_is_drawn(completion, max_tokens, leave_after):
    """The targets' units per slot-second use a phase's mean sizes: the mean of every draw, caps included."""
    spec = dataclasses.replace(
        load_example("scenario3").users[0],
        prompt_tokens=(100, 301),
        completion_tokens=completion,
        max_tokens=max_tokens,
        leave_after=leave_after,
    )
    low, high = completion
    caps = [c for c in (max_tokens, leave_after) if c is not None]
    exact = sum(min([k, *caps]) for k in range(low, high + 1)) / (high - low + 1)
    assert expected_sizes(spec) == pytest.approx((200.5, exact), abs=1e-9)
    rng = random.Random(1)
    draws = [draw_sizes(spec, rng) for _ in range(20000)]
    assert sum(c for _, c in draws) / len(draws) == pytest.approx(exact, rel=0.02)


def test_a_closed_loop_workload_cannot_be_listed():
    with pytest.raises(ScenarioError, match=r"users\[0\] \(prof\) is closed-loop"):
        arrivals(load_example("scenario3"))


def test_tokens_as_generated_add_up_when_streams_re_time_each_other():
    """With a slowdown every start and end re-times the other streams' service lines; none is lost or doubled."""
    text = ONE.format(duration=400, poll=0).replace("poll_interval = 0", "slowdown = 0.3\nparallel = 4")
    text = text.replace("concurrency = 1\nrequests = 2", "rate = 0.5\nstop = 300").replace(
        "completion_tokens = 100", "completion_tokens = [10, 400]"
    )
    run = simulate(parse_scenario(text), trace=True)
    assert run.trace is not None and all(r.done is not None for r in run.trace)
    result = build(run)
    assert result["tokens"] == sum(r.prompt + r.completion for r in run.trace)
    completion = sum(r.completion for r in run.trace)
    assert result["throughput"]["tokens_per_second"] == pytest.approx(completion / 400, abs=1e-3)
    longest = max(r.done - r.prefill_end for r in run.trace)  # type: ignore[operator]
    assert longest > 400 / 50  # some answer was slowed by others
