"""Where a prompt's reading stalls every decoding stream (vLLM's chunked prefill), a cache miss costs them all.

vLLM fills each step's token budget with one token of every decoding stream, then prompt tokens, so while a
prompt is read the batch's streams wait for it: a turn sent away from the replica holding its history makes
every stream there wait for the whole history's prefill. Priced as one more stream's 5%, that cost was
invisible, and mindrouter computed 0.45 of the prompt tokens sent on four replicas where an SGLang-style
cache-aware router computed 0.29 (issue 31). Two identical vLLM-like backends (batch slowdown 0.05, answers at
50 tokens/s, prompts read at 1,000 tokens/s); each test drives the core with explicit times.
"""

from __future__ import annotations

import dataclasses

from mindrouter.scheduler import Backend, Job, Scheduler, chain

MODEL = "chat"
LOADED = frozenset({MODEL})
_ids = iter(range(10**9))


def backend(bid: int, stalls: bool = True) -> Backend:
    return Backend(bid, f"vllm{bid}", models=LOADED, loaded_models=LOADED, max_concurrent=64, prefill_stalls=stalls)


def core(stalls: bool = True) -> Scheduler:
    s = Scheduler()
    s.set_user("u", 1.0)
    s.set_user("x", 1.0)
    for bid in (1, 2):  # each answers once alone: 50 tokens/s, prompts at 1,000 tokens/s; slowdown 0.05 a stream
        s.set_backend(dataclasses.replace(backend(bid, stalls), enabled=False))
    for bid in (1, 2):
        s.set_backend(backend(bid, stalls))
        s.set_backend(dataclasses.replace(backend(3 - bid, stalls), enabled=False))
        job = Job(f"t{bid}", "x", MODEL, 0.0, prompt_tokens=1000, max_tokens=100, stream=True)
        assert s.submit(job, 0.0) is None and s.dispatch(0.0)
        s.complete(job.id, 3.0, prompt_tokens=1000, completion_tokens=100, latency=1.0, duration=3.0)
        s.set_backend(backend(3 - bid, stalls))
    for bid in (1, 2):
        load = s.router._loads[bid]
        load.slowdown = 0.05
    return s


def dispatch(s: Scheduler, job: Job, t: float):
    assert s.submit(job, t) is None
    [d] = [d for d in s.dispatch(t) if d.job.id == job.id]
    return d


def busy(s: Scheduler, bid: int, streams: int, t: float) -> None:
    """``streams`` long answers start on backend ``bid`` (the other is disabled meanwhile)."""
    other = s.router.backend(3 - bid)
    assert other is not None
    s.set_backend(dataclasses.replace(other, enabled=False))
    for _ in range(streams):
        dispatch(s, Job(f"b{next(_ids)}", "x", MODEL, t, prompt_tokens=100, max_tokens=2000), t)
    s.set_backend(other)


HISTORY = chain([("system", 1000), ("turn 1", 1000)])


def test_a_turn_goes_back_to_the_replica_holding_its_history_though_it_runs_more_streams():
    """Home runs 40 streams, the other 8: 2,000 tokens more to read elsewhere stall its 8 streams 2 s each
    (16 s), more than home's 32 more streams cost this turn's answer and the streams beside it (about 11 s)."""
    s = core()
    busy(s, 1, 40, 10.0)
    busy(s, 2, 8, 10.0)
    first = Job("c1", "u", MODEL, 10.0, prompt_tokens=2000, max_tokens=100, prefix=HISTORY)
    s.set_backend(dataclasses.replace(backend(2), enabled=False))
    dispatch(s, first, 10.0)
    s.complete(first.id, 12.0, prompt_tokens=None, completion_tokens=None)
    s.set_backend(backend(2))
    turn = Job("c2", "u", MODEL, 20.0, prompt_tokens=2200, max_tokens=100, prefix=(*HISTORY, (7, 2200)))
    d = dispatch(s, turn, 20.0)
    rows = d.record.to_dict()["score_components"]
    assert (rows["1"]["cached_tokens"], rows["2"]["cached_tokens"]) == (2000, 0)
    assert d.backend_id == 1, rows
    assert rows["2"]["delay"] > 8 * 2.2, rows  # each of its 8 streams waits for the 2,200 tokens' reading


def test_where_prompts_do_not_stall_decoding_the_less_busy_backend_takes_it():
    """Control: the same pool as Ollama-like servers (a prompt read slows the others as one more stream)."""
    s = core(stalls=False)
    busy(s, 1, 40, 10.0)
    busy(s, 2, 8, 10.0)
    first = Job("c1", "u", MODEL, 10.0, prompt_tokens=2000, max_tokens=100, prefix=HISTORY)
    s.set_backend(dataclasses.replace(backend(2, False), enabled=False))
    dispatch(s, first, 10.0)
    s.complete(first.id, 12.0, prompt_tokens=None, completion_tokens=None)
    s.set_backend(backend(2, False))
    turn = Job("c2", "u", MODEL, 20.0, prompt_tokens=2200, max_tokens=100, prefix=(*HISTORY, (7, 2200)))
    assert dispatch(s, turn, 20.0).backend_id == 2


