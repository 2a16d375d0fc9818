"""A scenario's requests as a list: the same arrivals and sizes the simulator draws, for a live replay.

Issue 17 asks that the simulator and the live pool benchmark agree on the same
pool and workload. For open-loop users (``rate``) the simulator's draws depend
on nothing the scheduler does: each phase has its own ``random.Random``, seeded
from the scenario seed, the user's name and the phase's place among that user's
entries (``phase_rng``), and at each arrival it draws the next gap, then the
prompt and completion sizes (``draw_sizes``). ``arrivals`` replays exactly
that, so a benchmark can send the very requests ``mr simulate`` simulated.
Closed-loop users send when an answer ends, which only a run can tell. A
conversation (``conversations.py``) is drawn whole when it starts, so the
listing gives its first turn's time and every turn's sizes and pauses; when
its later turns leave depends on when the answers end.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from .conversations import Conversation, Turn
from .scenario import Scenario, ScenarioError, Seconds, Tokens, UserSpec

__all__ = [
    "Arrival",
    "arrivals",
    "draw_conversation",
    "draw_seconds",
    "draw_sizes",
    "expected_sizes",
    "phase_rngs",
]


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request as the simulator submits it."""

    at: float
    user: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    """What the backend should generate (already within ``max_tokens``)."""
    max_tokens: int | None
    phase: int
    """Index of its ``[[users]]`` entry."""
    conversation: Conversation | None = None
    """The conversation it opens (its first turn is this request), or None for a single request."""


def phase_rngs(scenario: Scenario) -> list[random.Random]:
    """One generator per ``[[users]]`` entry, seeded as the simulator seeds it."""
    seen: dict[str, int] = {}
    out = []
    for spec in scenario.users:
        k = seen[spec.name] = seen.get(spec.name, -1) + 1
        out.append(random.Random(f"{scenario.seed}/{spec.name}" + (f"/{k}" if k else "")))
    return out


def draw_tokens(tokens: Tokens, rng: random.Random) -> int:
    low, high = tokens
    return low if low == high else rng.randint(low, high)


def draw_seconds(seconds: Seconds, rng: random.Random) -> float:
    low, high = seconds
    return low if low == high else rng.uniform(low, high)


def draw_sizes(spec: UserSpec, rng: random.Random) -> tuple[int, int]:
    """A request's prompt and completion tokens (the completion within ``max_tokens`` and ``leave_after``)."""
    prompt = draw_tokens(spec.prompt_tokens, rng)
    completion = draw_tokens(spec.completion_tokens, rng)
    if spec.max_tokens is not None:
        completion = min(completion, spec.max_tokens)
    if spec.leave_after is not None:
        completion = min(completion, spec.leave_after)
    return prompt, completion


def draw_conversation(spec: UserSpec, rng: random.Random, key: str, system: int) -> Conversation:
    """A conversation of ``spec``'s as it starts: how many turns, each one's message, answer and pause."""
    turns = []
    for k in range(draw_tokens(spec.turns, rng)):
        message, completion = draw_sizes(spec, rng)
        turns.append(Turn(message, completion, draw_seconds(spec.think_time, rng) if k else 0.0))
    return Conversation(key, spec.app, system, tuple(turns))


def _mean_capped(low: int, high: int, cap: int | None) -> float:
    """The mean of ``min(k, cap)`` over the integers ``k`` from ``low`` to ``high``, each as likely."""
    if cap is None or cap >= high:
        return (low + high) / 2
    if cap <= low:
        return float(cap)
    below = (cap - low + 1) * (low + cap) / 2  # k = low .. cap counts itself
    return (below + (high - cap) * cap) / (high - low + 1)


def expected_sizes(spec: UserSpec, system: int = 0) -> tuple[float, float]:
    """A phase's mean prompt and completion tokens per request, as ``draw_sizes`` draws them.

    A conversation's turn k resends ``system`` and k earlier messages and answers: over its T turns,
    a request's prompt is ``system + message + (message + answer) x E[T (T - 1) / 2] / E[T]``.
    """
    caps = [c for c in (spec.max_tokens, spec.leave_after) if c is not None]
    message = sum(spec.prompt_tokens) / 2
    completion = _mean_capped(*spec.completion_tokens, min(caps) if caps else None)
    if not spec.converses:
        return message, completion
    low, high = spec.turns
    pairs = sum(t * (t - 1) / 2 for t in range(low, high + 1)) / (high - low + 1)
    return system + message + (message + completion) * pairs / ((low + high) / 2), completion


def arrivals(scenario: Scenario) -> list[Arrival]:
    """Every request of an open-loop scenario, in the order the simulator submits them.

    Raises:
        ScenarioError: a phase is closed-loop (``concurrency``), whose arrivals depend on the run.
    """
    out: list[Arrival] = []
    heap: list[tuple[float, int]] = []
    rngs = phase_rngs(scenario)
    for i, spec in enumerate(scenario.users):
        if spec.rate is None:
            raise ScenarioError(
                f"users[{i}] ({spec.name}) is closed-loop (concurrency); only rate users make a replayable workload"
            )
        heap.append((spec.start + rngs[i].expovariate(spec.rate), i))
    heapq.heapify(heap)
    sent = [0] * len(scenario.users)
    while heap and heap[0][0] <= scenario.duration:
        now, i = heapq.heappop(heap)
        spec, rng = scenario.users[i], rngs[i]
        stop = scenario.duration if spec.stop is None else spec.stop
        if now >= stop or (spec.requests is not None and sent[i] >= spec.requests):
            continue
        assert spec.rate is not None
        nxt = now + rng.expovariate(spec.rate)
        if nxt < stop:
            heapq.heappush(heap, (nxt, i))
        sent[i] += 1
        if spec.converses:
            conv = draw_conversation(spec, rng, f"{i}/{sent[i]}", scenario.apps.get(spec.app or "", 0))
            first = conv.turns[0]
            out.append(
                Arrival(now, spec.name, spec.model, conv.prompt_tokens(0), first.completion, spec.max_tokens, i, conv)
            )
            continue
        prompt, completion = draw_sizes(spec, rng)
        out.append(Arrival(now, spec.name, spec.model, prompt, completion, spec.max_tokens, i))
    return out
