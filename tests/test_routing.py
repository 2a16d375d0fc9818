"""Routing by expected finish time (issue 17): speeds per (backend, model), loads, eviction, per-model slots.

Each test is one of the issue's defects, driven through the core with explicit times.
"""

from __future__ import annotations

import dataclasses

import pytest

from mindrouter.scheduler import REASONS, Backend, Job, Modality, Scheduler, SchedulerSettings, Timings

GB = 10**9
_ids = iter(range(10**9))


def job(user: str, model: str, t: float, prompt: int = 100, max_tokens: int | None = 200, **kw) -> Job:
    return Job(f"j{next(_ids)}", user, model, t, prompt_tokens=prompt, max_tokens=max_tokens, stream=True, **kw)


def core(*backends: Backend, settings: SchedulerSettings | None = None) -> Scheduler:
    s = Scheduler(settings)
    for b in backends:
        s.set_backend(b)
    for user in ("u", "v", "w"):
        s.set_user(user, 1.0)
    return s


def teach(s: Scheduler, bid: int, model: str, rate: float, t: float, prompt: int = 1000) -> None:
    """One answer of 100 tokens at ``rate`` tokens/s on backend ``bid``, alone there."""
    j = job("w", model, t, prompt=prompt)
    assert s.submit(j, t) is None
    [d] = [d for d in s.dispatch(t) if d.job.id == j.id]
    assert d.backend_id == bid, d.record.to_dict()["score_components"]
    decode = 100 / rate
    s.complete(
        j.id,
        t + 1,
        prompt_tokens=prompt,
        completion_tokens=100,
        latency=0.1,
        duration=0.1 + decode,
        timings=Timings(load=0.0, prefill=prompt / (20 * rate), decode=decode),
    )


def h100_beside_another_gpu(sole: str, shared: str, rates: tuple[float, float], slots: int) -> Scheduler:
    """An H100 (1) with ``sole`` (only there) and ``shared`` resident, and a GPU (2) with ``shared`` and
    ``slots`` slots; each has answered ``shared`` once, alone, at its rate of ``rates``. Ollama-like:
    a runner per model, four slots each."""
    both, one = frozenset({sole, shared}), frozenset({shared})
    h100 = Backend(1, "h100", models=both, loaded_models=both, max_concurrent=12, parallel=4)
    other = Backend(2, "other", models=one, loaded_models=one, max_concurrent=slots, parallel=4)
    s = core(h100, other)
    teach(s, 1, shared, rates[0], 0)
    s.set_backend(dataclasses.replace(h100, enabled=False))
    teach(s, 2, shared, rates[1], 2)
    s.set_backend(h100)
    return s


def test_a_faster_gpu_with_a_stream_running_beats_an_idle_slow_one():
    """Defect 1: one request in flight cost 15 points, more than an H100 and an RTX 3060 were apart."""
    llama = frozenset({"llama3"})
    s = core(
        Backend(1, "h100", models=llama, loaded_models=llama, max_concurrent=4),
        Backend(2, "rtx3060", models=llama, loaded_models=llama, max_concurrent=4),
    )
    teach(s, 1, "llama3", 95.0, 0)
    s.set_backend(Backend(1, "h100", models=llama, loaded_models=llama, max_concurrent=4, enabled=False))
    teach(s, 2, "llama3", 30.0, 2)  # the 3060 answers once, with the H100 out of the way
    s.set_backend(Backend(1, "h100", models=llama, loaded_models=llama, max_concurrent=4))
    s.submit(busy := job("u", "llama3", 3), 3)
    assert [d.backend_id for d in s.dispatch(3)] == [1]
    s.submit(j := job("v", "llama3", 3.1), 3.1)
    [d] = s.dispatch(3.1)
    assert d.job.id == j.id and d.backend_id == 1, d.record.to_dict()["score_components"]
    parts = d.record.to_dict()["score_components"]
    assert parts["1"]["streams"] == 1 and parts["2"]["streams"] == 0
    assert parts["1"]["decode_rate"] == pytest.approx(95 / 1.2, rel=0.01)
    assert parts["2"]["decode_rate"] == pytest.approx(30, rel=0.01)
    assert s.is_running(busy.id)


