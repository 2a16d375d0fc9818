"""Anticipation: a slot held briefly for a closed-loop client about to send again (BFQ's device idling).

One backend with one slot; ``a`` sends 100-token prompts with 100-token answers
and thinks 50 ms between them, ``b`` keeps 1,000-token prompts with 10-token
answers queued. Costs are 1 per token, and nothing reports timings, so the
core's rates are its defaults: prefill 1,000 tokens/s, decode 50 tokens/s.
"""

from __future__ import annotations

import dataclasses

import pytest
from rich.console import Console

from mindrouter.cli.why import why_view
from mindrouter.daemon.request.dispatcher import Dispatcher
from mindrouter.scheduler import REASONS, Backend, Job, Scheduler, SchedulerSettings
from mindrouter.scheduler.fairness.holds import Holds
from mindrouter.scheduler.records import DecisionRecord
from mindrouter.simulate import Scenario, build, load_example, simulate

SETTINGS = SchedulerSettings(prompt_token_cost=1, completion_token_cost=1, anticipation=0.1)

#: What the slot would deliver to b's next job: 1,010 units in 1000/1000 + 10/50 = 1.2 s.
B_RATE = 1010 / 1.2


def job(user: str, jid: str, t: float, prompt: int, answer: int) -> Job:
    return Job(id=jid, user_id=user, model="llama3", prompt_tokens=prompt, max_tokens=answer, submitted_at=t)


def started(s: Scheduler, now: float) -> list[str]:
    out = [d.job.id for d in s.dispatch(now)]
    s.check()
    return out


def core(settings: SchedulerSettings = SETTINGS) -> Scheduler:
    s = Scheduler(settings)
    s.set_user("a", 1.0)
    s.set_user("b", 1.0)
    s.set_backend(Backend(id="gpu", name="gpu", models=frozenset({"llama3"}), max_concurrent=1))
    return s


def a_learns_to_think(s: Scheduler, *, end: bool = True) -> None:
    """a1 runs first; b1 takes the slot when a1 ends (a's think time is not known yet); a2, sent
    50 ms later, runs after b1. a was charged 200 + 200 and b 1,010: a is owed, and thinks 50 ms."""
    assert s.submit(job("a", "a1", 0.0, 100, 100), 0.0) is None
    for i in (1, 2, 3):
        assert s.submit(job("b", f"b{i}", 0.0, 1000, 10), 0.0) is None
    assert started(s, 0.0) == ["a1"]
    assert s.complete("a1", 1.0, prompt_tokens=100, completion_tokens=100)
    assert started(s, 1.0) == ["b1"]
    assert s.submit(job("a", "a2", 1.05, 100, 100), 1.05) is None
    assert s.complete("b1", 2.0, prompt_tokens=1000, completion_tokens=10)
    assert started(s, 2.0) == ["a2"]
    if end:
        assert s.complete("a2", 3.0, prompt_tokens=100, completion_tokens=100)


def lag(s: Scheduler, user: str) -> float:
    (pool,) = s.turns.fair.pools.values()
    return pool.seats[user].lag


def test_the_slot_a_thinker_freed_waits_for_its_next_request():
    s = core()
    a_learns_to_think(s)
    load = s.load("gpu")
    assert load is not None and (load.in_flight, load.held) == (1, 1)
    assert started(s, 3.0) == []  # b2 is queued, but the slot is a's for 0.1 s
    assert s.next_deadline() == pytest.approx(3.1)
    assert REASONS["held"] in s.router.classes.get(("llama3", s.turns.queues.jobs["b2"].modality, False)).closed["gpu"]
    (pool,) = s.turns.fair.pools.values()
    seat = pool.seats["a"]
    placed = min(seat.lag, seat.kept)  # where it stood when a2 ended: it sent again within the hold
    assert s.submit(job("a", "a3", 3.05, 100, 100), 3.05) is None
    # it paid hold_price of what the slot would have delivered to b2 in the 50 ms it was held: 21.04 units
    assert placed - seat.lag == pytest.approx(SETTINGS.hold_price * 0.05 * B_RATE, rel=1e-9)
    load = s.load("gpu")
    assert load is not None and (load.in_flight, load.held) == (0, 0)
    assert started(s, 3.05) == ["a3"]  # a is still owed: its job takes the slot held for it


def test_without_anticipation_the_slot_goes_to_the_queue_at_once():
    """The defect: work-conserving dispatch hands the thinker's slot to b the moment a's job ends."""
    s = core(dataclasses.replace(SETTINGS, anticipation=0.0))
    a_learns_to_think(s)
    assert started(s, 3.0) == ["b2"]


def test_a_hold_expires_after_anticipation_and_charges_its_holder():
    s = core()
    a_learns_to_think(s)
    before = lag(s, "a")
    assert started(s, 3.09) == []
    assert s.expire(3.1) == []
    assert before - lag(s, "a") == pytest.approx(SETTINGS.hold_price * 0.1 * B_RATE, rel=1e-9)  # 42.08 units
    (b2,) = s.dispatch(3.1)
    assert b2.job.id == "b2" and b2.record.to_dict()["slot_held"] is True
    console = Console(width=200, record=True)
    console.print(why_view(b2.record.to_dict(), {}))
    assert "waited 3.1s (a slot there was held briefly for a user about to send again)" in console.export_text()
    assert s.next_deadline() == pytest.approx(300.0)  # b3's queue timeout: no hold is left


