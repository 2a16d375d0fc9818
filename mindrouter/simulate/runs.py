"""What one simulation produced: requests, users and their phases, backends, and the run as a whole.

The engine fills these in as events happen; ``report.build`` reads them. Only
the engine writes them. A ``UserRun`` opens and closes its own stretches
(backlogged, starved, deprioritized), so the rule for each figure the report
reads sits next to the field that holds it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from ..scheduler import Scheduler
from .conversations import Conversation
from .pools import Pool
from .scenario import BackendSpec, Scenario, UserSpec

__all__ = ["BackendRun", "ModelRun", "PhaseRun", "RequestTrace", "Run", "UserRun"]


@dataclass(slots=True)
class RequestTrace:
    """One simulated request, start to end (times in simulated seconds; None if it never got there)."""

    id: str
    user: int
    prompt: int
    completion: int
    submitted: float
    phase: int = 0
    """Index of its phase in ``Run.phases``."""
    dispatched: float | None = None
    prefill_end: float | None = None
    done: float | None = None
    backend: str | None = None
    epoch: int = 0
    """Slot-freeing batches (for its model) seen before it was submitted."""
    skipped: int = 0
    """Slot-freeing batches that passed while it waited, their slots going to others."""
    timed_out: bool = False
    model: str = ""
    expected: float = 0.0
    """Seconds it was expected to take from dispatch, as it was dispatched (for windows it outlasts)."""
    stream: bool = True
    """False: nothing reaches the core before the end (no progress reports)."""
    conversation: Conversation | None = None
    """The conversation it is a turn of (None: a single request)."""
    turn: int = 0
    cached: int = 0
    """Prompt tokens its backend's cache held (not prefilled)."""
    owed: bool = False
    """Sent with nothing else of its user queued while the user's counter was below every other backlogged
    user's in its pool: a person asking who is owed more than all who wait (``UserRun.owed_waits``)."""


@dataclass(slots=True)
class ModelRun:
    """What the requests for one model felt: times from submission to first token and to the last."""

    name: str
    kind: str
    submitted: int = 0
    completed: int = 0
    timed_out: int = 0
    rejected: int = 0
    ttft: list[float] = field(default_factory=list)
    """Seconds from submission to the end of the prefill (for an embedding, its answer)."""
    e2e: list[float] = field(default_factory=list)
    """Seconds from submission to the last token."""
    completion_tokens: int = 0
    prompt_tokens: int = 0
    """Prompt tokens of its answered requests, as sent."""
    computed_tokens: int = 0
    """The part of those its backends prefilled (the rest their prompt caches held)."""
    later_ttft: list[float] = field(default_factory=list)
    """TTFT of the turns after a conversation's first."""
    arrivals: list[tuple[float, int, int]] = field(default_factory=list)
    """(when, prompt, completion tokens) of every request submitted for it: what the offline bound is offered."""


