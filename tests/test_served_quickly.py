"""Issue 30: a person next to batch work is served request by request, not only over minutes.

The core keeps a slot that a recently active person's request freed (a learned think time under
``max_think_time``) while the backlogged user who would take it already runs its weighted share of
that backend's slots; each request answers the oldest end of its person's jobs not yet answered,
so 4 loops learn each loop's think time. Before: chat-next-to-batch gave chat 2.6% of the service
units and a median wait of 67 s for each 2.4 s answer; agent-loops gave the agent 3.7%.
"""

from __future__ import annotations

import dataclasses

import pytest

from mindrouter.scheduler import Backend, Job, Scheduler, SchedulerSettings
from mindrouter.simulate import Scenario, build, load_example, parse_scenario, simulate

SETTINGS = SchedulerSettings(prompt_token_cost=1, completion_token_cost=1)


def job(user: str, jid: str, t: float, prompt: int = 100) -> Job:
    return Job(id=jid, user_id=user, model="llama3", prompt_tokens=prompt, submitted_at=t)


def two_slots(settings: SchedulerSettings = SETTINGS) -> Scheduler:
    s = Scheduler(settings)
    s.set_user("batch", 1.0)
    s.set_user("chat", 1.0)
    s.set_backend(Backend(id="gpu", name="gpu", models=frozenset({"llama3"}), max_concurrent=2))
    return s


def started(s: Scheduler, now: float) -> list[str]:
    out = [d.job.id for d in s.dispatch(now)]
    s.check()
    return out


def chat_learns_to_read(s: Scheduler) -> None:
    """batch (which used 2,000 units just before) keeps 4 long answers queued; chat's first answer ends at 2 s
    and its second question comes 3 s later. Its think time is not known yet: the slot is kept for it (up to
    ``max_think_time``) and its question starts at once; with ``max_think_time = 0`` b1 takes the slot and
    chat waits for b0's end at 10 s (before issue 30's prior, it waited so either way)."""
    kept = s.settings.max_think_time > 0
    s.add_usage("batch", 1000, 1000, 0.0, "llama3")
    for i in range(4):
        assert s.submit(job("batch", f"b{i}", 0.0), 0.0) is None
    assert s.submit(job("chat", "c0", 0.0), 0.0) is None
    assert sorted(started(s, 0.0)) == ["b0", "c0"]
    assert s.complete("c0", 2.0, prompt_tokens=100, completion_tokens=100)
    assert started(s, 2.0) == ([] if kept else ["b1"])
    assert s.submit(job("chat", "c1", 5.0), 5.0) is None
    assert started(s, 5.0) == (["c1"] if kept else [])
    assert s.complete("b0", 10.0, prompt_tokens=100, completion_tokens=1000)
    assert started(s, 10.0) == (["b1"] if kept else ["c1"])


def reads(s: Scheduler, questions: int) -> list[tuple[list[str], list[str]]]:
    """chat asks ``questions`` more questions, reading 3 s after each 2 s answer; returns, per answer, what
    started when it ended and when chat's next question came."""
    out = []
    t = 10.0
    for i in range(2, questions + 2):
        t += 2.0
        assert s.complete(f"c{i - 1}", t, prompt_tokens=100, completion_tokens=100)
        freed = started(s, t)
        t += 3.0
        assert s.submit(job("chat", f"c{i}", t), t) is None
        out.append((freed, started(s, t)))
    return out


def test_the_slot_a_reader_freed_is_kept_while_batch_runs_its_share():
    """batch runs 1 of 2 slots, its share: once chat's think time is known (3 s), the slot its answers free
    waits for its next question."""
    s = two_slots()
    chat_learns_to_read(s)
    assert reads(s, 3) == [([], ["c2"]), ([], ["c3"]), ([], ["c4"])]
    load = s.load("gpu")
    assert load is not None and (load.in_flight, load.held) == (2, 0)
    (pool,) = s.turns.fair.pools.values()
    assert pool.seats["chat"].think == pytest.approx(3.0)


def test_without_max_think_time_the_batch_user_takes_the_slot():
    """The same run with ``max_think_time = 0``: the slot goes to batch, and chat waits for a batch answer."""
    s = two_slots(dataclasses.replace(SETTINGS, max_think_time=0.0))
    chat_learns_to_read(s)
    assert s.complete("c1", 12.0, prompt_tokens=100, completion_tokens=100)
    assert started(s, 12.0) == ["b2"]


