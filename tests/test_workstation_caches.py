"""Prompt caches as the engines keep them (``mindrouter.simulate.workstation.caches``), stepped by hand.

llama-server (which Ollama runs): a request takes the free slot holding the most of its prompt
(over 10%), else the least recently used one, whose sequence goes to host memory first; vLLM:
whole blocks of 16 tokens, chained, at most ``prompt - 1`` tokens, freed tails evicted first.
"""

from __future__ import annotations

from mindrouter.simulate.workstation.caches import BlockCache, SlotCache
from mindrouter.simulate.workstation.prompts import Prompt, Segment, block_hashes, common_prefix

SYSTEM = Segment(("app", "webui"), 1000)


def turn(conv: str, k: int, message: int = 100, answer: int = 200) -> Prompt:
    """Turn ``k`` of conversation ``conv``: the system prompt, k earlier exchanges, a new message."""
    segs = [SYSTEM]
    for i in range(k):
        segs += [Segment((conv, i, "user"), message), Segment((conv, i, "assistant"), answer)]
    return Prompt((*segs, Segment((conv, k, "user"), message)))


def after(prompt: Prompt, conv: str, k: int, answer: int = 200) -> tuple[Segment, ...]:
    return (*prompt.segments, Segment((conv, k, "assistant"), answer))


def test_common_prefix_stops_at_the_first_difference_and_inside_a_segment_cut_short():
    a = (SYSTEM, Segment("x", 50), Segment("y", 10))
    assert common_prefix(a, (SYSTEM, Segment("x", 50), Segment("z", 10))) == 1050
    assert common_prefix(a, (SYSTEM, Segment("x", 20))) == 1020  # an answer cut short is a prefix of the whole
    assert common_prefix(a, (Segment("other", 1000),)) == 0


def test_block_hashes_chain_so_a_block_matches_only_after_the_same_prefix():
    one = block_hashes((Segment("s", 40), Segment("a", 24)))
    two = block_hashes((Segment("s", 40), Segment("b", 24)))
    three = block_hashes((Segment("t", 40), Segment("a", 24)))
    assert len(one) == 4 and one[:2] == two[:2] and one[2:] != two[2:]  # blocks 0-1 inside "s", 2 straddles
    assert not set(one) & set(three)  # "a" after another prefix is other KV


def test_the_next_turn_takes_the_slot_holding_its_history_and_prefills_only_the_new_message():
    cache = SlotCache(2, host_tokens=0)
    first = turn("c1", 0)
    slot, cached = cache.take(first, 0.0)
    assert cached == 0
    cache.release(slot, after(first, "c1", 0), 1.0)
    other = turn("c2", 0)  # the other conversation shares only the system prompt: 1000 / 1100 > 10%
    slot2, cached2 = cache.take(other, 2.0)
    assert slot2 == slot and cached2 == 1000  # the slot holding the most of it, though c1 wanted it too
    cache.release(slot2, after(other, "c2", 0), 3.0)
    second = turn("c1", 1)
    slot3, cached3 = cache.take(second, 4.0)
    assert cached3 == 1000  # c1's history went with the slot c2 took
    cache.release(slot3, after(second, "c1", 1), 5.0)
    third = turn("c1", 2)
    assert cache.take(third, 6.0)[1] == third.tokens - 100  # all but the new message


def test_a_prompt_held_whole_still_computes_one_token():
    cache = SlotCache(1, host_tokens=0)
    p = Prompt((SYSTEM,))
    cache.release(cache.take(p, 0.0)[0], p.segments, 1.0)
    assert cache.take(p, 2.0)[1] == 999


def test_without_a_similar_slot_the_least_recently_used_one_is_taken_and_saved_to_host_memory():
    cache = SlotCache(2, host_tokens=100_000)
    a, b = Prompt.single("a", 500), Prompt.single("b", 500)
    sa, _ = cache.take(a, 0.0)
    sb, _ = cache.take(b, 0.0)
    assert sa != sb
    cache.release(sa, a.segments, 1.0)
    cache.release(sb, b.segments, 2.0)
    c = Prompt.single("c", 500)
    sc, cached = cache.take(c, 3.0)
    assert sc == sa and cached == 0  # a's slot was used least recently
    assert cache.host == [Prompt(a.segments)]  # and a went to host memory
    cache.release(sc, c.segments, 4.0)
    again = Prompt((*a.segments, Segment("more", 100)))
    slot, cached = cache.take(again, 5.0)
    assert slot == sb and cached == 500  # b's slot, least recent now, loads a's sequence back from host memory
    assert Prompt(b.segments) in cache.host


def test_host_memory_drops_its_oldest_sequences_past_its_size():
    cache = SlotCache(1, host_tokens=1000)
    for name in "abc":
        p = Prompt.single(name, 600)
        cache.release(cache.take(p, 0.0)[0], p.segments, 1.0)
    assert cache.host == [Prompt(Prompt.single("b", 600).segments)]  # a saved, then dropped for b


def test_vllm_blocks_hit_from_the_first_until_one_is_missing_and_never_the_last_token():
    cache = BlockCache(None)
    first = turn("c1", 0)  # 1100 tokens: 68 whole blocks
    held, cached = cache.take(first)
    assert cached == 0 and len(held) == 68
    cache.release(held, after(first, "c1", 0))
    second = turn("c1", 1)  # 1400 tokens: everything but the new message is there
    _, cached2 = cache.take(second)
    assert cached2 == (1300 // 16) * 16  # 1296: the block straddling the new message is not
    other = turn("c2", 0)
    assert cache.take(other)[1] == (1000 // 16) * 16  # the shared system prompt, while c1 still holds it
    exact = Prompt((Segment("z", 32),))
    cache.release(*[cache.take(exact)[0], exact.segments])
    assert cache.take(exact)[1] == 16  # 32 cached, but the last token is computed: one block of 16


def test_vllm_evicts_the_oldest_freed_blocks_tails_first():
    cache = BlockCache(capacity=10)
    a = Prompt.single("a", 160)  # 10 blocks: the cache is full once a ends
    cache.release(cache.take(a)[0], a.segments)
    b = Prompt.single("b", 48)  # 3 new blocks: a's last 3 go, a's prefix stays
    held, _ = cache.take(b)
    cache.release(held, b.segments)
    again = Prompt.single("a", 160)
    assert cache.take(again)[1] == 7 * 16
