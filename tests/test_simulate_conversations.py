"""Conversations in scenarios: turns that resend the history behind an app's system prompt, and what the
backends' prompt caches spare of them, in ``mr simulate`` and in the workload a live replay sends."""

from __future__ import annotations

import random

import pytest

from mindrouter.simulate import ScenarioError, arrivals, build, parse_scenario, simulate
from mindrouter.simulate.workload import draw_conversation, expected_sizes

TALK = """
duration = 900
seed = 5

[apps.webui]
system_prompt = 1500

[models.m]
size = 4
vram = 6

[[backends]]
name = "ws"
models = ["m"]
max_concurrent = 4
parallel = 4
tokens_per_second = 50
prefill_tokens_per_second = 2000
vram = 24
{backend}

[[users]]
name = "alice"
model = "m"
app = "webui"
rate = 0.02
turns = [2, 6]
think_time = [5, 20]
prompt_tokens = [50, 200]
completion_tokens = [100, 300]
"""


def scenario(backend: str = "", user: str = "") -> str:
    """``TALK`` with more lines for its backend and its user."""
    return TALK.format(backend=backend) + user


def test_a_conversations_later_turns_resend_its_history_and_find_it_in_the_slot_cache():
    """Seed 5: 58 later turns, 44 find their whole history; the other 14 only the system prompt, their slot
    having gone to a new conversation that shares the system prompt (llama-server's similarity rule
    prefers it to an empty slot, and keeping 70% of the sequence, it saves nothing to host memory)."""
    run = simulate(parse_scenario(scenario()), trace=True)
    assert run.trace is not None
    later = [t for t in run.trace if t.turn]
    first = [t for t in run.trace if not t.turn]
    assert len(first) >= 10 and len(later) > len(first)
    for t in run.trace:
        assert t.conversation is not None and t.prompt == t.conversation.prompt_tokens(t.turn)
    whole = [t for t in later if t.cached == t.prompt - t.conversation.turns[t.turn].message]  # type: ignore[union-attr]
    assert (len(later), len(whole)) == (58, 44)
    assert all(t.cached >= 1500 for t in later) and all(t.cached == 1500 for t in first[2:])
    result = build(run)
    model = result["models"]["m"]
    assert model["prompt_tokens_computed"] == sum(t.prompt - t.cached for t in run.trace if t.done is not None)
    assert result["prompt_cache"]["computed_over_sent"] < 0.2
    assert model["later_turn_ttft_p95"] < model["ttft_p95"]


def test_a_server_that_caches_nothing_computes_every_prompt_token():
    text = scenario().replace("vram = 24\n", 'engine = "openai"\n').replace("size = 4\nvram = 6\n", "")
    result = build(simulate(parse_scenario(text)))
    assert result["prompt_cache"]["computed"] == result["prompt_cache"]["sent"] > 0


def test_the_listing_of_a_replay_holds_the_conversations_the_simulator_sends():
    sc = parse_scenario(scenario())
    listed = arrivals(sc)
    run = simulate(sc, trace=True)
    assert run.trace is not None
    opened = [t for t in run.trace if not t.turn]
    assert [(a.at, a.prompt_tokens) for a in listed] == [(t.submitted, t.prompt) for t in opened]
    assert [a.conversation for a in listed] == [t.conversation for t in opened]
    conv = listed[0].conversation
    assert conv is not None and conv.system == 1500 and conv.turns[0].think == 0
    assert all(5 <= turn.think <= 20 for turn in conv.turns[1:])


def test_a_phases_requests_count_its_conversations():
    run = simulate(parse_scenario(scenario(user="requests = 3\n")), trace=True)
    assert run.trace is not None and len({t.conversation for t in run.trace}) == 3


def test_the_mean_prompt_of_a_conversations_requests_counts_the_history():
    sc = parse_scenario(scenario())
    spec = sc.users[0]
    rng = random.Random(1)
    prompts = []
    for n in range(20000):
        conv = draw_conversation(spec, rng, str(n), 1500)
        prompts += [conv.prompt_tokens(k) for k in range(len(conv.turns))]
    mean, _ = expected_sizes(spec, 1500)
    assert sum(prompts) / len(prompts) == pytest.approx(mean, rel=0.01)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.replace('app = "webui"', 'app = "chat"'), "app 'chat' is not under [apps]"),
        (lambda t: t.replace("turns = [2, 6]", "turns = 0"), "turns must be at least 1"),
        (lambda t: t.replace("think_time = [5, 20]", "think_time = [20, 5]"), "min <= max"),
        (
            lambda t: t.replace('app = "webui"\n', "").replace("turns = [2, 6]\n", ""),
            "think_time only applies to a closed-loop user",
        ),
        (lambda t: t.replace("vram = 24", 'vram = 24\nengine = "vllm"'), 'it needs engine = "ollama"'),
        (lambda t: t.replace("vram = 24", "vram = 24\nkv_cache_tokens = 100"), 'it needs engine = "vllm"'),
        (lambda t: t.replace("vram = 24", 'vram = 24\nsharing = "fair"'), "sharing must be one of"),
        (lambda t: t.replace("vram = 24", 'vram = 24\nengine = "tgi"'), "engine must be one of"),
    ],
)
def test_conversation_and_engine_keys_are_checked(change, message):
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_scenario(change(scenario()))
