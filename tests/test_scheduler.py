"""The scheduler core, driven with plain calls and explicit times."""

from __future__ import annotations

import dataclasses
import math

import pytest

from mindrouter.scheduler import (
    REASONS,
    Backend,
    Job,
    Modality,
    Scheduler,
    SchedulerSettings,
    apply_factor,
    heavy_factor,
    seed_priority,
)

from .conftest import SEED_RECORD_KEYS

LLAMA = frozenset({"llama3"})


#: These tests count fair share in tokens: a prompt token and an answer token cost 1 each (the default is 1:2).
TOKENS = SchedulerSettings(prompt_token_cost=1, completion_token_cost=1)


def make(settings: SchedulerSettings | None = None, backends: int = 1, slots: int = 1, **backend_kw) -> Scheduler:
    s = Scheduler(settings or TOKENS)
    for i in range(1, backends + 1):
        s.set_backend(Backend(id=i, name=f"gpu{i}", models=LLAMA, max_concurrent=slots, **backend_kw))
    return s


_ids = iter(range(10**9))


def job(user, t=0.0, model="llama3", prompt=100, max_tokens=None, **kw) -> Job:
    return Job(
        id=f"j{next(_ids)}",
        user_id=user,
        model=model,
        submitted_at=t,
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        **kw,
    )


def served(s: Scheduler, user, cost: int, t: float) -> None:
    """``user`` is served one request costing ``cost`` at ``t`` (submitted, dispatched, completed)."""
    s.submit(j := job(user, t, prompt=0), t)
    assert [d.job.id for d in s.dispatch(t)] == [j.id]
    s.complete(j.id, t, prompt_tokens=cost, completion_tokens=0)


def deficit(s: Scheduler, user, now: float = 0.0) -> float:
    share = s.share(now).user(user)
    assert share is not None
    return share.deficit


# -- formulas -----------------------------------------------------------------


def test_heavy_factor_follows_the_seed():
    assert heavy_factor(0.5, 0.5) == 1.0
    assert heavy_factor(0.75, 0.5) == pytest.approx(0.5)
    assert heavy_factor(0.9, 0.5) == pytest.approx(0.2)
    assert heavy_factor(1.0, 0.5) == pytest.approx(0.1)  # floor
    assert heavy_factor(0.3, 0.5) == 1.0


@pytest.mark.parametrize("base", [-5000.0, -1.0, -0.001, 0.0, 0.001, 1.0, 5000.0])
@pytest.mark.parametrize("factor", [0.1, 0.5, 0.99, 1.0])
def test_deprioritization_never_helps_whatever_the_sign(base, factor):
    assert apply_factor(base, factor) <= base
    # The seed's formula without the correction would raise a negative base:
    if base < 0 and factor < 1:
        assert base * factor > base
        assert seed_priority(base, 0, 1, factor, 0) < base


def test_seed_priority_formula():
    assert seed_priority(300, 100, 2, 1.0, 5) == pytest.approx(205)
    assert seed_priority(-300, 100, 2, 0.5, 0) == pytest.approx(-200)


def test_cost_is_configurable():
    assert SchedulerSettings(prompt_token_cost=1, completion_token_cost=1).cost(100, 50) == 150
    assert SchedulerSettings(prompt_token_cost=1, completion_token_cost=2).cost(100, 50) == 200


@pytest.mark.parametrize("name", ["prompt_token_cost", "completion_token_cost"])
@pytest.mark.parametrize("value", [0, -1, math.inf, math.nan])
def test_a_token_cost_that_is_not_positive_is_refused_in_one_sentence(name, value):
    with pytest.raises(ValueError, match=f"^{name} must be a finite number greater than 0") as info:
        SchedulerSettings(**{name: value})
    assert "such as" in str(info.value)


# -- priorities ----------------------------------------------------------------


def first_dispatched(s: Scheduler, now: float = 10.0) -> object:
    d = s.dispatch(now)
    assert len(d) == 1
    return d[0].job.user_id


def test_fresh_user_outranks_one_who_consumed_1000_tokens():
    s = make()
    s.set_user("old", 1)
    s.set_user("new", 1)
    s.submit(j := job("old", 0, prompt=0), 0)
    s.dispatch(0)
    s.complete(j.id, 1, prompt_tokens=400, completion_tokens=600)
    # A newcomer stands one typical request (256) above V; it was then charged 1000.
    assert deficit(s, "old") == 256 - 1000
    s.submit(job("old", 2), 2)
    s.submit(job("new", 2), 2)
    assert first_dispatched(s) == "new"