def test_rates_are_learned_per_backend_and_model():
    """Defect 1: the H100's one average swung between 29 and 95 tok/s as 70B and 8B answers alternated."""
    both = frozenset({"llama3:8b", "llama3:70b"})
    s = core(Backend(1, "h100", models=both, loaded_models=both, max_concurrent=4))
    for i in range(4):
        teach(s, 1, "llama3:8b", 95.0, 10 * i)
        teach(s, 1, "llama3:70b", 29.0, 10 * i + 5)
    speeds = s.load(1).speeds
    assert speeds["llama3:8b"].decode == pytest.approx(95.0)
    assert speeds["llama3:70b"].decode == pytest.approx(29.0)
    assert speeds["llama3:8b"].prefill == pytest.approx(20 * 95.0)


def test_an_idle_resident_model_is_evicted_to_make_room_and_a_busy_one_is_not():
    """Defect 2: the RTX 4080 holding an idle coder never served the 8B model all run."""
    coder = frozenset({"coder"})
    models = frozenset({"coder", "llama3"})
    gpu = Backend(
        1,
        "rtx4080",
        models=models,
        loaded_models=coder,
        max_concurrent=4,
        vram_free=2 * GB,
        vram_total=16 * GB,
        model_vram={"llama3": 6 * GB},
        resident_vram={"coder": 10 * GB},
        model_sizes={"llama3": 5 * GB, "coder": 9 * GB},
    )
    s = core(gpu)
    s.submit(j := job("u", "llama3", 0), 0)
    [d] = s.dispatch(0)
    parts = d.record.to_dict()["score_components"]["1"]
    assert parts["evicts"] == ["coder"] and parts["start"] == pytest.approx(2.5)  # 5 GB at the default 2 GB/s
    assert parts["eviction"] == pytest.approx(4.5)
    s.complete(j.id, 5, prompt_tokens=100, completion_tokens=10)
    # With the coder busy, the 8B model does not fit.
    assert_no_room_beside_a_busy_coder(gpu)


def assert_no_room_beside_a_busy_coder(gpu: Backend) -> None:
    """With a coder job running on ``gpu``, an 8B job (``llama3``) does not fit there, and waits."""
    s = core(gpu)
    s.submit(c := job("u", "coder", 0), 0)
    assert [d.job.id for d in s.dispatch(0)] == [c.id]
    s.submit(job("v", "llama3", 1), 1)
    assert s.dispatch(1) == []
    assert REASONS["memory"] in s.router.classes.get(("llama3", Modality.CHAT, False)).closed[gpu.id]


def test_a_load_the_core_triggered_counts_at_once():
    """Defect 3: right after mr triggered a load it still scored that backend 'not loaded' until the next poll."""
    llama = frozenset({"llama3"})
    s = core(Backend(1, "gpu", models=llama, max_concurrent=4, model_sizes={"llama3": 20 * GB}))
    s.submit(job("u", "llama3", 0), 0)
    [first] = s.dispatch(0)
    assert first.record.to_dict()["score_components"]["1"]["start"] == pytest.approx(10.0)
    s.submit(job("v", "llama3", 4), 4)
    [second] = s.dispatch(4)
    assert second.record.to_dict()["score_components"]["1"]["start"] == pytest.approx(6.0)
    # A poll saying it is loaded replaces the expectation.
    s.set_backend(
        Backend(1, "gpu", models=llama, loaded_models=llama, max_concurrent=4, model_sizes={"llama3": 20 * GB})
    )
    assert s.load(1).loading == {}


