"""Issue 9's table, row by row, against the core alone: plain calls, explicit times.

``Lab`` drives the scheduler the way the daemon does, in steps of ``STEP``
seconds: each user keeps its requests in flight or queued, a running request
streams 50 tokens/s per slot and reports its progress every step (the daemon
batches every 32 chunks or 100 ms), and ends with the backend's own counts.
Shares are token shares (prompt and answer, as the cost counts them) per 60 s
window among the users of one pool; a user
is *starved* while it has a request queued and none of its requests starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from mindrouter.scheduler import Backend, Job, Scheduler, SchedulerSettings

STEP = 0.25
RATE = 50.0
"""Tokens per second each running request streams."""
PROMPT = 100


@dataclass
class Phase:
    user: str
    model: str
    start: float
    stop: float
    concurrency: int = 8
    answer: int = 300


@dataclass
class _Run:
    job: Job
    tokens: int
    done: float = 0.0


@dataclass
class Lab:
    backends: dict[str, tuple[str, int]]
    """name: (model, slots)"""
    users: dict[str, float]
    """name: weight"""
    phases: list[Phase]
    settings: SchedulerSettings = field(default_factory=SchedulerSettings)
    groups: dict[str, str] = field(default_factory=dict)
    """user: group (group shares)"""
    events: dict[float, Callable[[Scheduler], None]] = field(default_factory=dict)

    def run(self, duration: float) -> Lab:
        s = self.s = Scheduler(self.settings)
        for name, (model, slots) in self.backends.items():
            s.set_backend(Backend(id=name, name=name, models=frozenset({model}), max_concurrent=slots))
        for name, weight in self.users.items():
            s.set_user(name, weight, group=self.groups.get(name))
        self.tokens: dict[tuple[int, str, str], float] = {}  # (window, model, user) -> tokens
        self.starved = dict.fromkeys(self.users, 0.0)
        waiting_since: dict[str, float | None] = dict.fromkeys(self.users)
        running: dict[str, _Run] = {}
        outstanding = {id(p): 0 for p in self.phases}
        owner: dict[str, Phase] = {}
        n = 0
        t = 0.0
        while t < duration:
            if t in self.events:
                self.events[t](s)
            for jid, run in list(running.items()):
                streamed = min(RATE * STEP, run.tokens - run.done)
                run.done += streamed
                key = (int(t // 60), run.job.model, run.job.user_id)
                self.tokens[key] = self.tokens.get(key, 0.0) + streamed
                if run.done >= run.tokens:
                    del running[jid]
                    s.complete(jid, t, prompt_tokens=PROMPT, completion_tokens=run.tokens)
                    outstanding[id(owner.pop(jid))] -= 1
                else:
                    s.progress(jid, t, completion_tokens=int(run.done))
            for phase in self.phases:
                while phase.start <= t < phase.stop and outstanding[id(phase)] < phase.concurrency:
                    n += 1
                    job = Job(f"j{n}", phase.user, phase.model, t, prompt_tokens=PROMPT, stream=True)
                    assert s.submit(job, t) is None
                    owner[job.id] = phase
                    outstanding[id(phase)] += 1
            for d in s.dispatch(t):
                running[d.job.id] = _Run(d.job, owner[d.job.id].answer)
                key = (int(t // 60), d.job.model, d.job.user_id)
                self.tokens[key] = self.tokens.get(key, 0.0) + PROMPT  # the prompt counts as it starts
                waiting_since[d.job.user_id] = None
            assert not s.expire(t), "a request timed out"
            queued = {j.user_id for j in s.queued_jobs()}
            for user in self.users:
                if user not in queued:
                    waiting_since[user] = None
                elif waiting_since[user] is None:
                    waiting_since[user] = t
                else:
                    self.starved[user] = max(self.starved[user], t - waiting_since[user])  # type: ignore[operator]
            t = round(t + STEP, 6)
        s.check()
        return self

    def shares(self, model: str, windows: range) -> dict[int, dict[str, float]]:
        """Each window's token shares among the users of ``model``'s pool."""
        out = {}
        for w in windows:
            row = {u: self.tokens.get((w, model, u), 0.0) for u in self.users}
            total = sum(row.values())
            out[w] = {u: v / total for u, v in row.items() if v}
        return out


def within(shares: dict[int, dict[str, float]], target: dict[str, float], points: float) -> bool:
    return all(abs(window.get(u, 0.0) - share) <= points for window in shares.values() for u, share in target.items())


REQUEST_S = 300 / RATE
"""Seconds one 300-token answer takes."""


def test_row1_model_switch_is_not_held_against_the_user():
    """x used qwen alone for 10 min, then asks for llama3, where y has been busy: no hours of 504s."""
    lab = Lab(
        {"gpu-a": ("qwen", 8), "gpu-b": ("llama3", 4)},
        {"x": 1, "y": 1},
        [Phase("x", "qwen", 0, 600), Phase("x", "llama3", 600, 1200), Phase("y", "llama3", 0, 1200)],
    ).run(1200)
    assert within(lab.shares("llama3", range(12, 20)), {"x": 0.5, "y": 0.5}, 0.05)
    assert lab.starved["x"] <= 3 * REQUEST_S and lab.starved["y"] <= 3 * REQUEST_S


def test_row2_newcomer_is_placed_against_its_own_pool():
    """c arrives on llama3 while a (qwen) and b (llama3) are busy: b keeps its half."""
    lab = Lab(
        {"gpu-a": ("qwen", 4), "gpu-b": ("llama3", 4)},
        {"a": 1, "b": 1, "c": 1},
        [Phase("a", "qwen", 0, 900), Phase("b", "llama3", 0, 900), Phase("c", "llama3", 300, 900)],
    ).run(900)
    assert within(lab.shares("llama3", range(7, 15)), {"b": 0.5, "c": 0.5}, 0.05)
    assert max(lab.starved.values()) <= 3 * REQUEST_S


@pytest.mark.parametrize(("weight", "share"), [(2, 2 / 3), (0.5, 1 / 3)])
def test_row3_weight_change_after_long_uptime_acts_from_now_on(weight, share):
    """`mr user set-weight a W` after 30 min of saturation: the new split at once, nobody stalls."""
    lab = Lab(
        {"gpu": ("llama3", 4)},
        {"a": 1, "b": 1},
        [Phase("a", "llama3", 0, 2400), Phase("b", "llama3", 0, 2400)],
        events={1800.0: lambda s: s.set_user("a", weight)},
    ).run(2400)
    assert within(lab.shares("llama3", range(10, 30)), {"a": 0.5, "b": 0.5}, 0.05)
    assert within(lab.shares("llama3", range(32, 40)), {"a": share, "b": 1 - share}, 0.05)
    assert max(lab.starved.values()) <= 3 * REQUEST_S


def test_row4_one_huge_request_does_not_make_every_return_a_monopoly():
    """After one 30,000-token answer, users back from idle get one typical request of credit, not 30,000."""
    lab = Lab(
        {"gpu": ("llama3", 4)},
        {"big": 1, "a": 1, "b": 1},
        [
            Phase("big", "llama3", 0, 1, concurrency=1, answer=30_000),
            Phase("a", "llama3", 0, 1200),
            Phase("b", "llama3", 0, 300),
            Phase("b", "llama3", 420, 1200),  # b comes back after 2 idle minutes
        ],
    ).run(1200)
    huge = lab.s.share(1200).pools[0].typical_request
    assert huge < 1000  # the typical request, not the 30,100 seen once
    assert within(lab.shares("llama3", range(9, 20)), {"a": 0.5, "b": 0.5}, 0.05 + 1 / 4)  # big's slot: 1 of 4
    assert max(lab.starved.values()) <= 3 * REQUEST_S


def test_row5_answers_that_jump_are_charged_as_they_stream():
    """b's answers jump from 10 to 4,000 tokens: charged as they stream, shares hold within a slot's share."""
    lab = Lab(
        {"gpu1": ("llama3", 4), "gpu2": ("llama3", 4)},
        {"a": 1, "b": 1},
        [
            Phase("a", "llama3", 0, 1500, concurrency=16),
            Phase("b", "llama3", 0, 600, concurrency=16, answer=10),
            Phase("b", "llama3", 600, 1500, concurrency=16, answer=4000),
        ],
    ).run(1500)
    # A 4,000-token answer outlasts a window (80 s): one slot of eight, plus 2 points, is allowed.
    assert within(lab.shares("llama3", range(13, 25)), {"a": 0.5, "b": 0.5}, 1 / 8 + 0.02)
    assert lab.starved["a"] <= 3 * REQUEST_S and lab.starved["b"] <= 3 * 4000 / RATE


def test_row6_admin_with_weight_10_using_its_share_is_not_heavy():
    lab = Lab(
        {"gpu1": ("llama3", 4), "gpu2": ("llama3", 4)},
        {"admin": 10, "s1": 1, "s2": 1},
        [Phase("admin", "llama3", 0, 900, 16), Phase("s1", "llama3", 0, 900, 16), Phase("s2", "llama3", 0, 900, 16)],
    ).run(900)
    share = lab.s.share(900)
    assert {u.name: u.factor for u in share.users} == {"admin": 1.0, "s1": 1.0, "s2": 1.0}
    assert within(lab.shares("llama3", range(2, 15)), {"admin": 10 / 12, "s1": 1 / 12, "s2": 1 / 12}, 0.05)


def test_row7_group_shares_give_the_faculty_member_half_next_to_20_students():
    students = {f"s{i:02d}": 1.0 for i in range(20)}
    lab = Lab(
        {f"gpu{i}": ("llama3", 8) for i in range(4)},
        {"prof": 1.0, **students},
        [Phase("prof", "llama3", 0, 600, 16), *(Phase(s, "llama3", 0, 600, 4) for s in students)],
        settings=SchedulerSettings(shares="group"),
        groups={"prof": "faculty", **dict.fromkeys(students, "student")},
    ).run(600)
    weights = {u.name: round(u.seats[0].weight, 3) for u in lab.s.share(600).users}
    assert weights["prof"] == 1.0 and weights["s00"] == 0.05  # the student group's 1, split 20 ways
    windows = lab.shares("llama3", range(2, 10))
    assert within(windows, {"prof": 0.5}, 0.05)
    assert within(windows, students.fromkeys(students, 0.025), 0.01)


def test_row8_users_alone_on_separate_models_do_not_compete():
    lab = Lab(
        {"gpu-a": ("qwen", 4), "gpu-b": ("llama3", 4)},
        {"x": 1, "y": 1},
        [Phase("x", "qwen", 0, 600), Phase("y", "llama3", 0, 600)],
    ).run(600)
    assert within(lab.shares("qwen", range(1, 10)), {"x": 1.0}, 0.0)
    assert within(lab.shares("llama3", range(1, 10)), {"y": 1.0}, 0.0)
    pools = lab.s.share(600).pools
    assert sorted(p.users for p in pools) == [("x",), ("y",)] and all(not p.heavy for p in pools)