def test_a_slot_is_not_kept_from_a_user_below_its_share():
    """batch runs nothing on the backend when chat's answer ends (its answer ended first): it is owed a slot,
    so the freed slot goes to it at once."""
    s = two_slots()
    for i in range(4):
        assert s.submit(job("batch", f"b{i}", 0.0), 0.0) is None
    assert s.submit(job("chat", "c0", 0.0), 0.0) is None
    assert started(s, 0.0) == ["b0", "c0"]
    assert s.complete("b0", 1.0, prompt_tokens=100, completion_tokens=100)
    assert s.complete("c0", 1.0, prompt_tokens=100, completion_tokens=100)
    assert sorted(started(s, 1.0)) == ["b1", "b2"]
    load = s.load("gpu")
    assert load is not None and load.held == 0


def test_max_think_time_must_be_a_finite_number_of_seconds():
    with pytest.raises(ValueError, match="max_think_time"):
        SchedulerSettings(max_think_time=float("nan"))


def chat_next_to_batch(slots: int) -> Scenario:
    sc = load_example("chat-next-to-batch")
    return sc.replace(backends=tuple(dataclasses.replace(b, max_concurrent=slots) for b in sc.backends))


@pytest.mark.parametrize(("slots", "least"), [(2, 0.25), (4, 0.17)])
def test_a_person_chatting_next_to_batch_is_served_in_seconds(slots, least):
    """Case 1: chat's median wait is at most 3x its own 2.4 s answer, and it gets at least 25% of the units
    on 2 slots (2.6% before), and on 4 slots its target less 3 points (its demand is a fifth of them)."""
    result = build(simulate(chat_next_to_batch(slots)))
    chat = next(u for u in result["users"] if u["name"] == "chat")
    assert chat["wait_p50"] <= 3 * 2.4, chat
    assert chat["service_share"] >= least, chat
    assert chat["service_share"] >= chat["target_share"] - 0.03, chat


def test_on_4_slots_the_slot_a_first_answer_freed_is_kept_for_the_next_question():
    """batch's 4 answers, started together at 0 s while it was alone, end together at 72.4 s: chat takes
    one slot, batch 3, and batch's fourth waits. Chat's first answer ended before its think time was
    known, so its slot went to batch's fourth (72 s) and chat's second question, 3 s later, waited
    67.0 s: 17.9% of the units against a target of 20.6%, 2.8 points off over the run. A person whose
    think time is not known yet is now kept a slot for up to ``max_think_time``: 18.6% against 20.0%.

    25% (the issue's figure) is more than chat asks for: after its first wait every one of its
    questions starts at once (320 in 1,800 s, one each 5.4 s), so a scheduler gives it more only by
    leaving more of batch's slots idle."""
    from .test_simulate_examples import misses

    run = simulate(chat_next_to_batch(4), trace=True)
    assert run.trace is not None
    chat = run.users.index(next(u for u in run.users if u.name == "chat"))
    waits = [r.dispatched - r.submitted for r in run.trace if r.user == chat and r.dispatched is not None]
    assert waits[0] == pytest.approx(67.4, abs=0.1)
    assert max(waits[1:]) == 0.0, waits[:4]
    result = build(run)
    assert not misses(result), misses(result)
    share = next(u for u in result["users"] if u["name"] == "chat")
    assert share["requests"] >= 319 and share["wait_p50"] == 0.0, share


def agent_loops(think: float, max_tokens: int | None) -> Scenario:
    sc = load_example("agent-loops").replace(duration=300)
    users = tuple(
        dataclasses.replace(u, think_time=(think, think), max_tokens=max_tokens) if u.name == "agent" else u
        for u in sc.users
    )
    return sc.replace(users=users)


@pytest.mark.parametrize("max_tokens", [None, 2])
@pytest.mark.parametrize(("think", "least"), [(0.09, 0.40), (0.2, 0.28)])
def test_an_agent_s_loops_get_their_share(think, least, max_tokens):
    """Case 3: 4 loops of tiny requests next to batch on 8 slots get their share, declared max_tokens or not
    (0.2 s between requests: 3.7% before, each loop's think time learned as the last loop's gap)."""
    result = build(simulate(agent_loops(think, max_tokens)))
    agent = next(u for u in result["users"] if u["name"] == "agent")
    assert agent["service_share"] >= least, agent
    assert agent["service_share"] >= agent["target_share"] - 0.02, agent


def test_a_hold_costs_the_batch_user_only_what_is_above_its_share():
    """chat-next-to-batch on 2 slots: batch never runs fewer than 1 slot once both work."""
    result = build(simulate(chat_next_to_batch(2)))
    batch = next(u for u in result["users"] if u["name"] == "batch")
    # 1 slot of 2 all along, less the 2.4 s it waits at the start: at least 1,750 s of slot time in 1,800 s
    assert batch["gpu_seconds"] >= 1750, batch