@dataclass(slots=True)
class UserRun:
    """What one simulated user (an account, across its phases) did and received. Tokens are as generated."""

    index: int
    name: str
    group: str | None
    weight_override: float | None
    weight: float
    """The user's weight now (the last one when the run is over)."""
    pools: list[Pool] = field(default_factory=list)
    """The pools its phases send to."""
    submitted: int = 0
    queued: int = 0
    running: int = 0
    completed: int = 0
    completed_tokens: int = 0
    gpu_seconds: float = 0.0
    """Seconds its requests held a backend slot (dispatch to last token, as a backend's ``slot_seconds``)."""
    timed_out: int = 0
    rejected: int = 0
    waits: list[float] = field(default_factory=list)
    owed_waits: list[float] = field(default_factory=list)
    """Waits of its requests that were ``RequestTrace.owed``: what issue 30 judges against its own requests' time."""
    durations: list[float] = field(default_factory=list)
    """Seconds each of its requests took from dispatch to the last token."""
    waited: int = 0
    """Requests that could not start the moment they arrived."""
    max_skipped: int = 0
    backlogged_seconds: float = 0.0
    backlogged_since: float | None = None
    starved_since: float | None = None
    """Since when it has had a request queued and none of its requests started."""
    max_starved: float = 0.0
    passed_since: float | None = None
    """Since when it has been passed over (``turns.Turns``) in its current wait; None when it was not."""
    max_passed_over: float = 0.0
    longest_request: float = 0.0
    """Seconds the longest of its requests took from dispatch to the last token."""
    largest_request: float = 0.0
    """Service units of its largest request that ended."""
    deprioritized_seconds: float = 0.0
    deprioritized_since: float | None = None
    min_factor: float = 1.0

    def update_backlog(self, now: float) -> None:
        """Start or end its backlogged and starved stretches (after a batch that changed its queue)."""
        if self.queued > 0 and self.backlogged_since is None:
            self.backlogged_since = self.starved_since = now
        elif self.queued == 0 and self.backlogged_since is not None:
            self.backlogged_seconds += now - self.backlogged_since
            self.backlogged_since = None
            if self.starved_since is not None:
                self.max_starved = max(self.max_starved, now - self.starved_since)
                self.starved_since = None
            self._end_passed_over(now)

    def request_started(self, now: float) -> None:
        """One of its requests started: a starved stretch ends here, and the next one begins."""
        if self.starved_since is not None:
            self.max_starved = max(self.max_starved, now - self.starved_since)
            self.starved_since = now
        self._end_passed_over(now)

    def passed_over(self, now: float) -> None:
        """It was passed over at ``now`` (``turns.Turns``): a stretch begins unless one is open."""
        if self.passed_since is None:
            self.passed_since = now

    def _end_passed_over(self, now: float) -> None:
        if self.passed_since is not None:
            self.max_passed_over = max(self.max_passed_over, now - self.passed_since)
            self.passed_since = None

    def note_factor(self, factor: float, now: float) -> None:
        """Start, deepen or end its deprioritized stretch; ``factor`` is the core's for it (1: not deprioritized)."""
        if factor < 1.0:
            if self.deprioritized_since is None:
                self.deprioritized_since = now
            self.min_factor = min(self.min_factor, factor)
        elif self.deprioritized_since is not None:
            self.deprioritized_seconds += now - self.deprioritized_since
            self.deprioritized_since = None

    def finish(self, end: float) -> None:
        """Count the stretches still open when the run ends."""
        if self.backlogged_since is not None:
            self.backlogged_seconds += end - self.backlogged_since
        if self.starved_since is not None:
            self.max_starved = max(self.max_starved, end - self.starved_since)
        self._end_passed_over(end)
        if self.deprioritized_since is not None:
            self.deprioritized_seconds += end - self.deprioritized_since

    def tokens(self, t: float) -> float:
        return sum(pool.tokens(self.index, t) for pool in self.pools)

    def service_units(self, t: float) -> float:
        """Its service by ``t`` at the run's prompt and completion token costs, as generated."""
        return sum(pool.service(self.index, t) for pool in self.pools)

    def target(self) -> float:
        return sum(pool.target[self.index] for pool in self.pools)


@dataclass(slots=True)
class PhaseRun:
    """One ``[[users]]`` entry being played out."""

    index: int
    spec: UserSpec
    user: UserRun
    pool: Pool
    rng: random.Random
    stop: float
    """When the phase stops sending (its ``stop``, else the end of the run)."""
    size: tuple[float, float]
    """Its mean prompt and completion tokens per request (``workload.expected_sizes``)."""
    submitted: int = 0
    started: int = 0
    """Requests, or conversations where it converses, it began (what ``requests`` limits)."""


@dataclass(slots=True)
class BackendRun:
    spec: BackendSpec
    busy: int = 0
    requests: int = 0
    tokens: int = 0
    slot_seconds: float = 0.0
    """Slot-seconds spent on requests, up to the end of the run."""
    full_at: float | None = None
    """First moment every slot was busy."""
    loads: int = 0
    load_seconds: float = 0.0
    evictions: int = 0
    expirations: int = 0


@dataclass(slots=True)
class Run:
    """The raw outcome of one simulation (``report.build`` turns it into the JSON contract)."""

    scenario: Scenario
    users: list[UserRun]
    phases: list[PhaseRun]
    pools: list[Pool]
    backends: list[BackendRun]
    window: float
    """Seconds per window."""
    duration: float
    events: int
    wall_seconds: float
    scheduler: Scheduler
    trace: list[RequestTrace] | None
    models: dict[str, ModelRun] = field(default_factory=dict)
    saturated: list[tuple[float, float]] = field(default_factory=list)
    """Stretches (start, end) during which some request waited in the core's queue."""
    saturated_tokens: float = 0.0
    """Completion tokens generated during those stretches."""

    @property
    def max_request_cost(self) -> float:
        return max((p.max_request_cost for p in self.pools), default=0.0)
