"""Routing that prices the cached prefix (issue 31): a conversation's next turn goes where its history is.

Two identical Ollama-like backends (four slots each) that have answered at 50 tokens/s and read prompts at
1,000 tokens/s; each test is a decision driven through the core with explicit times.
"""

from __future__ import annotations

import dataclasses

from mindrouter.scheduler import Backend, Job, Scheduler, Timings, chain, message_chain

MODEL = "chat"
LOADED = frozenset({MODEL})
SYSTEM = ("app", "You are a helpful assistant.")
_ids = iter(range(10**9))


def backends(parallel: int = 4) -> tuple[Backend, Backend]:
    return tuple(  # type: ignore[return-value]
        Backend(i, f"ws{i}", models=LOADED, loaded_models=LOADED, max_concurrent=4, parallel=parallel) for i in (1, 2)
    )


def core(parallel: int = 4) -> Scheduler:
    s = Scheduler()
    for b in backends(parallel):
        s.set_backend(b)
    for user in ("u", "v", "w", "x"):
        s.set_user(user, 1.0)
    for bid in (1, 2):  # each answers once alone: 50 tokens/s, prompts at 1,000 tokens/s
        other = backends(parallel)[2 - bid]
        s.set_backend(dataclasses.replace(other, enabled=False))
        run(s, Job(f"t{bid}", "w", MODEL, 0.0, prompt_tokens=1000, max_tokens=100, stream=True), 0.0, bid, 100)
        s.set_backend(other)
    return s


def turn(user: str, conv: str, k: int, t: float, message: int = 3500, answer: int = 100) -> Job:
    """Turn ``k`` of conversation ``conv``: the system prompt, ``k`` earlier exchanges, a new message."""
    blocks: list[tuple[object, int]] = [(SYSTEM, 500)]
    for i in range(k):
        blocks += [((conv, i, "user"), message), ((conv, i, "assistant"), answer)]
    blocks.append(((conv, k, "user"), message))
    prefix = chain(blocks)
    return Job(f"j{next(_ids)}", user, MODEL, t, prompt_tokens=prefix[-1][1], max_tokens=answer, prefix=prefix)


def dispatch(s: Scheduler, job: Job, t: float):
    assert s.submit(job, t) is None
    [d] = [d for d in s.dispatch(t) if d.job.id == job.id]
    return d


def run(s: Scheduler, job: Job, t: float, expect: int | None = None, answer: int = 100, cached: int | None = None):
    """``job`` runs alone from ``t`` to its end; returns where it ran."""
    d = dispatch(s, job, t)
    assert expect is None or d.backend_id == expect, d.record.to_dict()["score_components"]
    s.complete(
        job.id,
        t + 1,
        prompt_tokens=job.prompt_tokens,
        completion_tokens=answer,
        latency=job.prompt_tokens / 1000,
        duration=job.prompt_tokens / 1000 + answer / 50,
        timings=Timings(load=0.0, prefill=job.prompt_tokens / 1000, decode=answer / 50),
        cached_tokens=cached,
    )
    return d


def cached_tokens(d) -> dict[str, int]:
    return {bid: row["cached_tokens"] for bid, row in d.record.to_dict()["score_components"].items()}


def busy(s: Scheduler, bid: int, streams: int, t: float) -> None:
    """``streams`` long one-shot answers start on backend ``bid`` (the other is disabled meanwhile)."""
    other = backends()[2 - bid]
    s.set_backend(dataclasses.replace(other, enabled=False))
    for _ in range(streams):
        dispatch(s, Job(f"b{next(_ids)}", "x", MODEL, t, prompt_tokens=100, max_tokens=2000), t)
    s.set_backend(other)


def test_the_second_turn_goes_back_to_the_backend_holding_its_history_though_that_one_is_busier():
    s = core()
    first = run(s, turn("u", "c", 0, 10.0), 10.0)
    home = first.backend_id
    busy(s, home, 1, 20.0)  # without the cache the idle backend would finish sooner
    d = dispatch(s, turn("u", "c", 1, 20.0), 20.0)
    assert cached_tokens(d) == {str(home): 4000, str(3 - home): 0}
    assert d.backend_id == home, d.record.to_dict()["score_components"]
    rows = d.record.to_dict()["score_components"]
    # 3,600 of 7,600 prompt tokens to read, at 1,000/s slowed 1.2x by the stream there; all 7,600 elsewhere
    assert (rows[str(home)]["prefill"], rows[str(3 - home)]["prefill"]) == (4.32, 7.6)