def test_equal_cost_served_weighs_three_times_less_for_weight_3():
    s = make()
    s.set_user("light", 1)
    s.set_user("heavy", 3)
    served(s, "light", 600, 0)
    served(s, "heavy", 600, 0)
    s.submit(job("heavy", 1), 1)
    s.submit(job("light", 1), 1)
    # Both entered within a credit of V, but 600 tokens cost "heavy" a third of what they cost "light".
    assert first_dispatched(s, 1) == "heavy"


def test_completing_500_tokens_moves_deficit_to_minus_500():
    s = make()
    s.set_user("u", 1)
    s.submit(j := job("u"), 0)
    [_d] = s.dispatch(0)
    assert deficit(s, "u") == 256 - (100 + 256)  # the prompt and the usual answer count while it runs
    assert s.user("u").inflight_charge == 100 + 256
    s.complete(j.id, 5, prompt_tokens=200, completion_tokens=300)
    assert deficit(s, "u") == 256 - 500
    assert s.user("u").inflight_charge == 0


def test_in_flight_estimate_spreads_a_burst_of_free_slots():
    """Eight slots free at once are not all handed to one user."""
    s = make(backends=2, slots=4)
    for u in "ab":
        s.set_user(u, 1)
        for _ in range(8):
            s.submit(job(u, max_tokens=200), 0)
    users = [d.job.user_id for d in s.dispatch(0)]
    assert users.count("a") == 4 and users.count("b") == 4


def busy_pool(s: Scheduler, answer: int = 1000) -> float:
    """``a`` completes 100 streamed requests of ``answer`` tokens (prompt 100); returns the pool's typical answer."""
    s.set_user("a", 1)
    for t in range(100):
        s.submit(j := job("a", t, stream=True), t)
        s.dispatch(t)
        s.complete(j.id, t + 1, prompt_tokens=100, completion_tokens=answer)
    return typical_answer(s)


def typical_answer(s: Scheduler) -> float:
    (pool,) = s.turns.fair.pools.values()
    return pool.answer


def slot_answer(s: Scheduler) -> float:
    """The answer the pool's slots are typically busy with: what a stream of a known user is charged ahead by."""
    (pool,) = s.turns.fair.pools.values()
    return pool.slot_answer


def test_a_newcomer_taking_slots_at_once_moves_by_a_typical_answer_ahead_for_each():
    """Issue 9, row 5: while a user's answers are unknown, each stream is charged a typical answer ahead."""
    s = make(backends=2, slots=4)
    typical = busy_pool(s)
    assert typical == pytest.approx(1000, rel=0.001)
    s.set_user("new", 1)
    for _ in range(8):
        s.submit(job("new", 100, stream=True), 100)
        s.submit(job("a", 100, stream=True), 100)
    started = s.dispatch(100)
    # One slot for its credit, then turns (a tie goes to the older job): 5 of 8, where 256 per slot gave it 7.
    assert [d.job.user_id for d in started].count("new") == 5
    assert s.user("new").inflight_charge == pytest.approx(5 * (100 + typical))
    mine = [d.job.id for d in started if d.job.user_id == "new"]
    s.progress(mine[0], 110, completion_tokens=3000)  # its answer is long: the charge stays an answer ahead
    assert s.user("new").inflight_charge == pytest.approx(5 * (100 + typical) + 3000)
    before = deficit(s, "new")
    s.complete(mine[0], 120, prompt_tokens=100, completion_tokens=3000)  # settled exactly: the answer ahead refunded
    assert deficit(s, "new") == pytest.approx(before + typical)


def test_a_known_long_answer_is_charged_as_it_streams_not_all_at_once():
    s = make(backends=2, slots=4)
    busy_pool(s)
    s.set_user("long", 1)
    s.submit(j := job("long", 100, stream=True), 100)
    s.dispatch(100)
    s.complete(j.id, 180, prompt_tokens=100, completion_tokens=4000)  # its usual answer is now 4,000
    assert typical_answer(s) == pytest.approx(1300, rel=0.001)  # moved by 0.1 of the 4,000 clipped at 4x
    # Weighted by length: (0.9 x 1,000^2 + 0.1 x 4,000^2) / (0.9 x 1,000 + 0.1 x 4,000).
    typical = slot_answer(s)
    assert typical == pytest.approx(2_500_000 / 1300, rel=0.001)
    s.submit(j := job("long", 180, stream=True), 180)
    s.dispatch(180)
    assert s.user("long").inflight_charge == pytest.approx(100 + 2 * typical)  # not 4,100 at once
    s.progress(j.id, 200, completion_tokens=100)
    assert s.user("long").inflight_charge == pytest.approx(100 + 100 + 2 * typical)
    s.progress(j.id, 240, completion_tokens=3000)
    assert s.user("long").inflight_charge == 100 + 4000  # never past its usual answer...
    s.progress(j.id, 250, completion_tokens=4500)  # it outlived its usual answer: charged ahead again
    assert s.user("long").inflight_charge == pytest.approx(100 + 4500 + 2 * typical)
    s.complete(j.id, 260, prompt_tokens=100, completion_tokens=4600)
    assert s.user("long").inflight_charge == 0 and s.user("long").served == 4100 + 4700  # settled at its cost


