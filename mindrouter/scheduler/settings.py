"""The scheduler's settings: one frozen object, handed in by whoever builds the core.

Every constant the scheduler uses lives here, so the simulator, the tests and
the daemon can all run the same core with different numbers.

Invariants: each field's docstring is its documentation (config.example.toml
and ``mr config show`` are written from it); the object never changes, and it
refuses values the core cannot work with (the config file's reader and the
simulator's refuse negative numbers before). The module-level numbers left in
``scheduler/`` are limits of what is valid, not choices: ``TOKEN_LIMIT`` and
the readings no hardware reaches (``routing/learning.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["DEFAULT_GROUP_WEIGHTS", "SERVICE_UNITS", "SHARES", "SchedulerSettings", "ScoreWeights", "check_weight"]

#: The seed's fallback weights (``SCHEDULER_WEIGHT_<GROUP>``).
DEFAULT_GROUP_WEIGHTS: dict[str, float] = {"student": 1.0, "staff": 2.0, "faculty": 3.0, "admin": 10.0}


#: The ways weights can divide a pool: per user, or per group and then among its active users.
SHARES = ("user", "group")

#: What a service unit follows: tokens at fixed weights, or the time a request holds the GPU.
SERVICE_UNITS = ("tokens", "gpu")


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
    """The seed's ``SCHEDULER_SCORE_*``: how much each term of the finish-time estimate weighs (``estimate.py``).

    At these defaults every term weighs 1x; twice a default weighs its term twice, 0 leaves it out.
    """

    model_loaded: float = 100.0
    """Weighs the seconds a load takes, and the reload that evicting an idle model costs."""
    low_utilization: float = 50.0
    """Weighs the slowdown from others' use of the GPU (its utilization while none of our streams run)."""
    latency: float = 40.0
    """Weighs the seconds of reading the prompt (prefill)."""
    short_queue: float = 30.0
    """Weighs the slowdown each stream already on the backend (or in its own queue) causes."""
    high_throughput: float = 20.0
    """Weighs the seconds of writing the answer (decode)."""


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """Fair-share and routing constants. Amounts charged are in service units (``cost``), not tokens."""

    fairness_window: float = 300.0
    """Seconds of recent usage that decide who is a heavy user."""
    deprioritize_threshold: float = 0.5
    """A user holding more than this fraction of recent service units (per unit of weight) is deprioritized."""
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
    max_queued_per_proxy: int = 1000
    """Queued jobs a proxy's people (and the proxy itself) may hold together; more are refused with 429, so one
    front end cannot fill the router's queue by naming new people."""
    max_queued: int = 10_000
    """Queued jobs in all, everyone's together; more are refused with 429 at once, which bounds the daemon's memory
    (each waiting request holds about 20 KB in aiohttp). A job that a backend can start at once is never refused."""
    queue_reserve: float = 0.1
    """Part of ``max_queued`` kept for the first request of a user (and proxy) with nothing queued: those who filled
    the rest are refused, a newcomer is not."""
    service_unit: str = "tokens"
    """What fair share divides: "tokens" (a prompt token costs ``prompt_token_cost``, an answer token
    ``completion_token_cost``: VTC's units) or "gpu" (a request costs the time it holds the GPU: an answer token
    costs ``completion_token_cost`` and a prompt token that times the model's measured decode rate over its
    prefill rate, an embedding's at the pool's decode rate; so a long-prompt reader, a long-answer writer and an
    embedder each get a third of the GPU's slot time, where tokens give the writer 91% at 50x prefill speed:
    docs/fairness.md)."""
    prompt_token_cost: float = 1.0
    """Service units one prompt token costs in fair share with ``service_unit = "tokens"`` (quotas count tokens).
    Must be greater than 0."""
    completion_token_cost: float = 2.0
    """Service units one answer token costs. Answers are written 10-20x slower than prompts are read; 2 (VTC's
    choice) gives a long-context user next to a chat user 23% of the GPU time instead of 16% at 1 (docs/fairness.md)."""
    shares: str = "user"
    """How weights divide a pool: "user" (each user weighs its weight) or "group" (Slurm-style:
    a group's weight is its share, split among its active users by weight_override, 1 without one)."""
    return_credit: float | None = None
    """How far (in cost) ahead of the most-owed waiting user a user whose queue was empty may stand when it sends
    again. Unset means one typical request of that pool (a moving average of its completed requests)."""
    return_debt: float | None = None
    """How far (in cost) behind the most-owed waiting user a user with nothing queued or running in a pool may
    stand when it sends again. Unset (the default) keeps everything it was charged, as VTC does: a debt is paid
    back by the others being served, so sending one request at a time, or leaving and returning, gains nothing."""
    anticipation: float = 0.1
    """Seconds a slot that a user's request just freed may be held for that user's next request (BFQ's device
    idling): only while it has nothing queued, is owed more than everyone waiting who could take the slot, and its
    learned think time (the gap between a request ending and its next, an average) is shorter. 0 turns it off
    (slots kept for a person who reads for longer follow ``max_think_time``)."""
    max_think_time: float = 10.0
    """Longest learned think time for which a freed slot may be kept for a person who is owed more, while someone
    backlogged already runs its weighted share of that backend's slots (or more): a person chatting next to batch
    work then gets each answer in seconds instead of after a batch answer (docs/fairness.md). The slot is kept for
    at most twice the person's think time, within this bound; 0 turns it off (``anticipation`` stays)."""
    max_slot_share: float | None = None
    """The part of a backend's slots (at least one) one person's requests may hold while someone else has used
    that backend's models and could send: a person who sends long requests just before another's sessions
    otherwise takes every slot for their length (docs/fairness.md, head-starts). Unset (the default), a person
    may take every free slot; 0.75 leaves one of 4 slots for whoever comes next, at the cost of that slot
    idling while nobody does."""
    think_ema_alpha: float = 0.25
    """Weight of the newest gap in a user's learned think time (what ``anticipation`` compares with)."""
    hold_price: float = 0.5
    """The part of what a held slot would have delivered to the job it kept waiting that its holder is charged
    for the time held: the idle slot-time is a loss both bear, the holder by paying this part, the other by
    waiting. On the think-time example 1 leaves the thinker 2.3 points under its share (3.8 over 90 minutes),
    0 leaves it 5.5 points over (6.0), and 0.5 is within 0.5 points at both lengths."""
    default_completion_tokens: int = 256
    """A pool's typical answer before any has completed there, and a user's usual answer before its first."""
    completion_ema_alpha: float = 0.2
    """Weight of the newest answer in a user's usual answer (the estimate of its next job's answer)."""
    typical_ema_alpha: float = 0.1
    """Weight of the newest completed request in a pool's typical request cost and typical answer."""
    typical_clip: float = 4.0
    """One request moves a pool's typical cost and answer at most as if it were this many times the typical."""
    answers_ahead: float = 2.0
    """How many of its pool's slot answers a stream of a user whose answers are known is charged ahead of what it
    has produced. While they are unknown it is one typical answer, as far as the placement credit reaches: what is
charged ahead is refunded when a short first answer ends, and more would lift it above users placed while it ran.
Two keep VTC's bound (twice the largest request)
    in the answers-jump example, where one lets a user whose answers jump hold too many slots (gap 11,080 of
    8,400)."""
    debt_bound: float = 2.0
    """How many of the pool's largest requests (per unit of weight) a charge may leave a queued user behind the
    most-owed waiting user: VTC's bound on the service gap between backlogged people, which also bounds what one
    pays back for service on backends nobody it meets later could use."""
    heavy_slack: float = 2.0
    """Typical requests (per unit of weight) a user may use beyond ``deprioritize_threshold`` before it counts
    as heavy: within that, the excess is the scheduler's own granularity, not heavy use."""
    deficit_shift_threshold: float = 1e9
    """When deficits drift this far below zero (per unit of weight), all are shifted up together."""
    heavy_refresh_interval: float = 1.0
    """Seconds between re-evaluations of who is a heavy user."""
    stream_slowdown: float = 0.2
    """How much each stream already on a backend slows a new one: its rates divide by ``1 + this * streams``."""
    default_decode_rate: float = 50.0
    """Completion tokens per second assumed where no backend has answered for a model yet."""
    prefill_speedup: float = 20.0
    """Prompt tokens are read this many times faster than answer tokens are written, until measured."""
    default_load_bytes_per_second: float = 2e9
    """How fast a backend loads a model until one of its loads is measured."""
    default_load_seconds: float = 10.0
    """A load's time where the model's size is unknown."""
    wait_margin: float = 1.0
    """Seconds sooner a full backend must be expected to finish a job than any free one for the job to wait for it."""
    eviction_price: float = 1.0
    """Seconds of estimate charged per second of reload that evicting an idle model costs the pool."""
    prefix_cache_tokens: int = 262_144
    """Prompt tokens a backend without slots per model (vLLM) is expected to keep in its prefix cache per model,
    for pricing a prompt sent where its prefix was sent before (``routing/prefixes.py``); 0 expects none."""
    load_confirm_seconds: float = 30.0
    """Seconds a load or an eviction the core triggered is taken as done before a poll confirms it."""
    drain_margin: float | None = 0.5
    """Placement that follows demand: a busy model is drained from a GPU (no new work of it goes there, so the
    model whose queue waits can load in its place) only when the move lowers the higher demand per slot of the two
    by more than this part; the hysteresis that keeps two models with equal demand from draining each other.
    Unset turns draining off (docs/routing.md, "Placement that follows demand")."""
    placement_interval: float = 1.0
    """Seconds between reviews of which busy models to drain where."""
    retry_penalty: float = 1000.0
    """Seconds taken from a backend's score when it already failed this request, so a retry goes elsewhere if it
    can."""
    latency_ema_alpha: float = 0.2
    """Weight of the newest sample in the latency and throughput averages."""
    min_prefill_sample_tokens: int = 64
    """Prompts shorter than this teach nothing about a backend's prefill rate: they say more about overhead."""
    min_load_sample_seconds: float = 0.5
    """A load a backend reports shorter than this teaches nothing about its load speed (Ollama reports a few
    milliseconds of ``load_duration`` for a model already resident)."""
    group_weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_GROUP_WEIGHTS))
    """Fallback weights by group name, used when a group has no weight of its own."""
    scores: ScoreWeights = field(default_factory=ScoreWeights)

    def __post_init__(self) -> None:
        if self.shares not in SHARES:
            raise ValueError(f'shares must be "user" or "group", not {self.shares!r}')
        if self.service_unit not in SERVICE_UNITS:
            raise ValueError(f'service_unit must be "tokens" or "gpu", not {self.service_unit!r}')
        if not (math.isfinite(self.anticipation) and self.anticipation >= 0):
            raise ValueError(f"anticipation must be a finite number of seconds, at least 0, not {self.anticipation!r}")
        if not (math.isfinite(self.max_think_time) and self.max_think_time >= 0):
            raise ValueError(
                f"max_think_time must be a finite number of seconds, at least 0, not {self.max_think_time!r}"
            )
        if self.max_slot_share is not None and not 0 < self.max_slot_share <= 1:
            raise ValueError(
                "max_slot_share must be a fraction greater than 0 and at most 1, such as 0.75, "
                f"not {self.max_slot_share!r}"
            )
        if not 0 <= self.queue_reserve < 1:
            raise ValueError(
                f"queue_reserve must be a fraction from 0 up to (not including) 1, not {self.queue_reserve!r}"
            )
        for name in ("think_ema_alpha", "completion_ema_alpha", "typical_ema_alpha"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value <= 1):
                raise ValueError(f"{name} must be a number greater than 0 and at most 1, such as 0.2, not {value!r}")
        if not (math.isfinite(self.typical_clip) and self.typical_clip >= 1):
            raise ValueError(
                f"typical_clip must be a finite number of at least 1, such as 4, not {self.typical_clip!r}"
            )
        for name in ("prompt_token_cost", "completion_token_cost"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number greater than 0, such as 1 or 2, not {value!r}")

    def cost(self, prompt_tokens: float, completion_tokens: float, prompt_weight: float | None = None) -> float:
        """A request's service units: the one rule for what fair share charges, shows and replays.

        ``prompt_weight``: what a prompt token of its model costs where the unit follows the GPU
        (``fairness/prices.py``); without it, ``prompt_token_cost``.
        """
        weight = self.prompt_token_cost if prompt_weight is None else prompt_weight
        return prompt_tokens * weight + completion_tokens * self.completion_token_cost