def test_the_second_turn_goes_elsewhere_when_its_backend_is_busy_enough_that_it_finishes_later():
    s = core()
    home = run(s, turn("u", "c", 0, 10.0), 10.0).backend_id
    busy(s, home, 3, 20.0)
    d = dispatch(s, turn("u", "c", 1, 20.0), 20.0)
    assert cached_tokens(d)[str(home)] == 4000
    assert d.backend_id == 3 - home, d.record.to_dict()["score_components"]


def test_without_its_history_anywhere_the_less_busy_backend_takes_it():
    """Control: the same turn with no prefix goes to the idle backend (the cache decided the first test)."""
    s = core()
    home = run(s, turn("u", "c", 0, 10.0), 10.0).backend_id
    busy(s, home, 1, 20.0)
    job = dataclasses.replace(turn("u", "c", 1, 20.0), prefix=())
    assert dispatch(s, job, 20.0).backend_id == 3 - home


def test_another_conversation_of_the_same_app_expects_the_shared_system_prompt():
    s = core()
    home = run(s, turn("u", "c", 0, 10.0), 10.0).backend_id
    d = dispatch(s, turn("v", "d", 0, 20.0), 20.0)
    assert cached_tokens(d) == {str(home): 500, str(3 - home): 0}


def test_a_slot_reused_by_another_conversation_no_longer_holds_the_first():
    """One slot (Ollama's default OLLAMA_NUM_PARALLEL): the next conversation there takes the slot."""
    s = core(parallel=1)
    home = run(s, turn("u", "c", 0, 10.0), 10.0).backend_id
    other = backends(1)[2 - home]
    s.set_backend(dataclasses.replace(other, enabled=False))
    run(s, Job("solo", "v", MODEL, 20.0, prompt_tokens=3000, max_tokens=100, prefix=chain([("other", 3000)])), 20.0)
    s.set_backend(other)
    assert cached_tokens(dispatch(s, turn("u", "c", 1, 30.0), 30.0)) == {"1": 0, "2": 0}


def test_an_unloaded_model_takes_its_cache_with_it():
    s = core()
    home = run(s, turn("u", "c", 0, 10.0), 10.0).backend_id
    s.set_backend(dataclasses.replace(backends()[home - 1], loaded_models=frozenset()))
    assert cached_tokens(dispatch(s, turn("u", "c", 1, 20.0), 20.0))[str(home)] == 0


def test_an_engine_reporting_less_cached_than_expected_corrects_the_estimate():
    """The engine found nothing of the shared system prompt: the other conversation's sequence is forgotten."""
    s = core()
    home = run(s, turn("u", "c", 0, 10.0), 10.0).backend_id
    run(s, turn("v", "d", 0, 20.0), 20.0, expect=home, cached=0)
    d = dispatch(s, turn("u", "c", 1, 30.0), 30.0)
    assert cached_tokens(d)[str(home)] == 500  # only what d's own turn left: the system prompt