def test_load_speed_is_learned_from_the_job_that_triggered_the_load_only():
    """A job that joined a load under way reports only the rest of it (Ollama's load_duration): not a load speed.

    Found with the simulator's lab-pool (issue 17): the H100 learned 4.8 GB/s where it loads at 3.3.
    """
    llama = frozenset({"llama3"})
    s = core(Backend(1, "gpu", models=llama, max_concurrent=4, model_sizes={"llama3": 20 * GB}))
    s.submit(first := job("u", "llama3", 0), 0)
    s.submit(second := job("v", "llama3", 5), 5)
    assert [d.job.id for d in s.dispatch(0) + s.dispatch(5)] == [first.id, second.id]
    for j, load, end in ((first, 10.0, 14.0), (second, 5.0, 15.0)):  # the load takes 10 s: 2 GB/s
        s.complete(j.id, end, prompt_tokens=100, completion_tokens=100, timings=Timings(load, 0.1, 3.9))
    assert s.load(1).load_bytes_per_second == pytest.approx(2 * GB)


def test_a_job_waits_for_the_gpu_with_its_model_rather_than_load_it_elsewhere():
    """Defect 3: 222 decisions sent a job to a backend that had to load the model while another had it and was full."""
    seventy = frozenset({"llama3:70b"})
    loaded = Backend(1, "h100", models=seventy, loaded_models=seventy, max_concurrent=1)
    cold = Backend(2, "a6000", models=seventy, max_concurrent=1, model_sizes={"llama3:70b": 40 * GB})
    s = core(loaded, cold)
    teach(s, 1, "llama3:70b", 30.0, 0)
    s.submit(running := job("u", "llama3:70b", 1, max_tokens=30), 1)
    assert [d.backend_id for d in s.dispatch(1)] == [1]
    s.submit(waiting := job("v", "llama3:70b", 1.5, max_tokens=30), 1.5)
    assert s.dispatch(1.5) == []  # a 20 s load elsewhere is worse than about a second's wait
    s.complete(running.id, 2.5, prompt_tokens=100, completion_tokens=30)
    [d] = s.dispatch(2.5)
    assert d.job.id == waiting.id and d.backend_id == 1
    # With many waiting, the free GPU is worth its load: work is not held back for ever.
    for i in range(30):
        s.submit(job("v", "llama3:70b", 3 + i * 0.01, max_tokens=30), 3)
    assert [d.backend_id for d in s.dispatch(3.5)] == [2]
    s.check()


def test_slots_are_per_loaded_model_where_the_engine_has_them():
    """Defect 4: Ollama's parallelism is per loaded model; embeddings waited for one of 4 slots behind chat streams."""
    models = frozenset({"llama3", "embed"})
    s = core(Backend(1, "ollama", models=models, loaded_models=models, max_concurrent=8, parallel=2))
    for i in range(4):
        s.submit(job("u", "llama3", i * 0.01), i * 0.01)
    assert len(s.dispatch(0.1)) == 2  # two per model, although eight fit the server
    s.submit(e := job("v", "embed", 0.2, modality=Modality.EMBEDDINGS, max_tokens=None), 0.2)
    assert [d.job.id for d in s.dispatch(0.2)] == [e.id]
    assert s.load(1).model_in_flight == {"llama3": 2, "embed": 1}
    assert REASONS["capacity"] in s.router.classes.get(("llama3", Modality.CHAT, False)).closed[1]
    s.check()


def test_max_loaded_models_leaves_room_only_by_evicting_an_idle_one():
    models = frozenset({"a", "b", "c"})
    ab = frozenset({"a", "b"})
    s = core(Backend(1, "ollama", models=models, loaded_models=ab, max_concurrent=8, max_loaded=2))
    s.submit(job("u", "a", 0), 0)
    s.submit(job("u", "b", 0), 0)
    assert len(s.dispatch(0)) == 2
    s.submit(job("v", "c", 1), 1)
    assert s.dispatch(1) == []
    assert REASONS["loaded"] in s.router.classes.get(("c", Modality.CHAT, False)).closed[1]