def test_others_prompts_read_while_a_stream_decoded_do_not_teach_a_slower_decode():
    """A stream wrote 100 tokens in 2 s of its own, and waited 2 s more while 2,000 tokens of another prompt
    sent there were read: its backend still decodes at 50 tokens/s, not 25."""
    s = core()
    s.set_backend(dataclasses.replace(backend(2), enabled=False))
    long = Job("long", "u", MODEL, 10.0, prompt_tokens=100, max_tokens=100, stream=True)
    dispatch(s, long, 10.0)
    other = Job("other", "x", MODEL, 10.5, prompt_tokens=2000, max_tokens=100, stream=True)
    dispatch(s, other, 10.5)
    s.complete(long.id, 14.1, prompt_tokens=100, completion_tokens=100, latency=0.1, duration=4.1)
    speed = s.router._loads[1].speeds[MODEL]
    assert speed.decode is not None and speed.decode > 49, speed  # 45.2 taught by 25 tokens/s


def test_a_prompt_goes_where_fewer_prompts_wait_to_be_read_before_it():
    """8,000 tokens were sent to backend 1 a second ago (8 s of reading, 7 left): a new prompt there would be
    read after them, so it goes to backend 2 although that one runs two streams to backend 1's one."""
    s = core()
    s.set_backend(dataclasses.replace(backend(2), enabled=False))
    dispatch(s, Job("big", "x", MODEL, 10.0, prompt_tokens=8000, max_tokens=100, prefix=chain([("big", 8000)])), 10.0)
    s.set_backend(backend(2))
    busy(s, 2, 2, 10.0)
    d = dispatch(s, Job("new", "u", MODEL, 11.0, prompt_tokens=500, max_tokens=100), 11.0)
    rows = d.record.to_dict()["score_components"]
    assert d.backend_id == 2, rows
    assert rows["1"]["prefill"] == 7.5, rows  # 7 s of the big prompt left, then its own 0.5 s


def test_the_prompts_a_job_was_read_behind_do_not_teach_a_slower_prefill():
    """Sent behind 4 s of another prompt's reading, a 1,000-token prompt's first byte came after 5 s: its
    backend still reads 1,000 tokens/s, not 200."""
    s = core()
    s.set_backend(dataclasses.replace(backend(2), enabled=False))
    dispatch(s, Job("big", "x", MODEL, 10.0, prompt_tokens=4000, max_tokens=100, prefix=chain([("big", 4000)])), 10.0)
    job = Job("late", "u", MODEL, 10.0, prompt_tokens=1000, max_tokens=100, stream=True)
    dispatch(s, job, 10.0)
    s.complete(job.id, 17.0, prompt_tokens=1000, completion_tokens=100, latency=5.0, duration=7.0)
    speed = s.router._loads[1].speeds[MODEL]
    assert speed.prefill is not None and speed.prefill > 900, speed


def test_a_prompt_whose_job_ended_is_no_longer_waited_for():
    """The 8,000-token prompt's job ended a second after it was sent (its prompt was read faster than the rate
    learned said): nothing is left to read before a new prompt there. Without the bound, a prefill rate
    learned too low piled up a backlog no job held, 12 s on every replica in a live run."""
    s = core()
    s.set_backend(dataclasses.replace(backend(2), enabled=False))
    big = Job("big", "x", MODEL, 10.0, prompt_tokens=8000, max_tokens=100, prefix=chain([("big", 8000)]))
    dispatch(s, big, 10.0)
    s.complete(big.id, 11.0, prompt_tokens=None, completion_tokens=None)
    d = dispatch(s, Job("new", "u", MODEL, 11.5, prompt_tokens=500, max_tokens=100), 11.5)
    assert d.record.to_dict()["score_components"]["1"]["prefill"] == 0.5


def test_vllm_and_llamacpp_backends_are_taken_to_stall_decoding_while_they_read_a_prompt():
    """vLLM's V1 engine schedules chunked prefill by default; llama-server puts a prompt's chunk in the step of
    the slots decoding beside it (measured: benchmarks/bench_prefill_stall.py); an OpenAI-compatible server says
    nothing, and Ollama, whose runner does the same, is not taken so yet (docs/performance.md)."""
    from types import SimpleNamespace

    from mindrouter.backends import Probe
    from mindrouter.daemon.pollers.snapshot import backend_snapshot

    probe = Probe(healthy=True, models=LOADED, loaded_models=LOADED)
    stalls = {}
    for engine in ("vllm", "openai", "ollama", "llamacpp"):
        row = SimpleNamespace(
            id=1,
            name="b",
            engine=engine,
            max_concurrent=8,
            priority=0.0,
            state="enabled",
            parallel=None,
            max_loaded=None,
        )
        stalls[engine] = backend_snapshot(row, probe, {}, None, None, healthy=True).prefill_stalls
    assert stalls == {"vllm": True, "openai": False, "ollama": False, "llamacpp": True}
