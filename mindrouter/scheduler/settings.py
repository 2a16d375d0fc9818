"""The scheduler's settings: one frozen object, handed in by whoever builds the core.

Every constant the scheduler uses lives here, so the simulator, the tests and
the daemon can all run the same core with different numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["DEFAULT_GROUP_WEIGHTS", "SHARES", "SchedulerSettings", "ScoreWeights", "check_weight"]

#: The seed's fallback weights (``SCHEDULER_WEIGHT_<GROUP>``).
DEFAULT_GROUP_WEIGHTS: dict[str, float] = {"student": 1.0, "staff": 2.0, "faculty": 3.0, "admin": 10.0}


#: The ways weights can divide a pool: per user, or per group and then among its active users.
SHARES = ("user", "group")


def check_weight(value: object) -> float:
    """Return ``value`` as a weight, or raise ValueError with a sentence a person can act on."""
    if isinstance(value, bool):
        raise ValueError(f"weight {value!r} is not a number; use a finite number greater than 0, such as 1 or 2.5")
    try:
        weight = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(
            f"weight {value!r} is not a number; use a finite number greater than 0, such as 1 or 2.5"
        ) from None
    if not math.isfinite(weight) or weight <= 0:
        raise ValueError(f"weight {value!r} must be a finite number greater than 0, such as 1 or 2.5")
    return weight


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    """Points each soft score can add to a backend (the seed's ``SCHEDULER_SCORE_*``)."""

    model_loaded: float = 100.0
    """Added when the requested model is already resident on the backend."""
    low_utilization: float = 50.0
    """Scaled by ``1 - utilization`` (GPU utilization or vLLM's KV-cache use)."""
    latency: float = 40.0
    """Scaled by ``latency_reference / (latency_reference + latency_ema)``."""
    short_queue: float = 30.0
    """Scaled by ``1 / (1 + depth)``, depth being requests in flight plus the backend's own queue."""
    high_throughput: float = 20.0
    """Scaled by ``tps / (tps + throughput_reference)`` from measured tokens per second."""


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """Fair-share and routing constants. Token amounts are in cost units (tokens by default)."""

    fairness_window: float = 300.0
    """Seconds of recent usage that decide who is a heavy user."""
    deprioritize_threshold: float = 0.5
    """A user holding more than this fraction of recent tokens is deprioritized."""
    min_deprioritization: float = 0.1
    """The deprioritization factor never goes below this."""
    credit_rate: float = 1.0
    """Burst credits gained per idle second, per unit of weight."""
    max_burst_credits: float = 10_000.0
    """Cap on burst credits, per unit of weight."""
    wait_bonus_per_second: float = 0.05
    """Priority gained per second a job waits (tie-breaker that favours older jobs)."""
    queue_timeout: float = 300.0
    """Seconds a job may wait for capacity before it fails with 504."""
    max_queued_per_user: int = 1000
    """Queued jobs one user may hold; more are refused with 429."""
    prompt_token_cost: float = 1.0
    """Fair-share cost of one prompt token."""
    completion_token_cost: float = 1.0
    """Fair-share cost of one completion token."""
    shares: str = "user"
    """How weights divide a pool: "user" (each user weighs its weight) or "group" (Slurm-style:
    a group's weight is its share, split among its active users by weight_override, 1 without one)."""
    return_credit: float | None = None
    """How far (in cost) a user entering contention may stand from the most-owed waiting user, ahead or
    behind. Unset means one typical request of that pool (a moving average of its completed requests)."""
    default_completion_tokens: int = 256
    """A pool's typical answer before any has completed there, and a user's usual answer before its first."""
    deficit_shift_threshold: float = 1e9
    """When deficits drift this far below zero (per unit of weight), all are shifted up together."""
    heavy_refresh_interval: float = 1.0
    """Seconds between re-evaluations of who is a heavy user."""
    latency_reference: float = 1.0
    """Seconds of latency at which the latency score is half its maximum."""
    throughput_reference: float = 50.0
    """Tokens per second at which the throughput score is half its maximum."""
    latency_ema_alpha: float = 0.2
    """Weight of the newest sample in the latency and throughput averages."""
    group_weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_GROUP_WEIGHTS))
    """Fallback weights by group name, used when a group has no weight of its own."""
    scores: ScoreWeights = field(default_factory=ScoreWeights)

    def __post_init__(self) -> None:
        if self.shares not in SHARES:
            raise ValueError(f'shares must be "user" or "group", not {self.shares!r}')

    def cost(self, prompt_tokens: float, completion_tokens: float) -> float:
        """The fair-share cost of a request."""
        return prompt_tokens * self.prompt_token_cost + completion_tokens * self.completion_token_cost