def test_a_job_that_can_run_elsewhere_leaves_the_only_home_of_queued_work_its_model_place():
    """Burst tails (issue 17): 8B streams kept the H100's model places busy while the 70B, only there, waited."""
    h100_models = frozenset({"llama3:8b", "coder", "llama3:70b"})
    resident = frozenset({"llama3:8b", "coder"})
    h100 = Backend(1, "h100", models=h100_models, loaded_models=resident, max_concurrent=12, parallel=4, max_loaded=2)
    rtx = Backend(
        2, "rtx4090", models=frozenset({"llama3:8b", "coder"}), loaded_models=frozenset({"llama3:8b"}), max_concurrent=4
    )
    # The price alone: placement would drain the 8B from the H100 for the 70B (tests/test_placement.py).
    s = core(h100, rtx, settings=SchedulerSettings(drain_margin=None))
    teach(s, 1, "llama3:8b", 95.0, 0)
    s.set_backend(dataclasses.replace(h100, enabled=False))
    teach(s, 2, "llama3:8b", 40.0, 2)  # the RTX answers once, with the H100 out of the way
    s.set_backend(h100)
    s.submit(job("w", "coder", 3), 3)  # the coder (resident on the H100 only) keeps its place busy
    assert [d.backend_id for d in s.dispatch(3)] == [1]
    s.submit(first := job("u", "llama3:8b", 4), 4)
    assert [d.backend_id for d in s.dispatch(4)] == [1]  # nothing needs the H100 alone yet: the faster GPU
    s.submit(seventy := job("v", "llama3:70b", 5), 5)
    assert s.dispatch(5) == []  # both places busy: the 70B waits for one to go idle
    assert REASONS["loaded"] in s.router.classes.get(("llama3:70b", Modality.CHAT, False)).closed[1]
    s.submit(second := job("u", "llama3:8b", 6), 6)
    [d] = s.dispatch(6)
    assert d.job.id == second.id and d.backend_id == 2, d.record.to_dict()["score_components"]
    parts = d.record.to_dict()["score_components"]
    assert parts["1"]["scarcity"] == pytest.approx(parts["1"]["prefill"] + parts["1"]["decode"], rel=0.01)
    assert parts["2"]["scarcity"] == 0
    s.complete(first.id, 7, prompt_tokens=100, completion_tokens=200)
    [d] = s.dispatch(7)  # the 8B place went idle and nothing took it: the 70B evicts it and loads
    assert d.job.id == seventy.id and d.backend_id == 1
    assert d.record.to_dict()["score_components"]["1"]["evicts"] == ["llama3:8b"]
    s.check()


def test_a_job_that_can_run_elsewhere_leaves_the_last_slot_to_work_that_cannot():
    """The same with slots: one free slot on the only backend a queued 70B has goes to the 70B."""
    both = frozenset({"llama3:8b", "llama3:70b"})
    h100 = Backend(1, "h100", models=both, loaded_models=both, max_concurrent=2)
    rtx = Backend(
        2, "rtx4090", models=frozenset({"llama3:8b"}), loaded_models=frozenset({"llama3:8b"}), max_concurrent=4
    )
    s = core(h100, rtx)
    s.set_user("v", 10.0)  # the 70B's user is served after the 8B's in this dispatch
    teach(s, 1, "llama3:8b", 95.0, 0)
    s.set_backend(dataclasses.replace(h100, enabled=False))
    teach(s, 2, "llama3:8b", 60.0, 2)  # the RTX answers once, with the H100 out of the way
    s.set_backend(h100)
    s.submit(job("w", "llama3:70b", 3), 3)
    assert [d.backend_id for d in s.dispatch(3)] == [1]
    s.submit(eight := job("u", "llama3:8b", 4), 4)
    s.submit(seventy := job("v", "llama3:70b", 4), 4)
    routes = {d.job.id: d.backend_id for d in s.dispatch(4)}
    assert routes == {eight.id: 2, seventy.id: 1}
    s.check()


def test_the_eviction_expected_is_the_one_ollama_makes_by_name_not_the_least_recently_used():
    """Ollama's findRunnerToUnload takes the first idle runner by keep_alive, then model path (issue 17)."""
    models = frozenset({"a", "b", "c"})
    s = core(Backend(1, "ollama", models=models, loaded_models=frozenset({"a", "b"}), max_concurrent=8, max_loaded=2))
    for model, t in (("b", 0.0), ("a", 2.0)):  # b is then the least recently used
        s.submit(j := job("u", model, t), t)
        assert [d.job.id for d in s.dispatch(t)] == [j.id]
        s.complete(j.id, t + 1, prompt_tokens=100, completion_tokens=10)
    s.submit(job("v", "c", 4), 4)
    [d] = s.dispatch(4)
    assert d.record.to_dict()["score_components"]["1"]["evicts"] == ["a"]