def test_max_slot_share_leaves_a_slot_for_someone_who_could_arrive():
    """Capped at 0.75 of 4 slots, a user with 8 requests queued takes 3 while another person has used the
    backend, and all 4 when nobody else has."""
    settings = dataclasses.replace(SETTINGS, max_slot_share=0.75)
    alone = Scheduler(settings)
    alone.set_user("hog", 1.0)
    alone.set_backend(Backend(id="gpu", name="gpu", models=frozenset({"llama3"}), max_concurrent=4))
    for i in range(8):
        assert alone.submit(job("hog", f"h{i}", 0.0), 0.0) is None
    assert len(started(alone, 0.0)) == 4
    s = Scheduler(settings)
    s.set_user("hog", 1.0)
    s.set_user("reader", 1.0)
    s.set_backend(Backend(id="gpu", name="gpu", models=frozenset({"llama3"}), max_concurrent=4))
    assert s.submit(job("reader", "r0", 0.0), 0.0) is None
    assert started(s, 0.0) == ["r0"]
    assert s.complete("r0", 1.0, prompt_tokens=100, completion_tokens=100)
    for i in range(8):
        assert s.submit(job("hog", f"h{i}", 2.0), 2.0) is None
    assert started(s, 2.0) == ["h0", "h1", "h2"]
    assert s.submit(job("reader", "r1", 10.0), 10.0) is None
    assert started(s, 10.0) == ["r1"]


def test_max_slot_share_must_be_a_fraction():
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="max_slot_share"):
            SchedulerSettings(max_slot_share=bad)


def head_starts(share: float | None) -> dict[str, dict[str, float]]:
    sc = load_example("head-starts")
    result = build(simulate(sc.replace(settings=dataclasses.replace(sc.settings, max_slot_share=share))))
    return {u["name"]: u for u in result["users"]}


def test_max_slot_share_helps_a_person_whose_sessions_meet_head_starts():
    """Case 2: reader 6.2% and a 59 s median wait without the cap; 23.2% and 6.4 s with 0.75."""
    without, capped = head_starts(None)["reader"], head_starts(0.75)["reader"]
    assert without["service_share"] < 0.07 and without["wait_p50"] > 59, without
    assert capped["service_share"] > 0.22 and capped["wait_p50"] < 7, capped


def test_the_simulator_fails_a_person_owed_more_who_waits_a_batch_answer():
    """Without the kept slot (``max_think_time = 0``) chat waits a 72 s answer for each of its own: the
    owed-wait check fails the run where passed-over time (0 s: no slot freed while it waited) did not."""
    from .test_simulate_examples import misses

    sc = load_example("chat-next-to-batch").replace(duration=600)
    before = build(simulate(sc.replace(settings=dataclasses.replace(sc.settings, max_think_time=0.0))))
    chat = next(u for u in before["users"] if u["name"] == "chat")
    assert chat["max_passed_over_s"] == 0 and chat["owed_wait_p50"] > 60, chat
    assert any("chat: owed more than all who waited" in m for m in misses(before))
    now = build(simulate(sc))
    assert not any("owed more" in m for m in misses(now))


ADMIN_READS = """
name = "admin-reads"
description = "a weight-10 admin's 8 loops read 2 s between 1.2 s requests next to a backlogged student, 8 slots"
duration = 1200
seed = 1

[[backends]]
name = "gpu1"
models = ["llama3"]
max_concurrent = 8
tokens_per_second = 50
prefill_tokens_per_second = 1000

[[users]]
name = "admin"
weight = 10
model = "llama3"
concurrency = 8
think_time = 2
prompt_tokens = 200
completion_tokens = 50

[[users]]
name = "student"
model = "llama3"
concurrency = 16
prompt_tokens = 200
completion_tokens = 300
"""


def test_a_heavy_weight_reading_in_many_loops_keeps_only_the_slots_it_uses():
    """Kept by weight alone, the admin's 8 loops kept 7 of 8 slots and used 3: the GPU was 63% busy and the
    admin got 74.1% against 66.9%. Counting the admin's demand (its loops times the part of its time they
    run), it gets its target, the GPU stays busy, and its median wait stays 0 (4.2 s before issue 30)."""
    result = build(simulate(parse_scenario(ADMIN_READS)))
    admin = next(u for u in result["users"] if u["name"] == "admin")
    assert abs(admin["service_share"] - admin["target_share"]) <= 0.02, admin
    assert admin["wait_p50"] <= 3 * 1.2, admin
    assert result["backends"][0]["utilization"] >= 0.97, result["backends"]


def test_the_config_file_sets_max_slot_share_and_max_think_time(tmp_path):
    from mindrouter.config import load_config
    from mindrouter.errors import ConfigError

    path = tmp_path / "mr.toml"
    path.write_text("[scheduler]\nmax_slot_share = 0.75\nmax_think_time = 5\n")
    settings = load_config(path).scheduler
    assert (settings.max_slot_share, settings.max_think_time) == (0.75, 5.0)
    path.write_text("[scheduler]\nmax_slot_share = 2\n")
    with pytest.raises(ConfigError, match="max_slot_share"):
        load_config(path)