def test_the_price_of_a_hold_is_a_setting():
    """Issue 29: ``hold_price`` (a constant before) sets what the holder pays: all of it at 1."""
    s = core(dataclasses.replace(SETTINGS, hold_price=1.0))
    a_learns_to_think(s)
    before = lag(s, "a")
    assert s.expire(3.1) == []
    assert before - lag(s, "a") == pytest.approx(0.1 * B_RATE, rel=1e-9)  # 84.17 units


def test_a_hold_ends_when_its_backend_is_drained():
    s = core()
    a_learns_to_think(s)
    backend = s.backend("gpu")
    assert backend is not None
    s.set_backend(dataclasses.replace(backend, enabled=False))
    load = s.load("gpu")
    assert load is not None and (load.in_flight, load.held) == (0, 0)
    s.set_backend(backend)
    assert started(s, 3.0) == ["b2"]


def test_a_reader_never_holds_the_only_slot_of_a_backend():
    """A person reading each answer for 5 s on one slot: b's share of it is the slot, so every slot a's
    requests free goes at once to the queue."""
    s = core()
    assert s.submit(job("a", "a0", 0.0, 100, 100), 0.0) is None
    for i in range(20):
        assert s.submit(job("b", f"b{i}", 0.0, 1000, 10), 0.0) is None
    t = 0.0
    assert started(s, t) == ["a0"]
    records: list[DecisionRecord] = []
    for i in range(1, 8):
        t += 1.0
        ((started_job, _),) = s.running_jobs()
        running = started_job.id
        if running.startswith("a"):
            assert s.complete(running, t, prompt_tokens=100, completion_tokens=100)
            records.extend(d.record for d in s.dispatch(t))
            assert len(records) == i  # no slot idles
            assert s.submit(job("a", f"a{i}", t + 5.0, 100, 100), t + 5.0) is None
            t += 5.0
        else:
            assert s.complete(running, t, prompt_tokens=1000, completion_tokens=10)
            records.extend(d.record for d in s.dispatch(t))
            assert len(records) == i
        load = s.load("gpu")
        assert load is not None and load.held == 0
    assert not any(r.slot_held for r in records)
    (pool,) = s.turns.fair.pools.values()
    assert pool.seats["a"].think == pytest.approx(5.0)  # gaps count up to twice max_think_time


def test_anticipation_must_be_a_finite_number_of_seconds():
    with pytest.raises(ValueError, match="anticipation"):
        SchedulerSettings(anticipation=-1.0)


def think_time(**small: object) -> Scenario:
    """The ``think-time`` example, with ``small``'s phase changed as given."""
    sc = load_example("think-time")
    users = tuple(dataclasses.replace(u, **small) if u.name == "small" else u for u in sc.users)  # type: ignore[arg-type]
    return sc.replace(users=users)


def shares(sc: Scenario) -> dict[str, tuple[float, float]]:
    return {u["name"]: (u["service_share"], u["target_share"]) for u in build(simulate(sc))["users"]}


def test_a_thinker_gets_its_share_in_the_simulator_only_with_anticipation():
    """``think-time`` (50 ms between small's requests): big had 88.3% against 60.6% before the hold."""
    sc = load_example("think-time")
    big, target = shares(sc.replace(settings=dataclasses.replace(sc.settings, anticipation=0.0)))["big"]
    assert (round(big, 3), round(target, 3)) == (0.883, 0.606)
    for share, target in shares(sc).values():
        assert abs(share - target) <= 0.02


def test_the_simulator_ends_every_hold_at_its_time(monkeypatch):
    """small stops after 5 minutes: the hold for its last request expires, and the engine wakes for it."""
    late: list[float] = []
    count = [0]
    expire = Holds.expire

    def watched(self: Holds, now: float) -> list:
        ended = expire(self, now)
        count[0] += len(ended)
        late.extend(now - hold.until for hold in ended)
        return ended

    monkeypatch.setattr(Holds, "expire", watched)
    simulate(think_time(stop=300.0).replace(duration=400))
    assert count[0] >= 1 and max(late) == pytest.approx(0.0, abs=1e-9)


def test_a_human_in_the_simulator_never_holds_a_slot(monkeypatch):
    """small reads each answer for 20 s, past ``max_think_time``: no slot ever idles for it."""
    taken = []
    monkeypatch.setattr(Holds, "take", lambda self, *args: taken.append(args))
    simulate(think_time(think_time=(20.0, 20.0)).replace(duration=600))
    assert taken == []


def test_the_daemon_timer_wakes_for_a_hold_that_ends_before_its_next_round():
    """The timer sleeps up to a second; a job that ends with its slot held wakes it for the hold's end."""
    s = core()
    a_learns_to_think(s, end=False)
    dispatcher = Dispatcher(s, None, on_settled=lambda _: None, clock=lambda: 3.0)  # type: ignore[arg-type]
    dispatcher._timer_until = 3.9  # asleep until the next second
    dispatcher.finish("a2", prompt_tokens=100, completion_tokens=100, latency=None, duration=None)
    assert s.next_deadline() == pytest.approx(3.1) and dispatcher._timer_wake.is_set()