def test_idle_time_raises_burst_credits_and_contention_halves_them():
    settings = dataclasses.replace(TOKENS, credit_rate=2.0, max_burst_credits=1e9)
    s = make(settings)
    s.set_user("u", 3)
    s.submit(j := job("u", 0), 0)
    s.dispatch(0)
    s.complete(j.id, 1, prompt_tokens=1, completion_tokens=1)
    # Nothing queued from t=0 (dispatch emptied the queue): 10 idle seconds.
    assert s.share(10.0).burst_credits_per_weight == pytest.approx(20.0)
    s.submit(job("u", 10), 10)  # contention starts: halved
    assert s.share(10.0).burst_credits_per_weight == pytest.approx(10.0)
    assert s.share(20.0).burst_credits_per_weight == pytest.approx(10.0)  # no accrual while something is queued


def test_burst_credits_are_capped():
    s = make(dataclasses.replace(TOKENS, credit_rate=1.0, max_burst_credits=50))
    assert s.share(1000.0).burst_credits_per_weight == 50


def test_heavy_user_is_deprioritized_and_never_helped():
    from mindrouter.scheduler.fairness.pools import Pool, Seat, UserState

    pool = Pool(frozenset({1}), TOKENS)
    for factor in (0.1, 0.2, 0.5, 0.99, 1.0):
        for lag in (-5000.0, -10.0, 0.0, 10.0, 5000.0):
            for ref in (-100.0, 0.0, 100.0):
                plain = Seat(UserState("h", "h", None, 2.0), lag, 2.0)
                heavy = Seat(UserState("h", "h", None, 2.0), lag, 2.0, factor=factor)
                assert pool.priority(heavy, ref) <= pool.priority(plain, ref)


def scenario_2_order(threshold: float) -> list[str]:
    """After "heavy" monopolized the pool, "light" arrives with its own backlog: who gets the next slots."""
    s = make(
        dataclasses.replace(TOKENS, heavy_refresh_interval=0.0, return_credit=100, deprioritize_threshold=threshold)
    )
    s.set_user("heavy", 1)
    s.set_user("light", 1)
    s.add_usage("light", 100, 0, 0, "llama3")  # not alone in the window: heavy holds 90% of it
    for t in range(1, 10):
        served(s, "heavy", 100, t)
    for _ in range(6):
        s.submit(job("heavy", 10, max_tokens=0), 10)
        s.submit(job("light", 10, max_tokens=0), 10)
    order = []
    for t in range(11, 21):
        [d] = s.dispatch(t)
        order.append(d.job.user_id)
        s.complete(d.job.id, t, prompt_tokens=100, completion_tokens=0)
    return order


def test_deprioritization_serves_the_newcomer_one_request_more_and_never_starves():
    plain = scenario_2_order(threshold=1.0)  # nobody is ever heavy
    deprioritized = scenario_2_order(threshold=0.5)
    assert plain[:4] == ["light", "heavy", "light", "heavy"]  # the newcomer's one credit, then turns
    # Heavy (90% of the window, factor 0.2) is moved back by its capped handicap of one
    # credit: the newcomer gets two more requests first (one credit, plus the tie), no more.
    assert deprioritized[:4] == ["light", "light", "light", "heavy"]
    assert deprioritized.count("heavy") == 4 and plain.count("heavy") == 5  # then turns again


def test_wait_bonus_favours_the_older_job_between_equals():
    s = make()
    s.set_user("a", 1)
    s.set_user("b", 1)
    s.submit(job("b", 5.0), 5.0)
    s.submit(job("a", 1.0), 5.0)
    assert first_dispatched(s, 6.0) == "a"


