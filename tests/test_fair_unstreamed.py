"""Issue 18: a whole (non-streamed) answer is charged as it is produced, by the clock.

A non-streamed job reports nothing before its end, so the core charges it at
least what it would have produced by now at the rate one stream of that
(backend, model) was seen to get, capped by ``max_tokens``, and settles it
exactly at the end. The rate is the one observed under the load it ran with:
the routing estimate's rate is scaled up to "one stream alone" by the
slowdown model (``stream_slowdown``), which a backend whose streams do not
slow each other never shows.
"""

from __future__ import annotations

import pytest

from mindrouter.scheduler import Backend, Job, Scheduler

PROMPT = 100


def core() -> Scheduler:
    s = Scheduler()
    s.set_backend(Backend(id="gpu", name="gpu", models=frozenset({"llama3"}), max_concurrent=4))
    for user in ("a", "b"):
        s.set_user(user, 1.0)
    return s


def run(s: Scheduler, job_id: str, user: str, now: float, *, stream: bool, max_tokens: int | None = None) -> None:
    job = Job(job_id, user, "llama3", now, prompt_tokens=PROMPT, stream=stream, max_tokens=max_tokens)
    assert s.submit(job, now) is None
    assert [d.job.id for d in s.dispatch(now)] == [job_id]


def teach(s: Scheduler) -> None:
    """Four streams of a at 50 tokens/s each, side by side, then b's 10-token whole answer."""
    for i in range(4):
        run(s, f"a{i}", "a", 0.0, stream=True)
    for i in range(4):
        s.complete(f"a{i}", 10.0, prompt_tokens=PROMPT, completion_tokens=500, latency=0.0, duration=10.0)
    run(s, "b0", "b", 10.0, stream=False)
    s.complete("b0", 10.2, prompt_tokens=PROMPT, completion_tokens=10, latency=0.2, duration=0.2)


def charge(s: Scheduler, user: str) -> float:
    view = s.user(user)
    assert view is not None
    return view.inflight_charge


def test_the_rate_a_stream_was_seen_to_get_is_not_scaled_by_the_slowdown_model():
    """Four streams at 50 tokens/s each: the estimate learns 80 for one alone (x 1.6), the stream got 50."""
    s = core()
    for i in range(4):
        run(s, f"a{i}", "a", 0.0, stream=True)
    s.complete("a0", 10.0, prompt_tokens=PROMPT, completion_tokens=500, latency=0.0, duration=10.0)
    load = s.load("gpu")
    assert load is not None
    speed = load.speeds["llama3"]
    assert speed.decode == pytest.approx(80.0)  # 50 x (1 + 0.2 x 3): the routing estimate's "alone" rate
    assert speed.observed == pytest.approx(50.0)


def test_a_running_whole_answer_is_charged_by_the_clock_up_to_max_tokens_and_settled_exactly():
    s = core()
    teach(s)
    cost = s.settings.cost
    run(s, "b1", "b", 20.0, stream=False, max_tokens=4000)
    at_start = charge(s, "b")
    assert at_start < cost(PROMPT, 1000)  # b's usual answer is short: charged little ahead
    s.dispatch(60.0)  # 40 s at 50 tokens/s: 2,000 produced
    assert cost(PROMPT, 2000) <= charge(s, "b") <= cost(PROMPT, 3000)
    s.dispatch(1000.0)
    assert charge(s, "b") == pytest.approx(cost(PROMPT, 4000))  # never past max_tokens
    before = s.user("b")
    assert before is not None
    s.complete("b1", 1000.0, prompt_tokens=PROMPT, completion_tokens=2500, latency=980.0, duration=980.0)
    after = s.user("b")
    assert after is not None
    assert after.inflight_charge == 0.0
    assert after.served - before.served == pytest.approx(cost(PROMPT, 2500))


def test_a_whole_answer_on_a_pair_with_no_observed_rate_is_charged_its_estimate():
    """No answer yet from that (backend, model): no rate to trust, so the clock charges nothing more."""
    s = core()
    run(s, "b1", "b", 0.0, stream=False, max_tokens=4000)
    at_start = charge(s, "b")
    s.dispatch(100.0)
    assert charge(s, "b") == at_start


def test_a_whole_answer_without_max_tokens_keeps_being_charged_ahead_of_the_clock():
    """No limit: the charge follows the clock past any estimate, each decision popping only what is due."""
    s = core()
    teach(s)
    run(s, "b1", "b", 20.0, stream=False)
    for now in (21.0, 100.0, 100.0, 500.0):
        s.dispatch(now)
        assert charge(s, "b") >= s.settings.cost(PROMPT, 50.0 * (now - 20.0))
    assert charge(s, "b") < s.settings.cost(PROMPT, 50.0 * 480.0 + 2000)