def test_message_chains_share_blocks_exactly_as_far_as_their_messages_agree():
    system = {"role": "system", "content": "x" * 400}
    a = message_chain([system, {"role": "user", "content": "hello"}])
    b = message_chain([system, {"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}])
    c = message_chain([{"role": "system", "content": "y" * 400}, {"role": "user", "content": "hello"}])
    assert a == b[:2] and [tokens for _, tokens in b] == [100, 102, 103]
    assert a[0][0] != c[0][0] and a[1][0] != c[1][0]  # a block matches only after the same blocks


def test_why_shows_each_candidates_cached_tokens_and_says_the_loser_held_less_of_the_prompt():
    from rich.console import Console

    from mindrouter.cli.why import why_view

    s = core()
    home = run(s, turn("u", "c", 0, 10.0), 10.0).backend_id
    busy(s, home, 1, 20.0)
    record = dispatch(s, turn("u", "c", 1, 20.0), 20.0).record.to_dict()
    console = Console(width=160, record=True)
    console.print(why_view(record, {}))
    text = console.export_text()
    assert "cached tok" in text and "4,000" in text, text
    assert f"{3 - home} lost: less of the prompt is in its prompt cache" in text, text


def test_openai_usage_reads_the_cached_prompt_tokens():
    from mindrouter.backends._shapes import Usage, openai_usage

    usage = Usage()
    openai_usage({"prompt_tokens": 900, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 640}}, usage)
    assert (usage.prompt_tokens, usage.cached_tokens) == (900, 640)
    openai_usage({"prompt_tokens": 900, "prompt_tokens_details": {"cached_tokens": -3}}, usage)
    assert usage.cached_tokens is None  # not a count: unknown, and nothing is corrected


def test_the_correction_compares_parts_of_the_prompt_not_tokens_counted_two_ways():
    """The engine counts half the daemon's estimate: 240 of its 2,000 cached is about the 1/8 promised."""
    s = core()
    home = run(s, turn("u", "c", 0, 10.0), 10.0).backend_id
    job = turn("v", "d", 0, 20.0)  # 500 of its 4,000 estimated tokens expected cached: the system prompt
    d = dispatch(s, job, 20.0)
    assert d.backend_id == home
    s.complete(job.id, 21.0, prompt_tokens=2000, completion_tokens=100, cached_tokens=240)
    assert cached_tokens(dispatch(s, turn("u", "c", 1, 30.0), 30.0))[str(home)] == 4000


def _fresh_prefill(s: Scheduler, bid: int, t: float) -> float:
    """The prefill seconds the estimate gives backend ``bid`` for a new 1,000-token prompt nothing holds."""
    job = Job(f"p{next(_ids)}", "x", MODEL, t, prompt_tokens=1000, max_tokens=100, prefix=chain([(("new", t), 1000)]))
    rows = dispatch(s, job, t).record.to_dict()["score_components"]
    s.complete(job.id, t + 0.1, prompt_tokens=None, completion_tokens=None)
    return rows[str(bid)]["prefill"]


def second_turn_read(s: Scheduler, cached: int | None) -> int:
    """A conversation's second turn goes home and its engine reads only the 3,600 tokens not cached, at 1,000/s
    (``cached``: what its usage says it found, None where the engine does not say); returns home."""
    home = run(s, turn("u", "c", 0, 10.0), 10.0).backend_id
    job = turn("u", "c", 1, 20.0)
    assert dispatch(s, job, 20.0).backend_id == home
    computed = job.prompt_tokens - 4000
    s.complete(
        job.id,
        25.0,
        prompt_tokens=job.prompt_tokens,  # vLLM's usage and Ollama's prompt_eval_count count the cached part too
        completion_tokens=100,
        latency=computed / 1000,
        duration=computed / 1000 + 2.0,
        timings=Timings(load=0.0, prefill=computed / 1000, decode=2.0),
        cached_tokens=cached,
    )
    return home


def test_a_prompt_read_mostly_from_the_cache_does_not_teach_a_faster_prefill():
    """The engine read 3,600 of 7,600 tokens in 3.6 s: still 1,000 tokens/s, not 2,111. Taken as 2,111, a cache
    hit saved less than half the seconds it does, and turns left the replica holding their history."""
    s = core()
    home = second_turn_read(s, cached=4000)
    assert _fresh_prefill(s, home, 30.0) == 1.0


def test_where_the_engine_does_not_say_what_it_found_cached_the_expected_part_is_taken_as_cached():
    s = core()
    home = second_turn_read(s, cached=None)  # Ollama: prompt_eval_count is the whole prompt, the time the rest's
    assert _fresh_prefill(s, home, 30.0) == 1.0


def test_a_miss_on_a_token_bounded_cache_forgets_only_what_was_sent_before_the_lost_sequence():
    """vLLM frees its least recently used blocks first: conversation a's history was lost, so everything sent
    before it may be gone, but b's and c's, sent after it, are newer and still there. Forgetting them too,
    one miss in a burst made every conversation on that replica look uncached, and they scattered."""
    s = core(parallel=None)
    home = run(s, turn("u", "a", 0, 10.0), 10.0).backend_id
    other = backends(None)[2 - home]
    s.set_backend(dataclasses.replace(other, enabled=False))
    run(s, turn("v", "b", 0, 20.0), 20.0, expect=home)
    run(s, turn("w", "c", 0, 30.0), 30.0, expect=home)
    run(s, turn("u", "a", 1, 40.0), 40.0, expect=home, cached=0)  # the engine found none of a's history
    s.set_backend(other)
    assert cached_tokens(dispatch(s, turn("v", "b", 1, 50.0), 50.0))[str(home)] == 4000


def test_a_token_bounded_cache_counts_a_shared_system_prompt_once():
    """vLLM shares prefix blocks: five conversations behind one 4,000-token system prompt hold 4,000 + 5 x 1,000
    tokens of KV, not 5 x 5,000. Counted once a sequence, the estimate forgot the first three in a cache of
    10,000 tokens that holds all five, and their next turns were taken as uncached everywhere."""
    from mindrouter.scheduler.routing.prefixes import Prefixes

    shelves = Prefixes()
    convs = [chain([(SYSTEM, 4000), (("conv", i), 1000)]) for i in range(5)]
    for i, prefix in enumerate(convs):
        shelves.sent(f"j{i}", 1, MODEL, prefix, None, 10_000)
    assert [shelves.cached(1, MODEL, prefix) for prefix in convs] == [5000] * 5
    shelves.sent("j5", 1, MODEL, chain([(SYSTEM, 4000), (("conv", 5), 2000)]), None, 10_000)  # 11,000: one goes
    assert [shelves.cached(1, MODEL, prefix) for prefix in convs] == [4000] + [5000] * 4