@pytest.mark.parametrize(("return_debt", "behind"), [(None, 30_000), (1000.0, 1000)])
def test_returning_user_is_at_most_one_credit_ahead_and_keeps_its_debt(return_debt, behind):
    """Idle time banks one credit; what a user was charged stays, unless ``return_debt`` bounds it."""
    settings = dataclasses.replace(TOKENS, return_credit=1000, return_debt=return_debt)
    s = make(settings, slots=2)
    s.set_user("busy", 1)
    s.set_user("back", 1)
    s.set_user("greedy", 1)
    served(s, "greedy", 80_000, 0)  # 30,000 more than busy will get... then it leaves
    for t in range(1, 6):
        served(s, "busy", 10_000, t)
    s.submit(job("busy", 6, max_tokens=0), 6)  # busy waits: V is busy's lag
    s.submit(job("back", 6), 6)
    s.submit(job("greedy", 6), 6)
    v = deficit(s, "busy", 6)
    assert deficit(s, "back", 6) - v == pytest.approx(1000)  # idle banked only one credit
    assert deficit(s, "greedy", 6) - v == pytest.approx(-behind)  # service received is never erased
    assert [d.job.user_id for d in s.dispatch(6)] == ["back", "busy"]


def test_deficits_shift_together_and_keep_their_order():
    settings = dataclasses.replace(TOKENS, deficit_shift_threshold=1000)
    s = make(settings)
    s.set_user("a", 1)
    s.set_user("b", 2)
    for _ in range(3):
        s.submit(job("a", 0, prompt=3000, max_tokens=0), 0)
        s.submit(job("b", 0, prompt=3000, max_tokens=0), 0)
    for t in range(1, 4):
        [d] = s.dispatch(t)
        s.complete(d.job.id, t, prompt_tokens=3000, completion_tokens=0)
    [pool] = s.turns.fair.pools.values()
    before = {u: deficit(s, u, 3) for u in "ab"}
    shifts = pool.shifts
    assert pool.reference() < -1000
    assert pool.maybe_shift()
    assert pool.shifts == shifts + 1 and pool.reference() == 0
    assert {u: deficit(s, u, 3) for u in "ab"} == pytest.approx(before)


# -- routing: hard constraints ---------------------------------------------------


def routed_reasons(s: Scheduler, j: Job, now: float = 0.0) -> dict:
    s.submit(j, now)
    d = s.dispatch(now)
    return d[0].record.to_dict()["rejected"] if d else None


def two_backends(**second) -> Scheduler:
    s = Scheduler(TOKENS)
    s.set_backend(Backend(id=1, name="good", models=LLAMA, max_concurrent=4))
    s.set_backend(dataclasses.replace(Backend(id=2, name="other", models=LLAMA, max_concurrent=4), **second))
    s.set_user("u", 1)
    return s


@pytest.mark.parametrize(
    "second, job_kw, reason",
    [
        ({"models": frozenset({"mistral"})}, {}, REASONS["model"]),
        ({"modalities": frozenset({Modality.CHAT})}, {"modality": Modality.EMBEDDINGS}, REASONS["modality"]),
        ({"supports_json": False}, {"json_mode": True}, REASONS["json"]),
        ({"healthy": False}, {}, REASONS["unhealthy"]),
        ({"draining": True}, {}, REASONS["draining"]),
        ({"enabled": False}, {}, REASONS["disabled"]),
        ({"max_concurrent": 0}, {}, REASONS["capacity"]),
        ({"vram_free": 4_000, "model_vram": {"llama3": 5_000}}, {}, REASONS["memory"]),
    ],
)
def test_each_hard_constraint_rejects_with_its_reason(second, job_kw, reason):
    s = two_backends(**second)
    rejected = routed_reasons(s, job("u", **job_kw))
    assert rejected == {"2": [reason]}


def test_loaded_model_fits_even_without_free_vram():
    s = two_backends(vram_free=0, model_vram={"llama3": 5_000}, loaded_models=LLAMA)
    s.submit(job("u"), 0)
    [d] = s.dispatch(0)
    assert d.backend_id == 2 and d.record.to_dict()["rejected"] == {}


def test_capacity_is_never_exceeded_and_the_rest_waits():
    s = make(backends=2, slots=2)
    s.set_user("u", 1)
    for _ in range(10):
        s.submit(job("u"), 0)
    assert len(s.dispatch(0)) == 4
    assert s.dispatch(0) == []
    assert s.queued_count == 6
    s.check()


def test_unknown_model_fails_at_once_with_404():
    s = make()
    s.set_user("u", 1)
    r = s.submit(job("u", model="gpt-17"), 0)
    assert r.status == 404 and "gpt-17" in r.message


def test_unsupported_json_mode_fails_at_once_with_400():
    s = make(supports_json=False)
    s.set_user("u", 1)
    r = s.submit(job("u", json_mode=True), 0)
    assert r.status == 400 and "JSON" in r.message


def test_no_live_backend_is_503_with_retry_after():
    s = make(healthy=False)
    s.set_user("u", 1)
    r = s.submit(job("u"), 0)
    assert r.status == 503 and r.retry_after