async def test_the_daemon_learns_a_backends_rate_per_model_from_ollamas_durations(daemon):
    """Through `mr serve`'s path: Ollama's eval_count / eval_duration teach the (backend, model) rate."""
    import openai

    from .fakes import FakeOllama

    async with FakeOllama(models=["llama3", "coder"], tokens_per_second=200, completion_tokens=20) as fake:
        await daemon.backend("ws1", fake.url, "ollama", max_concurrent=4)
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=await daemon.user("u"), max_retries=0)
        for _ in range(3):
            stream = await client.chat.completions.create(
                model="llama3", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            async for _chunk in stream:
                pass
        [row] = await daemon.admin("GET", "/admin/backends")
        speeds = row["model_speeds"]
        assert list(speeds) == ["llama3"] and speeds["llama3"]["answers"] == 3
        assert 150 < speeds["llama3"]["decode"] < 260, speeds  # 20 tokens paced at 200 a second


def test_a_gpu_new_to_a_model_is_expected_as_much_slower_as_it_is_on_the_models_it_served():
    """bench_pool (issue 17): 4,000-6,000-token coder prompts went to the RTX 3060 before it had answered one.

    An unlearned pair borrowed the H100's coder rates, so the 3060 looked as fast as the H100 alone
    and took four long prompts in a row (10-18 s to the first token, against 2-6 s on the 4090).
    It is 0.39x the H100 on the chat model both served: the same ratio is the better guess.
    """
    both = frozenset({"chat", "coder"})
    h100 = Backend(1, "h100", models=both, loaded_models=both, max_concurrent=8)
    rtx3060 = Backend(2, "rtx3060", models=both, loaded_models=both, max_concurrent=8)
    s = core(h100, rtx3060)
    teach(s, 1, "chat", 140.0, 0)
    teach(s, 1, "coder", 85.0, 2)
    s.set_backend(dataclasses.replace(h100, enabled=False))
    teach(s, 2, "chat", 55.0, 4)
    s.set_backend(dataclasses.replace(rtx3060, enabled=False))
    s.set_backend(h100)
    for i in range(2):
        s.submit(job("u", "chat", 6 + i / 10), 6 + i / 10)
    assert [d.backend_id for d in s.dispatch(6.2)] == [1, 1]
    s.set_backend(rtx3060)
    s.submit(j := job("v", "coder", 7, prompt=5000, max_tokens=250), 7)
    [d] = s.dispatch(7)
    parts = d.record.to_dict()["score_components"]
    assert d.job.id == j.id and d.backend_id == 1, parts
    assert parts["2"]["decode_rate"] == pytest.approx(85 * 55 / 140, rel=0.01)
    assert parts["2"]["prefill"] == pytest.approx(5000 / (20 * 85 * 55 / 140), rel=0.01)


def test_a_gpu_reading_older_than_the_model_list_does_not_make_room_that_is_gone():
    """bench_pool (issue 17): the 8B model went to an RTX 4080 whose busy coder left it no room.

    The GPU reading (mr agent) and the model list (Ollama's /api/ps) come from two polls. The
    reading still showed the 8B's 7 GB in use when the list already had the coder (11 GB) in
    its place, so 8.4 GB looked free: the 8B request waited in Ollama's queue for the busy coder
    to be evicted (60-100 s under the burst). What the resident models hold bounds what is free.
    """
    models = frozenset({"coder", "llama3", "embed"})
    gpu = Backend(
        1,
        "rtx4080",
        models=models,
        loaded_models=frozenset({"coder", "embed"}),
        max_concurrent=8,
        vram_free=int(8.4 * GB),  # read while the 8B model was still resident
        vram_total=16 * GB,
        model_vram={"llama3": 7 * GB},
        resident_vram={"coder": 11 * GB, "embed": int(0.6 * GB)},
    )
    assert_no_room_beside_a_busy_coder(gpu)


def test_a_job_that_can_run_elsewhere_waits_rather_than_time_share_the_only_home_of_running_work():
    """bench_pool (issue 17): under the burst every 8B or coder job sent to the H100 had it as its only open GPU.

    Its scarcity was not priced there (no other backend open), so 81 of them shared the H100 with
    a full batch of 70B streams, each halving their speed, while the 70B's queue in mr waited
    116-168 s. Where models time-share a GPU (per-model runners, Ollama), the streams it would
    slow are priced even then, and the job waits for the full GPU that would finish it nearly as soon.
    """
    s = h100_beside_another_gpu("llama3:70b", "llama3:8b", (95.0, 80.0), slots=1)  # a full RTX 4090
    for i in range(4):
        s.submit(job("v", "llama3:70b", 3 + i / 10), 3 + i / 10)
    s.submit(busy := job("w", "llama3:8b", 3.5), 3.5)
    assert sorted(d.backend_id for d in s.dispatch(3.5)) == [1, 1, 1, 1, 2]
    s.submit(j := job("u", "llama3:8b", 4), 4)
    assert s.dispatch(4) == []  # the H100 is open, but the 4090 finishes it nearly as soon
    s.complete(busy.id, 5, prompt_tokens=100, completion_tokens=100)
    [d] = s.dispatch(5)
    assert d.job.id == j.id and d.backend_id == 2
    s.check()


def test_work_with_no_other_home_is_charged_the_share_of_the_gpu_it_loses():
    """bench_pool (issue 17): in the steady phase long coder prompts left the H100 for a GPU far slower.

    A coder stream beside three 70B streams on the H100 (runners time-share the GPU) takes half
    of it while it runs: each 70B stream loses half this job's time there, not all of it. Charged
    all of it, the coder went to a GPU 6.7x slower than the H100 alone, and prefilled there for
    seconds. With two runners sharing, each 70B stream is charged half.
    """
    s = h100_beside_another_gpu("big", "coder", (100.0, 15.0), slots=4)  # an RTX 3060
    for i in range(3):
        s.submit(job("v", "big", 10 + i / 10), 10 + i / 10)
    assert [d.backend_id for d in s.dispatch(10.5)] == [1, 1, 1]
    s.submit(j := job("u", "coder", 11, prompt=4000), 11)
    [d] = s.dispatch(11)
    parts = d.record.to_dict()["score_components"]
    assert d.job.id == j.id and d.backend_id == 1, parts
    alone = parts["1"]["prefill"] + parts["1"]["decode"]
    assert parts["1"]["scarcity"] == pytest.approx(3 * alone / 2, rel=0.01)


def test_a_model_evicted_for_a_load_under_way_is_not_counted_as_fitting_beside_it():
    """Issue 31: right after the 8B was sent to the 16 GB RTX 4080, evicting the idle coder, a coder
    request was sent there, expected to load beside the loading 8B (6.5 + 11 GB > 16 GB).

    Ollama's ``/api/ps`` listed the coder, so it had no estimate among the models not loaded, only
    its ``size_vram``; the core took its need as unknown, and unknown fits. The coder waited, and
    six of its requests hit the first-byte timeout. What a load triggers counts at once: the loading
    model takes its estimate, the evicted one frees what it held, and needs as much to come back.
    """
    gpu = Backend(
        1,
        "rtx4080",
        models=frozenset({"coder", "llama3.1"}),
        loaded_models=frozenset({"coder"}),
        max_concurrent=8,
        parallel=4,
        vram_free=5 * GB,
        vram_total=16 * GB,
        model_vram={"llama3.1": int(6.5 * GB)},
        resident_vram={"coder": 11 * GB},
    )
    s = core(gpu)
    s.submit(j := job("u", "llama3.1", 0), 0)
    [d] = s.dispatch(0)
    assert d.job.id == j.id and d.record.candidates[0].evicts == ("coder",)
    s.submit(job("v", "coder", 1), 1)
    assert s.dispatch(1) == []
    assert REASONS["memory"] in s.router.classes.get(("coder", Modality.CHAT, False)).closed[gpu.id]
    s.check()
