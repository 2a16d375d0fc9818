"""A scenario's requests as a list: the same arrivals and sizes the simulator draws, for a live replay.

Issue 17 asks that the simulator and the live pool benchmark agree on the same
pool and workload. For open-loop users (``rate``) the simulator's draws depend
on nothing the scheduler does: each phase has its own ``random.Random``, seeded
from the scenario seed, the user's name and the phase's place among that user's
entries (``phase_rng``), and at each arrival it draws the next gap, then the
prompt and completion sizes (``draw_sizes``). ``arrivals`` replays exactly
that, so a benchmark can send the very requests ``mr simulate`` simulated.
Closed-loop users send when an answer ends, which only a run can tell.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from .scenario import Scenario, ScenarioError, UserSpec

__all__ = ["Arrival", "arrivals", "draw_sizes", "expected_sizes", "phase_rngs"]


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


def phase_rngs(scenario: Scenario) -> list[random.Random]:
    """One generator per ``[[users]]`` entry, seeded as the simulator seeds it."""
    seen: dict[str, int] = {}
    out = []
    for spec in scenario.users:
        k = seen[spec.name] = seen.get(spec.name, -1) + 1
        out.append(random.Random(f"{scenario.seed}/{spec.name}" + (f"/{k}" if k else "")))
    return out


def draw_sizes(spec: UserSpec, rng: random.Random) -> tuple[int, int]:
    """A request's prompt and completion tokens (the completion within ``max_tokens`` and ``leave_after``)."""
    low, high = spec.prompt_tokens
    prompt = low if low == high else rng.randint(low, high)
    low, high = spec.completion_tokens
    completion = low if low == high else rng.randint(low, high)
    if spec.max_tokens is not None:
        completion = min(completion, spec.max_tokens)
    if spec.leave_after is not None:
        completion = min(completion, spec.leave_after)
    return prompt, completion


def _mean_capped(low: int, high: int, cap: int | None) -> float:
    """The mean of ``min(k, cap)`` over the integers ``k`` from ``low`` to ``high``, each as likely."""
    if cap is None or cap >= high:
        return (low + high) / 2
    if cap <= low:
        return float(cap)
    below = (cap - low + 1) * (low + cap) / 2  # k = low .. cap counts itself
    return (below + (high - cap) * cap) / (high - low + 1)


def expected_sizes(spec: UserSpec) -> tuple[float, float]:
    """A phase's mean prompt and completion tokens per request, as ``draw_sizes`` draws them."""
    caps = [c for c in (spec.max_tokens, spec.leave_after) if c is not None]
    return (sum(spec.prompt_tokens) / 2, _mean_capped(*spec.completion_tokens, min(caps) if caps else None))


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
        prompt, completion = draw_sizes(spec, rng)
        sent[i] += 1
        out.append(Arrival(now, spec.name, spec.model, prompt, completion, spec.max_tokens, i))
    return out