def test_user_queue_limit_is_429():
    s = make(dataclasses.replace(TOKENS, max_queued_per_user=2), slots=0)
    s.set_user("u", 1)
    assert s.submit(job("u"), 0) is None
    assert s.submit(job("u"), 0) is None
    assert s.submit(job("u"), 0).status == 429


def test_the_pools_queue_limit_refuses_those_who_filled_it_not_a_newcomer():
    """Issue 28: ``max_queued`` refused everyone once a few users filled it, idle models too. A tenth of it is
    kept for users (and proxies) with nothing queued; those who filled the rest are refused."""
    s = make(SchedulerSettings(max_queued=10, max_queued_per_user=100), slots=0)
    for user in "abc":
        s.set_user(user, 1)
    for i in range(9):
        assert s.submit(job("abc"[i % 3]), 0) is None
    refusal = s.submit(job("a"), 0)
    assert (refusal.status, refusal.code, refusal.retry_after) == (429, "queue_full", 5.0)
    s.set_user("d", 5)
    assert s.submit(job("d"), 0) is None  # nothing queued: the reserve takes it
    assert s.submit(job("d"), 0).code == "queue_full"  # the reserve is for a first request
    s.set_user("e", 1)
    assert s.submit(job("e"), 0).code == "queue_full"  # the memory bound stays: 10 in all
    assert s.queued_count == 10


def test_a_full_queue_never_refuses_a_job_an_idle_backend_can_start_now():
    s = make(SchedulerSettings(max_queued=4, max_queued_per_user=100), slots=0)
    s.set_backend(Backend(id=9, name="idle", models=frozenset({"other"}), max_concurrent=1))
    s.set_user("a", 1)
    for _ in range(4):
        assert s.submit(job("a"), 0) is None
    assert s.submit(job("a"), 0).code == "queue_full"
    s.set_user("b", 1)
    assert s.submit(idle := job("a", model="other"), 0) is None
    assert [d.job.id for d in s.dispatch(0)] == [idle.id]
    assert s.submit(job("b", model="other"), 0).code == "queue_full"  # its backend is busy now


def test_a_proxys_people_count_together_against_a_cap_of_their_own():
    s = make(SchedulerSettings(max_queued=100, max_queued_per_user=100, max_queued_per_proxy=5), slots=0)
    for i in range(6):
        s.set_user(f"p{i}", 1)
    for i in range(5):
        assert s.submit(job(f"p{i}", via="webui"), 0) is None
    refusal = s.submit(job("p5", via="webui"), 0)  # a new person, but the front end holds its share
    assert refusal.code == "queue_full" and "people" in refusal.message
    s.set_user("solo", 1)
    assert s.submit(job("solo"), 0) is None  # nobody outside the proxy's people is touched


def test_a_proxy_with_requests_queued_cannot_take_the_reserve_for_a_new_person():
    s = make(SchedulerSettings(max_queued=10, max_queued_per_user=100, max_queued_per_proxy=100), slots=0)
    for i in range(10):
        s.set_user(f"p{i}", 1)
    for i in range(9):
        assert s.submit(job(f"p{i}", via="webui"), 0) is None
    assert s.submit(job("p9", via="webui"), 0).code == "queue_full"
    s.set_user("solo", 1)
    assert s.submit(job("solo"), 0) is None


def test_queue_timeout_expires_jobs():
    s = make(dataclasses.replace(TOKENS, queue_timeout=30), slots=0)
    s.set_user("u", 1)
    s.submit(j := job("u", 0), 0)
    assert s.next_deadline() == 30
    assert s.expire(29) == []
    [e] = s.expire(30)
    assert e.job == j and e.waited == 30
    assert s.queued_count == 0 and s.next_deadline() is None


def test_a_busy_model_does_not_block_the_same_users_other_model():
    s = Scheduler(TOKENS)
    s.set_backend(Backend(id=1, name="a", models=frozenset({"big"}), max_concurrent=1))
    s.set_backend(Backend(id=2, name="b", models=frozenset({"small"}), max_concurrent=1))
    s.set_user("u", 1)
    s.submit(job("u", model="big"), 0)
    s.submit(job("u", model="big"), 0)
    s.submit(job("u", model="small"), 0)
    models = sorted(d.job.model for d in s.dispatch(0))
    assert models == ["big", "small"]


# -- routing: where the job is expected to finish first ------------------------


