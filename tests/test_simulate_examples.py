"""Every shipped example against issue 9's targets, measured from the ``mr simulate --json`` object.

Targets (issues 9 and 18), per pool of contention; a target share is the
user's weighted max-min share among the people with work in the pool
(``mindrouter.simulate.maxmin``), from the workload alone:

- a person owed more than everyone waiting (its counter below every other
  backlogged user's when it sends, with nothing else queued) waits at the
  median at most 3x its own median request's time (issue 30: before the kept
  slots chat-next-to-batch's chat waited 67.0 s against 7.2 s, agent-loops'
  agent 5.8 s against 0.2 s; no slot freed while they waited, so they were
  never passed over);
- no user is passed over for longer than 3x the time its longest request took
  (``max_passed_over_s`` against ``passed_over_allowed_s``): waiting while a
  slot it could use is free, or after such a slot went to someone whose turn
  was later by more than one request (``mindrouter.simulate.turns``). Plain
  starvation (``max_starved_s``) is reported beside it but not judged: it
  counts waiting for a slot to free, which no scheduler that never interrupts
  a running request can shorten (``early-leavers``: starved 5.1 s against 3 x
  0.6 s, passed over 0 s); no timeouts, except for a user that got its share
  (its demand beyond it is what timed out);
- no one left more than 5 points short of its target in any 60 s window from
  2 minutes after any arrival or weight change (or the largest request's part
  of the window's units, and one slot's share of the pool plus 2 points while
  a request that outlasts the window runs, either at most half the person's
  target; the largest prompt's part always: ``allowed``), and shares within 2
  points over the run;
- service gap at most 2x the largest request cost, between people who compete
  for slots (``lab-pool``: users of models with their own slots on the same
  backends are not compared; ``mindrouter.simulate.slots``), less the head
  start of the side ahead: what its requests already running when both waited
  had still to deliver, which no scheduler that never interrupts a running
  request can take back (``model-switch``: 1,920 against 1,600 at the full
  hour, all of it head start).

To keep this file to a few seconds, examples run compressed: an example built
around a change at 30 minutes runs with every start, stop and event at a third
of its time (the change after 10 minutes of saturation, which already stalls a
core that rescales history), and one without changes runs its first 10
minutes. Request sizes and speeds are untouched. The full hours are measured by
``benchmarks/bench_simulate.py --figures`` (the table in docs/simulate.md).
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from typing import Any

import pytest
from typer.testing import CliRunner

from mindrouter.cli import app
from mindrouter.simulate import Scenario, build, example_names, load_example, parse_scenario, simulate

#: How each example runs here: its time scaled by a factor, or its first seconds (see the module docstring).
SCALED = {
    name: 1 / 3
    for name in (
        "model-switch",
        "newcomer-other-model",
        "set-weight",
        "set-weight-reverse",
        "group-set-weight",
        "long-answers",
        "answers-jump",
    )
}
FIRST = {
    "admin-one-student": 600,
    "admin-two-students": 600,
    "group-shares": 600,
    "separate-models": 600,
    "scenario3": 600,
    "huge-request": 1800,
    "overlapping-pools": 600,
    "one-person-many-models": 600,
    "agent-loops": 300,
    "reader-writer-embedder": 600,
}


def scaled(sc: Scenario, factor: float) -> Scenario:
    """``sc`` with its duration, phases' start and stop and events' times multiplied by ``factor``."""
    users = tuple(
        dataclasses.replace(u, start=u.start * factor, stop=None if u.stop is None else u.stop * factor)
        for u in sc.users
    )
    events = tuple(dataclasses.replace(e, at=e.at * factor) for e in sc.events)
    return sc.replace(duration=sc.duration * factor, users=users, events=events)


@cache
def measure(name: str) -> dict[str, Any]:
    sc = load_example(name)
    if name in SCALED:
        sc = scaled(sc, SCALED[name])
    elif name in FIRST:
        sc = sc.replace(duration=FIRST[name])
    return build(simulate(sc))


def misses(result: dict[str, Any]) -> list[str]:
    """Every target the run misses, in words (empty when all are met)."""
    out = []
    for user in result["users"]:
        if user["timeouts"] and user["service_share"] < user["target_share"] - 0.02:
            out.append(f"{user['name']}: {user['timeouts']} timeouts short of its share")
        if user["owed_waits"] and user["owed_wait_p50"] > user["owed_wait_allowed_s"] + 1e-6:
            out.append(
                f"{user['name']}: owed more than all who waited, its median wait was {user['owed_wait_p50']:.2f} s"
                f" > {user['owed_wait_allowed_s']:.2f} s (3 x its median request, over {user['owed_waits']} requests)"
            )
        if user["max_passed_over_s"] > user["passed_over_allowed_s"] + 1e-6:
            out.append(
                f"{user['name']}: passed over {user['max_passed_over_s']:.2f} s > {user['passed_over_allowed_s']:.2f} s"
                f" (3 x its longest request, {user['longest_request_s']:.2f} s; starved {user['max_starved_s']:.2f} s)"
            )
    for pool in result["pools"]:
        where = "+".join(pool["backends"])
        worst = pool["worst_window"]
        if worst is not None and worst["deviation"] > worst["allowed"] + 1e-9:
            out.append(
                f"{where}: window at {worst['start']:g} s has {worst['user']} at {100 * worst['unit_share']:.1f}%"
                f" against {100 * worst['target']:.1f}% (allowed {100 * worst['allowed']:.1f} points)"
            )
        for name in pool["users"]:
            off = abs(pool["unit_shares"][name] - pool["target_shares"][name])
            if off > 0.02:
                out.append(f"{where}: {name} {100 * off:.1f} points off its target over the run")
        if pool["max_service_gap_beyond_head_start"] > pool["gap_bound"] + 1e-6:
            out.append(
                f"{where}: service gap beyond head starts {pool['max_service_gap_beyond_head_start']:,.0f}"
                f" > bound {pool['gap_bound']:,.0f}"
            )
    return out


#: What each example shows (issue 9's table).
ROWS = {
    "scenario1": "the seed's scenario 1",
    "scenario2": "the seed's scenario 2",
    "scenario3": "the seed's scenario 3",
    "model-switch": "row 1: a user switches model after 30 min alone",
    "newcomer-other-model": "row 2: a newcomer on another model",
    "set-weight": "row 3: set-weight after 30 min of saturation",
    "set-weight-reverse": "row 3: the reverse change",
    "group-set-weight": "row 3: a group's weight changed",
    "huge-request": "row 4: one 30k-token request, then returners",
    "long-answers": "row 5: a newcomer with 4,000-token answers",
    "answers-jump": "row 5: answers jumping from 10 to 4,000 tokens",
    "admin-one-student": "row 6: admin (10) and one student",
    "admin-two-students": "row 6: admin (10) and two students",
    "group-shares": "row 7: 20 students and 1 faculty member",
    "separate-models": "row 8: two users on separate models",
    "lab-pool": "issue 17: four Ollama workstations, loads and a burst over capacity",
    "staggered-big-prompts": "issue 18, case 1: staggered loops of 30k-token prompts",
    "few-outstanding": "issue 18, case 1: few big requests outstanding",
    "overlapping-pools": "issue 18, case 3: a student on a model only the shared GPU has, next to an admin",
    "one-person-many-models": "issue 18, case 3: one person on two models of the shared box",
    "big-max-tokens": "issue 18, case 2: non-streamed requests with max_tokens 100000 against streams",
    "early-leavers": "issue 18, case 2: streams that leave after 10 tokens, readers and non-streamed requests",
    "think-time": "anticipation: closed-loop clients thinking 50 ms next to queued 30k-token prompts",
    "conversations": "issue 31: conversations behind shared system prompts on per-slot and prefix-block caches",
    "two-popular": "issue 31: two popular same-size models competing for VRAM; the busier one drains the other",
    "chat-next-to-batch": "issue 30, case 1: a person chatting next to batch work on 2 slots",
    "agent-loops": "issue 30, case 3: an agent's 4 loops of tiny requests next to batch work",
    "head-starts": "issue 30, case 2: four 60 s requests sent 1 s before each of another person's sessions",
    "reader-writer-embedder": "issue 30, case 4: a long-prompt reader, a long-answer writer and an embedder",
}

#: Examples that miss a target until the scheduler core does what issue 9 asks;
#: each names the missing core behaviour. Remove an entry when its test passes
#: (strict: an unexpected pass fails the suite, so none is left behind).
NEEDS_CORE: dict[str, str] = {
    "chat-next-to-batch": "price in slot time (issue 30): tokens units give chat 40.1% where water-filling owes"
    " it 34.5% (the slot kept for chat delivers its short requests 1.7x the units a second of batch's long"
    ' answers); with service_unit = "gpu" every window is within 0.2 points and the run 2.4 points off, all of it'
    " chat's first wait behind batch's answers started while it was alone"
    " (test_chat_next_to_batch_misses_its_run_target_only_by_the_unit_and_its_arrival)",
    "head-starts": "interrupt a running request: hog's four 60 s requests hold every slot each time reader comes"
    " (6.2% against 51.7%); `max_slot_share = 0.75` brings reader to 23.2% (docs/fairness.md, head starts)",
}


def core(name: str, reason: str | None = None) -> Any:
    """``name`` as a parameter, expected to fail (strictly) while the core lacks what it needs."""
    reason = reason or NEEDS_CORE.get(name)
    if reason is not None:
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=f"needs the core to {reason}"))
    return pytest.param(name)


@pytest.mark.parametrize("name", ["big-max-tokens", "early-leavers"])
def test_what_a_client_asks_for_or_reads_never_changes_shares(name):
    """A 100,000 max_tokens without streaming, or streams left after 10 tokens: each still gets its target."""
    result = measure(name)
    for user in result["users"]:
        assert abs(user["service_share"] - user["target_share"]) <= 0.02, user
        assert user["timeouts"] == 0, user
        assert user["worst_window"]["deviation"] <= 0.05, user
    assert result["max_service_gap"] <= result["gap_bound"] + 1e-6


def test_every_example_is_covered():
    assert sorted(ROWS) == example_names()


@pytest.mark.parametrize("name", [core(n) for n in sorted(ROWS)])
def test_example_meets_the_targets(name):
    found = misses(measure(name))
    assert not found, f"{ROWS[name]}: " + "; ".join(found)


@pytest.mark.parametrize(
    "name", ["answers-jump", "long-answers", "set-weight", "set-weight-reverse", "group-set-weight"]
)
def test_the_gap_bound_holds_at_full_length(name):
    """Where the change falls in a batch moves the gap: the full hour too (about a second each).

    Before: answers-jump 27,300 of 16,400 (b's first long answers charged as its 10-token ones),
    set-weight 1,760 of 1,600 (streams running at the change charged at the old weight).
    """
    result = build(simulate(load_example(name)))
    assert result["max_service_gap"] <= result["gap_bound"] + 1e-6, result["max_service_gap"]


@pytest.mark.parametrize("name", ["model-switch", "newcomer-other-model"])
def test_a_newcomer_waits_out_only_the_work_already_running(name):
    """The newcomer comes at 1,800.0 s, when the other user's 4 requests (started at 1,798.4) hold
    every slot of its GPU with 1,920 units still to deliver: the full hour's gap is exactly that
    head start, over the bound of 1,600, and the scheduler's own choices add nothing to it."""
    result = build(simulate(load_example(name)))
    assert result["max_service_gap"] == pytest.approx(1920)
    assert result["gap_bound"] == 1600
    assert result["max_service_gap_beyond_head_start"] == pytest.approx(0, abs=1e-6)


def jumped(
    a_answer: int = 300,
    b_answer: int = 4000,
    slots: int = 4,
    max_tokens: int | None = None,
    stream: bool = True,
    full: bool = False,
) -> Scenario:
    """answers-jump with other sizes: a's answers, b's answers after the jump, slots per backend, max_tokens.

    ``stream``: whether b's long answers stream; ``full``: the whole hour rather than a third of it.
    """
    sc = load_example("answers-jump")
    if not full:
        sc = scaled(sc, 1 / 3)
    users = tuple(
        dataclasses.replace(
            u,
            completion_tokens=(a_answer, a_answer) if u.name == "a" else u.completion_tokens,
            max_tokens=max_tokens if u.name == "b" else u.max_tokens,
        )
        for u in sc.users
    )
    users = (*users[:2], dataclasses.replace(users[2], completion_tokens=(b_answer, b_answer), stream=stream))
    backends = tuple(dataclasses.replace(b, max_concurrent=slots) for b in sc.backends)
    return sc.replace(users=users, backends=backends)


@pytest.mark.parametrize(
    "variant",
    [
        pytest.param({"a_answer": 50}, id="a-answers-50"),
        pytest.param({"a_answer": 1000}, id="a-answers-1000"),
        pytest.param({"b_answer": 2000, "slots": 8}, id="jump-to-2000-on-16-slots"),
        pytest.param({"b_answer": 3000, "slots": 3}, id="jump-to-3000-on-6-slots"),
        pytest.param({"max_tokens": 4096}, id="max-tokens-4096"),
        pytest.param({"stream": False}, id="unstreamed-jump"),
        pytest.param({"stream": False, "full": True}, id="unstreamed-jump-full-hour"),
        pytest.param({"stream": False, "max_tokens": 100000}, id="unstreamed-jump-max-tokens-100000"),
        pytest.param({"stream": False, "b_answer": 2000, "slots": 8}, id="unstreamed-jump-to-2000-on-16-slots"),
        pytest.param({"stream": False, "a_answer": 1000}, id="unstreamed-jump-a-answers-1000"),
        pytest.param({"stream": False, "a_answer": 50}, id="unstreamed-jump-a-answers-50"),
        pytest.param({"stream": False, "a_answer": 50, "full": True}, id="unstreamed-jump-a-answers-50-full-hour"),
        pytest.param({"stream": False, "b_answer": 3000, "slots": 3}, id="unstreamed-jump-to-3000-on-6-slots"),
    ],
)
def test_answers_that_jump_keep_the_gap_bound_at_other_sizes(variant):
    """Issue 18's targets hold in adversarial variants of the same kind, not only in the shipped example."""
    result = build(simulate(jumped(**variant)))
    assert not misses(result), misses(result)
    assert result["max_service_gap"] <= result["gap_bound"] + 1e-6


@pytest.mark.parametrize("name", ["staggered-big-prompts", "few-outstanding"])
def test_issue18_examples_give_each_user_half(name):
    """Big prompts from loops that never leave a request waiting: 88% of the tokens before, 50% due.

    Half of the service units (with answer tokens at 2 the big prompts get more of the tokens), and the
    targets say half too: weighted max-min among those with work in the pool, not what big received
    while nothing of its own was queued (the simulator's old rule set 72-86%).
    """
    result = measure(name)
    shares = {u["name"]: u["service_share"] for u in result["users"]}
    targets = {u["name"]: u["target_share"] for u in result["users"]}
    assert shares["big"] == pytest.approx(0.5, abs=0.02), shares
    assert targets["big"] == pytest.approx(0.5, abs=0.01), targets
    small = next(u for u in result["users"] if u["name"] == "small")
    assert small["max_starved_s"] <= 3 * small["longest_request_s"], small


def few_outstanding(weight: float, outstanding: int = 2, sizes: tuple[int, int] = (30000, 10)) -> Scenario:
    """few-outstanding's first 10 minutes with big at ``weight``, ``outstanding`` requests and ``sizes`` each."""
    sc = load_example("few-outstanding").replace(duration=600)
    prompt, completion = sizes
    big = {
        "weight": weight,
        "weight_override": weight,
        "concurrency": outstanding,
        "prompt_tokens": (prompt, prompt),
        "completion_tokens": (completion, completion),
    }
    return sc.replace(users=tuple(dataclasses.replace(u, **big) if u.name == "big" else u for u in sc.users))


@pytest.mark.parametrize(
    ("weight", "outstanding", "sizes", "share"),
    [
        pytest.param(1, 2, (30000, 10), 1 / 2, id="weight-1"),
        pytest.param(2, 2, (30000, 10), 2 / 3, id="weight-2"),
        pytest.param(3, 2, (30000, 10), 3 / 4, id="weight-3"),
        pytest.param(2, 1, (30000, 10), 2 / 3, id="weight-2-one-outstanding"),
        pytest.param(2, 1, (8000, 1000), 463 / (463 + 3 * 132.5), id="weight-2-capped-by-its-one-slot"),
        pytest.param(1, 1, (100, 4000), 0.203, id="long-answers-capped-by-their-one-slot"),
    ],
)
def test_a_user_is_owed_its_weighted_max_min_share_of_the_units(weight, outstanding, sizes, share):
    """Weighted max-min in service units, each user held to its outstanding slots x its own units per
    slot-second: big's 30,000-token prompts deliver 30,020 units in 6.2 s of a slot (4,842 a second),
    small's chat streams 800 in 6.04 s (132.5), so big reaches its weight's share of the units on a
    fraction of a slot and its 1 or 2 slots never bind. Counting slots said 50% at 2 outstanding and
    25% at 1 whatever the weight (max-min gave big the slots it asks for) while the core gave big its
    weight's share. Where the slot does bind (8,000-token prompts with 1,000-token answers: 463 units
    a slot-second; 4,000-token answers: 100), big is owed one slot's units and small the other 3 slots'.
    """
    result = build(simulate(few_outstanding(weight, outstanding, sizes)))
    users = {u["name"]: u for u in result["users"]}
    assert users["big"]["target_share"] == pytest.approx(share, abs=0.005), users["big"]
    assert users["big"]["service_share"] == pytest.approx(share, abs=0.02), users["big"]
    assert not misses(result), misses(result)


def test_separate_models_are_reported_fair():
    result = measure("separate-models")
    assert [(p["users"], p["target_shares"], p["shares"]) for p in result["pools"]] == [
        (["x"], {"x": 1.0}, {"x": 1.0}),
        (["y"], {"y": 1.0}, {"y": 1.0}),
    ]
    assert result["jain_index"] == 1.0 and result["max_service_gap"] == 0.0


def test_model_switch_splits_the_new_pool_from_the_switch_on():
    result = measure("model-switch")
    qwen, llama = result["pools"]
    assert qwen["users"] == ["x"] and sorted(llama["users"]) == ["x", "y"]
    after = [w for w in llama["windows"] if w["start"] >= 720]  # the switch is at 600 s here
    assert all(abs(w["shares"]["x"] - 0.5) <= 0.05 for w in after), [w["shares"]["x"] for w in after]


@pytest.mark.parametrize(
    ("name", "share"),
    [
        pytest.param(name, share, marks=core(name).marks)
        for name, share in (("set-weight", 2 / 3), ("set-weight-reverse", 1 / 2))
    ],
)
def test_set_weight_moves_shares_from_the_change_on(name, share):
    (pool,) = measure(name)["pools"]
    after = [w for w in pool["windows"] if w["start"] >= 720]  # the change is at 600 s here
    assert all(w["targets"]["a"] == pytest.approx(share, abs=1e-6) for w in after)
    assert all(abs(w["shares"]["a"] - share) <= 0.05 for w in after), [w["shares"]["a"] for w in after]


@pytest.mark.parametrize("name", ["admin-one-student", "admin-two-students"])
def test_admin_using_its_entitlement_is_not_heavy(name):
    result = measure(name)
    admin = next(u for u in result["users"] if u["name"] == "admin")
    assert admin["deprioritized_seconds"] == 0 and admin["min_factor"] == 1.0, admin


def test_group_shares_give_the_faculty_group_half():
    (pool,) = measure("group-shares")["pools"]
    assert pool["target_shares"]["prof"] == pytest.approx(0.5, abs=0.005)
    assert pool["shares"]["prof"] == pytest.approx(0.5, abs=0.02)
    for n in range(1, 21):
        assert pool["shares"][f"student{n:02d}"] == pytest.approx(0.025, abs=0.005)


def test_cli_json_has_pools_starvation_and_timeouts():
    result = CliRunner().invoke(app, ["simulate", "--example", "model-switch", "--json", "--duration", "2400"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [p["backends"] for p in data["pools"]] == [["gpu-a"], ["gpu-b"]]
    for pool in data["pools"]:
        assert set(pool) >= {"backends", "users", "shares", "target_shares", "worst_window", "windows"}
    for user in data["users"]:
        assert set(user) >= {"max_starved_s", "timeouts", "longest_request_s"}
    assert data["settle_seconds"] == 120
    # x arrives on llama3 at 1800 s: the windows of the next 2 minutes do not count toward worst_window.
    rows = {w["start"]: w for w in data["pools"][1]["windows"]}
    assert [(rows[t]["since_change"], rows[t]["counts"]) for t in (1740, 1800, 1860, 1920)] == [
        (1740, True),
        (0, False),
        (60, False),
        (120, True),
    ]
    assert all(w["error"] <= w["allowed"] for w in rows.values() if w["counts"])


def test_a_wait_for_a_slot_to_free_is_starvation_not_passing_over():
    """early-leavers: leaver's 0.6 s requests wait up to 5.0 s while 6-10 s requests hold every slot.

    The figure moves with any change in who gets which freed slot (5.1 s before the core priced long
    answers ahead, 4.6 s after; 5.0 s since batch's whole answers are charged by the clock).

    No scheduler that never interrupts a running request starts them sooner, and each freed slot
    went to leaver or to someone whose turn came first, so it was never passed over.
    """
    users = {u["name"]: u for u in measure("early-leavers")["users"]}
    leaver = users["leaver"]
    assert leaver["max_starved_s"] == pytest.approx(5.04, abs=0.05)
    assert leaver["max_starved_s"] > 3 * leaver["longest_request_s"] == pytest.approx(1.8, abs=1e-6)
    assert leaver["passed_over_allowed_s"] == pytest.approx(1.8, abs=1e-6)
    for user in users.values():
        assert user["max_passed_over_s"] <= user["passed_over_allowed_s"], user


FIFO_TOML = """
name = "fifo"
duration = 600
seed = 1

[scheduler]
wait_bonus_per_second = {bonus}

[[backends]]
name = "gpu1"
models = ["llama3"]
max_concurrent = 2
tokens_per_second = 50

[[users]]
name = "hog"
model = "llama3"
concurrency = 12
prompt_tokens = 100
completion_tokens = 100

[[users]]
name = "light"
model = "llama3"
concurrency = 2
prompt_tokens = 100
completion_tokens = 100
"""


@pytest.mark.parametrize(("bonus", "passed_over"), [(0.05, False), (1e6, True)])
def test_a_first_come_first_served_core_is_caught_passing_people_over(bonus, passed_over):
    """With the wait bonus so large that the oldest request always goes first, each of light's requests
    waits behind hog's queue (about 12 s against 3 x its 2 s) though hog is far ahead: passed over.
    The core as configured serves light at the next freed slot."""
    result = build(simulate(parse_scenario(FIFO_TOML.format(bonus=bonus))))
    light = next(u for u in result["users"] if u["name"] == "light")
    assert (light["max_passed_over_s"] > light["passed_over_allowed_s"]) is passed_over, light
    assert light["max_passed_over_s"] <= light["max_starved_s"] + 1e-9
    assert bool(misses(result)) is passed_over


def test_a_small_workstation_can_fail_a_window():
    """chat-next-to-batch without kept slots (``max_think_time = 0``): chat gets nothing in the window at
    300 s against 50% owed. The allowance was one request's part of the window (batch's 7,400 units of
    about 12,000: 61.7 points) or one slot's share (52 points), so no window on 2 slots could fail; now
    a person may be left short by at most half the slots it is owed (25 points), a slot freeing within
    the window (``report.allowed_deviation``). With kept slots chat's worst window is 9.1 points off."""
    sc = load_example("chat-next-to-batch")
    sc = sc.replace(duration=600, settings=dataclasses.replace(sc.settings, max_think_time=0.0))
    result = build(simulate(sc))
    (pool,) = result["pools"]
    assert pool["worst_window"]["user"] == "chat"
    assert pool["worst_window"]["deviation"] == pytest.approx(0.5, abs=0.01)
    assert pool["worst_window"]["allowed"] == pytest.approx(0.25)
    assert any(m.startswith("gpu1: window at") for m in misses(result)), misses(result)
    kept = measure("chat-next-to-batch")["pools"][0]["worst_window"]
    assert kept["deviation"] <= kept["allowed"], kept


def test_chat_next_to_batch_misses_its_run_target_only_by_the_unit_and_its_arrival():
    """Why the example is marked (``NEEDS_CORE``). With ``service_unit = "gpu"`` (units follow slot time)
    every window after the first minutes is within 0.2 points of chat's target, and the run's 2.4 points
    are all one wait: chat's first question, at 5 s, behind batch's two 72 s answers started while batch
    was alone (what chat was owed meanwhile, about 6,460 units of 264,000). No scheduler that never
    interrupts a running request serves it sooner; the run check, unlike the gap's, counts no head start.
    With tokens chat gets 40.1% against 34.5%: the slot kept for it delivers its short requests 1.7x the
    units a second of batch's, where the fluid target gives it 0.76 of a slot."""
    sc = load_example("chat-next-to-batch")
    run = simulate(sc.replace(settings=dataclasses.replace(sc.settings, service_unit="gpu")))
    result = build(run)
    (pool,) = result["pools"]
    windows = [w for w in pool["windows"] if w["counts"]]
    assert len(windows) == 27
    assert max(abs(w["unit_shares"]["chat"] - w["targets"]["chat"]) for w in windows) <= 0.002
    chat = next(i for i, u in enumerate(run.users) if u.name == "chat")
    short = run.pools[0].target[chat] - run.pools[0].service(chat, run.duration)
    assert short == pytest.approx(6457, rel=0.01)
    assert pool["target_shares"]["chat"] - pool["unit_shares"]["chat"] == pytest.approx(short / pool["units"], abs=1e-5)
    tokens = {u["name"]: u for u in measure("chat-next-to-batch")["users"]}["chat"]
    assert tokens["service_share"] == pytest.approx(0.401, abs=0.001)
    assert tokens["target_share"] == pytest.approx(0.345, abs=0.001)


def test_lab_pool_counts_per_model_slots():
    """Each model has its own 4 slots per workstation: coders share only coder slots, so their targets
    come from those slots (5.2-7.6%, as received; counting the backends' max_concurrent said 3.1-4.3%),
    and a coder is never compared with a chat user for the service gap. Within 0.75 points: coder2 was
    0.50 below its target, 0.67 since a request for a resident model goes to its runner at once instead of
    waiting in the workstation's queue behind a request whose model is loading (Ollama's getRunner); the
    wrong count was 2-3 points off."""
    result = measure("lab-pool")
    (pool,) = result["pools"]
    for name in ("coder1", "coder2", "coder3", "coder4", "chat01", "big1", "rag1"):
        assert abs(pool["unit_shares"][name] - pool["target_shares"][name]) <= 0.0075, name
    pair = pool["max_service_gap_pair"]
    assert pair[0][:4] == pair[1][:4], pair


def test_a_core_that_leaves_a_slot_free_is_caught_passing_people_over(monkeypatch):
    """A core that starts nothing for the first minute while both slots are free: everyone waiting is
    passed over once a slot has been free for longer than a hold lasts (``anticipation``, 0.1 s), until
    the next batch at 60 s: light 59.9 s against 3 x 2.2 s."""
    from mindrouter.scheduler import Scheduler

    dispatch = Scheduler.dispatch
    monkeypatch.setattr(Scheduler, "dispatch", lambda self, now: [] if now < 60 else dispatch(self, now))
    result = build(simulate(parse_scenario(FIFO_TOML.format(bonus=0.05))))
    light = next(u for u in result["users"] if u["name"] == "light")
    assert light["max_passed_over_s"] == pytest.approx(60.0 - 0.1, abs=1e-6), light
    assert any(m.startswith("light: passed over") for m in misses(result))