@pytest.mark.parametrize(
    "better, worse",
    [
        ({"loaded_models": LLAMA}, {}),
        ({"utilization": 0.1}, {"utilization": 0.9}),
        ({"backend_waiting": 0}, {"backend_waiting": 3}),
        ({"priority": 5}, {}),
        ({"model_sizes": {"llama3": 10**9}}, {"model_sizes": {"llama3": 20 * 10**9}}),
    ],
)
def test_each_term_of_the_estimate_wins_when_all_else_is_equal(better, worse):
    for order in (0, 1):
        s = Scheduler(TOKENS)
        specs = [(1, better), (2, worse)] if order == 0 else [(1, worse), (2, better)]
        for bid, kw in specs:
            s.set_backend(Backend(id=bid, name=f"b{bid}", models=LLAMA, max_concurrent=4, **kw))
        s.set_user("u", 1)
        s.submit(job("u"), 0)
        [d] = s.dispatch(0)
        assert d.backend_id == (1 if order == 0 else 2)
        scores = d.record.to_dict()["scores"]
        assert scores[str(d.backend_id)] > min(scores.values())


def test_a_faster_learned_decode_rate_wins_and_the_record_says_when_each_would_finish():
    s = Scheduler(TOKENS)
    for bid in (1, 2):
        s.set_backend(Backend(id=bid, name=f"b{bid}", models=LLAMA, loaded_models=LLAMA, max_concurrent=1))
    s.set_user("u", 1)
    s.submit(job("u"), 0)
    s.submit(job("u"), 0)
    for d in s.dispatch(0):  # one on each: b1 writes 10 tokens a second, b2 100
        fast = d.backend_id == 2
        s.complete(d.job.id, 1, prompt_tokens=100, completion_tokens=100 if fast else 10, duration=1.0)
    s.submit(job("u", max_tokens=200), 1)
    [d] = s.dispatch(1)
    assert d.backend_id == 2
    parts = d.record.to_dict()["score_components"]
    assert parts["2"]["decode_rate"] == pytest.approx(100) and parts["1"]["decode_rate"] == pytest.approx(10)
    assert parts["2"]["learned"] and parts["1"]["learned"]
    # The answer expected is the user's usual one (an average of 10 and 100 tokens), within max_tokens.
    assert parts["1"]["decode"] == pytest.approx(10 * parts["2"]["decode"], rel=1e-3)
    assert parts["2"]["finish"] < parts["1"]["finish"] and parts["2"]["start"] == 0


def test_shorter_queue_wins_through_our_own_in_flight_count():
    s = Scheduler(TOKENS)
    for bid in (1, 2):
        s.set_backend(Backend(id=bid, name=f"b{bid}", models=LLAMA, max_concurrent=4))
    s.set_user("u", 1)
    for _ in range(4):
        s.submit(job("u"), 0)
    assert sorted(d.backend_id for d in s.dispatch(0)) == [1, 1, 2, 2]


def test_completion_measures_latency_and_throughput():
    s = make()
    s.set_user("u", 1)
    s.submit(j := job("u"), 0)
    s.dispatch(0)
    s.complete(j.id, 2, prompt_tokens=10, completion_tokens=100, latency=0.5, duration=2.0)
    assert s.load(1).latency_ema == 0.5 and s.load(1).tokens_per_second == 50


# -- decision records -------------------------------------------------------------


def test_record_has_the_seed_shape_and_the_priority_terms():
    s = two_backends(models=frozenset({"other"}))
    s.set_user("u", 3, group="faculty")
    s.submit(j := job("u"), 0)
    [d] = s.dispatch(2.0)
    rec = d.record.to_dict()
    for key in SEED_RECORD_KEYS:
        assert key in rec
    assert rec["request_id"] == j.id and rec["selected_backend_id"] == 1
    assert rec["candidate_backends"] == [1] and rec["user_weight"] == 3 and rec["user_group"] == "faculty"
    assert rec["rejected"] == {"2": [REASONS["model"]]}
    assert rec["queue_wait"] == 2.0
    assert rec["priority"]["wait_bonus"] == pytest.approx(2.0 * s.settings.wait_bonus_per_second)


# -- outcomes -------------------------------------------------------------------


def test_cancel_queued_and_running_free_everything():
    s = make(slots=1)
    s.set_user("u", 1)
    s.submit(a := job("u"), 0)
    s.submit(b := job("u"), 0)
    s.dispatch(0)
    assert s.cancel(b.id, 1) and not s.is_queued(b.id)
    assert s.cancel(a.id, 1, completion_tokens=7)
    assert s.load(1).in_flight == 0 and s.running_count == 0
    assert deficit(s, "u") == 256 - (100 + 7)
    assert not s.cancel(a.id, 2)
    s.check()


def test_failure_before_first_byte_retries_elsewhere():
    s = Scheduler(TOKENS)
    for bid in (1, 2):
        s.set_backend(Backend(id=bid, name=f"b{bid}", models=LLAMA, max_concurrent=1))
    s.set_user("u", 1)
    s.submit(j := job("u"), 0)
    [d] = s.dispatch(0)
    assert s.fail(j.id, 1, retry=True)
    assert s.load(d.backend_id).in_flight == 0 and s.is_queued(j.id)
    [again] = s.dispatch(1)
    assert again.job.id == j.id and again.backend_id != d.backend_id
    assert again.record.attempt == 2
    assert again.record.terms.deficit == 256  # the failed attempt was refunded: still one credit above V
    assert not s.fail(j.id, 2, retry=False) or s.load(again.backend_id).in_flight == 0


def test_complete_without_usage_charges_the_estimate():
    s = make()
    s.set_user("u", 1)
    s.submit(j := job("u", prompt=100, max_tokens=50), 0)
    s.dispatch(0)
    s.complete(j.id, 1)
    assert deficit(s, "u") == 256 - 150


def test_snapshot_has_the_seed_shape():
    s = make(slots=0)
    s.set_user(1, 3, group="faculty")
    s.set_user(2, 1, group="student")
    s.submit(job(1, 0), 0)
    s.submit(job(1, 0, model="llama3"), 0)
    s.submit(job(2, 1), 1)
    snap = s.snapshot(3)
    assert snap["queue"]["total"] == 3
    assert snap["queue"]["by_user"] == {"1": 2, "2": 1}
    assert snap["queue"]["by_model"] == {"llama3": 3}
    assert snap["queue"]["average_wait_seconds"] == pytest.approx((3 + 3 + 2) / 3, abs=1e-3)
    fs = snap["fair_share"]
    assert fs["total_users"] == 2 and {"user_id", "weight", "deficit", "recent_tokens", "group"} <= set(
        fs["user_stats"][0]
    )


def test_weights_must_be_finite_and_positive():
    s = Scheduler(TOKENS)
    for bad in (0, -1, math.nan, math.inf):
        with pytest.raises(ValueError):
            s.set_user("u", bad)


def test_a_user_alone_in_the_window_is_not_heavy():
    s = make(dataclasses.replace(TOKENS, heavy_refresh_interval=0.0))
    s.set_user("solo", 1)
    s.set_user("idle", 1)
    s.add_usage("solo", 2000, 0, 0, "llama3")
    s.dispatch(1.0)
    assert s.share(1.0).user("solo").factor == 1.0
    s.add_usage("idle", 10, 0, 1.0, "llama3")
    s.dispatch(2.0)
    assert s.share(2.0).user("solo").factor == pytest.approx(0.1)


def heavy_factor_of(usage: dict[str, tuple[float, int]]) -> dict[str, float]:
    """Each user's factor after the window holds ``usage`` ({name: (tokens, weight)}); one credit is 100."""
    s = make(dataclasses.replace(TOKENS, heavy_refresh_interval=0.0, return_credit=100))
    for name, (tokens, weight) in usage.items():
        s.set_user(name, weight)
        s.add_usage(name, tokens, 0, 0, "llama3")
    s.dispatch(1.0)
    return {name: s.share(1.0).user(name).factor for name in usage}


def test_heavy_is_measured_against_entitlement_and_beyond_noise():
    # An admin (weight 10) using 91% next to a student (weight 1) uses what it is entitled to.
    assert heavy_factor_of({"admin": (91_000, 10), "student": (9_000, 1)}) == {"admin": 1.0, "student": 1.0}
    # Between equals, 150 tokens beyond half (under two credits) is the scheduler's own granularity.
    assert heavy_factor_of({"a": (2_300, 1), "b": (2_000, 1)}) == {"a": 1.0, "b": 1.0}
    # 3,000 of 4,000 is 1,000 beyond half: heavy, with the seed's factor for 75%.
    assert heavy_factor_of({"a": (3_000, 1), "b": (1_000, 1)}) == {"a": pytest.approx(0.5), "b": 1.0}


def test_a_retry_waits_for_another_live_backend_instead_of_the_one_that_failed():
    s = Scheduler(TOKENS)
    for bid in (1, 2):
        s.set_backend(Backend(id=bid, name=f"b{bid}", models=LLAMA, max_concurrent=1))
    s.set_user("u", 1)
    s.submit(busy := job("u", 0), 0)
    s.submit(j := job("u", 0), 0)
    placed = {d.job.id: d.backend_id for d in s.dispatch(0)}
    failed_on = placed[j.id]
    assert s.fail(j.id, 1, retry=True)
    assert s.dispatch(1) == []  # its failed backend is free, but the other one is live: wait for it
    s.complete(busy.id, 2, prompt_tokens=1, completion_tokens=1)
    [again] = s.dispatch(2)
    assert again.job.id == j.id and again.backend_id != failed_on


def test_a_retry_goes_back_to_the_failed_backend_when_no_other_is_live():
    s = Scheduler(TOKENS)
    s.set_backend(Backend(id=1, name="only", models=LLAMA, max_concurrent=1))
    s.set_backend(Backend(id=2, name="down", models=LLAMA, max_concurrent=1, healthy=False))
    s.set_user("u", 1)
    s.submit(j := job("u", 0), 0)
    [d] = s.dispatch(0)
    assert s.fail(j.id, 1, retry=True)
    [again] = s.dispatch(1)
    assert again.backend_id == d.backend_id == 1
    assert again.record.candidates[0].penalty > 0


def test_a_weight_change_prices_again_what_was_charged_ahead_for_service_still_to_come():
    """Service is charged at the weight of the moment it is produced, so a raise applies to running streams too."""
    s = make(backends=1, slots=4)
    s.set_user("a", 1)
    s.submit(j := job("a", 0, prompt=100, max_tokens=300, stream=True), 0)
    s.dispatch(0)
    s.progress(j.id, 1, completion_tokens=100)
    charged = s.user("a").inflight_charge
    assert charged == pytest.approx(100 + 300)  # its prompt and its 300-token answer, 200 of it still to come
    (pool,) = s.turns.fair.pools.values()
    before = pool.seats["a"].lag
    s.set_user("a", 2)
    # The 200 tokens to come cost 200 at weight 1 and 100 at weight 2: the lag moves up by 100, what was
    # produced (the prompt and 100 tokens) stays charged at weight 1.
    assert pool.seats["a"].lag == pytest.approx(before + 100)
    s.complete(j.id, 2, prompt_tokens=100, completion_tokens=300)
    assert s.user("a").inflight_charge == 0


def test_usage_counts_at_the_weight_of_its_time_in_who_is_heavy():
    """A user who used 75% at weight 3 is not heavy once its weight falls to 1: past use keeps its weight."""
    s = make(dataclasses.replace(TOKENS, heavy_refresh_interval=0.0, return_credit=100))
    s.set_user("prof", 3)
    s.set_user("student", 1)
    s.add_usage("prof", 3_000, 0, 0, "llama3")
    s.add_usage("student", 1_000, 0, 0, "llama3")
    s.dispatch(1.0)
    assert s.share(1.0).user("prof").factor == 1.0
    s.set_user("prof", 1)
    s.dispatch(2.0)
    assert s.share(2.0).user("prof").factor == 1.0
    s.add_usage("prof", 3_000, 0, 2.0, "llama3")  # at weight 1, using 3 times the student's: heavy
    s.dispatch(3.0)
    assert s.share(3.0).user("prof").factor < 1.0


def test_an_active_share_lists_only_who_is_queued_running_or_used_the_window():
    """A listing's cost follows the people active, not the 10,000 registered (issue 33: 56 ms a `/v1/me`)."""
    s = make(slots=1)
    for uid in range(10_000):
        s.set_user(uid, 1, name=f"u{uid}")
    served(s, 7, 500, 0.0)  # used the window
    s.submit(job(8, 1.0), 1.0)  # running
    s.submit(job(9, 1.0), 1.0)  # queued behind it
    s.dispatch(1.0)
    share = s.share(2.0, active=True)
    assert sorted(u.user_id for u in share.users) == [7, 8, 9]
    assert share.user(7).recent_tokens == 500 and share.user(9).queued == 1 and share.user(8).running == 1
    assert [sorted(p.users) for p in share.pools] == [["u7", "u8", "u9"]]
    assert len(s.share(2.0).users) == 10_000  # everyone, as before, where asked
    everyone = {u.user_id: u.target_share for u in s.share(2.0).users}
    assert {u.user_id: u.target_share for u in share.users} == {7: pytest.approx(1 / 3), 8: 1 / 3, 9: 1 / 3}
    assert all(everyone[u.user_id] == u.target_share for u in share.users) and everyone[5] is None
    later = TOKENS.fairness_window + 10.0
    s.complete(next(j.id for j, _ in s.running_jobs()), later, prompt_tokens=1, completion_tokens=0)
    for j in list(s.queued_jobs()):
        s.cancel(j.id, later)
    s.dispatch(later + TOKENS.fairness_window + 1)  # the window moves past every request
    assert s.share(later + TOKENS.fairness_window + 1, active=True).users == ()
    s.check()
