"""What a scenario is: the validated, frozen description of users, backends and events.

Reading and checking scenario files is in ``loading.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..scheduler.settings import SchedulerSettings

__all__ = [
    "BackendSpec",
    "EventSpec",
    "ModelSpec",
    "Rates",
    "Scenario",
    "ScenarioError",
    "Tokens",
    "UserSpec",
]

#: A token count: fixed, or drawn uniformly from an inclusive [min, max].
Tokens = tuple[int, int]

#: Seconds: fixed, or drawn uniformly from [min, max].
Seconds = tuple[float, float]

#: Bytes in the GB of the scenario's sizes (what Ollama and nvidia-smi print).
GB = 1e9

#: Model kinds: a chat model prefills then decodes; an embedding model only prefills.
KINDS = ("chat", "embedding")

#: Engines a backend may run (``workstation/``): how it caches prompts and reports what it computed.
ENGINES = ("ollama", "llamacpp", "vllm", "openai")

#: How runners of different models share one GPU (``workstation/gpu.py``).
SHARING = ("time-share", "concurrent")


class ScenarioError(UsageError):
    """A scenario file that cannot be simulated as written (exit status 2)."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A ``[models]`` entry: what a model weighs and what its requests do, the same on every backend."""

    name: str
    size: float = 0.0
    """GB read from disk on a load (Ollama /api/tags ``size``): with a backend's load speed, the load time."""
    vram: float = 0.0
    """GB of GPU memory it holds once loaded (Ollama /api/ps ``size_vram``); defaults to ``size``."""
    kind: str = "chat"
    """"chat" (prefill, then decode) or "embedding" (prefill only, one request at a time per loaded copy)."""
    family: str = ""
    """Its architecture (``/api/show`` details.family): Ollama runs some families with one slot."""
    kv_mb_per_token: float = 0.0
    """MB of KV cache per token of context; 0: ``vram`` already holds its context (Ollama's runner at
    ``num_ctx x parallel`` adds this to ``vram``)."""
    context_length: int | None = None
    """The context it was trained for: Ollama never gives a runner more (None: no cap)."""


@dataclass(frozen=True, slots=True)
class Rates:
    """One stream's decode and prefill tokens per second for one model on one backend, alone on the GPU."""

    decode: float
    prefill: float


@dataclass(frozen=True, slots=True)
class BackendSpec:
    name: str
    models: tuple[str, ...]
    max_concurrent: int
    tokens_per_second: float
    """Decode rate of one request; requests running side by side do not slow each other."""
    prefill_tokens_per_second: float
    """Prompt processing rate; defaults to 10 x ``tokens_per_second``."""
    loaded_models: tuple[str, ...]
    """Models resident at the start (default: all of ``models``; with ``vram``, none)."""
    priority: float = 0.0
    vram: float | None = None
    """GB of GPU memory for models. Set, the backend behaves like Ollama: loads on demand, evicts, expires."""
    load_seconds_per_gb: float = 0.0
    """Seconds a load takes per GB of the model's ``size``."""
    parallel: int | None = None
    """Requests each loaded model serves at once (``OLLAMA_NUM_PARALLEL``, 1 by default on an Ollama);
    None: up to ``max_concurrent``."""
    max_loaded: int | None = None
    """Models resident at once (``OLLAMA_MAX_LOADED_MODELS``); None: as many as fit."""
    keep_alive: float | None = None
    """Seconds an idle model stays loaded; None: forever."""
    slowdown: float = 0.0
    """A model's batch of n streams steps ``1 + slowdown * (n - 1)`` times slower than one stream."""
    poll_interval: float = 0.0
    """Seconds between the daemon's polls: what the core learns of loads waits for the next one (0: at once)."""
    rates: Mapping[str, Rates] = dataclasses.field(default_factory=dict)
    """Per model; a model not listed runs at ``tokens_per_second`` / ``prefill_tokens_per_second``."""
    engine: str = ""
    """One of ``ENGINES``: "ollama" and "llamacpp" keep a prompt per slot, "vllm" prefix blocks, "openai"
    (an OpenAI-compatible server of unknown make) nothing; "" becomes "ollama" with ``vram``, else "openai"."""
    sharing: str = "time-share"
    """One of ``SHARING``: how runners of two models share the GPU."""
    load_start_seconds: float = 0.0
    """Seconds a load takes to start its runner, before it reads the weights."""
    max_queue: int = 512
    """Requests waiting for a runner to load before the server answers busy (``OLLAMA_MAX_QUEUE``)."""
    context_length: int | None = None
    """``OLLAMA_CONTEXT_LENGTH``; None: Ollama's default by the GPU's VRAM."""
    kv_cache_tokens: int | None = None
    """A vllm engine's KV cache, in tokens: what its prefix blocks may hold (None: no bound)."""

    def __post_init__(self) -> None:
        """Ollama's defaults: an Ollama with ``vram`` unless told otherwise, one slot per model
        (``OLLAMA_NUM_PARALLEL``'s default) unless ``parallel`` says more."""
        if not self.engine:
            object.__setattr__(self, "engine", "ollama" if self.vram is not None else "openai")
        if self.engine == "ollama" and self.parallel is None:
            object.__setattr__(self, "parallel", 1)

    @property
    def loads_models(self) -> bool:
        """Whether this backend manages memory like Ollama (``vram`` given): loads, evicts, expires."""
        return self.vram is not None

    def rate(self, model: str) -> Rates:
        return self.rates.get(model) or Rates(self.tokens_per_second, self.prefill_tokens_per_second)


@dataclass(frozen=True, slots=True)
class UserSpec:
    """One ``[[users]]`` entry: a phase of a user's workload.

    Entries that share a ``name`` are one user (one account, deficit and weight),
    each with its own ``start``/``stop``, model and workload; the parser gives
    every phase of a user the same ``group``, ``weight`` and ``weight_override``.
    """

    name: str
    group: str | None
    weight: float
    """The user's weight at the start: its ``weight_override``, else its group's, else 1."""
    model: str
    concurrency: int | None
    """Closed loop: requests kept outstanding between ``start`` and ``stop``."""
    rate: float | None
    """Open loop: Poisson arrivals per second between ``start`` and ``stop``."""
    prompt_tokens: Tokens
    completion_tokens: Tokens
    start: float
    stop: float | None
    """None: until the end of the run (so ``--duration`` moves it)."""
    max_tokens: int | None = None
    """Sent with each request (caps the completion); without it the scheduler estimates."""
    think_time: Seconds = (0.0, 0.0)
    """Seconds between one answer and the next request (closed loop) or the next turn (a conversation)."""
    requests: int | None = None
    """Stop this phase after submitting this many requests."""
    stream: bool = True
    """False: the client waits for the whole answer (the openai client's default); the core hears only the end."""
    leave_after: int | None = None
    """The client leaves after this many completion tokens; the backend stops there and the core is told so."""
    json_mode: bool = False
    """Asks for JSON mode: a job class of its own in the core, charged as any chat request."""
    weight_override: float | None = None
    """The user's own ``weight``, if given (an event with ``clear`` drops it for the group's)."""
    app: str | None = None
    """The client app (``[apps]``): its system prompt starts every prompt, the same for all its users."""
    turns: Tokens = (1, 1)
    """Turns per conversation: each turn resends the history (the app's system prompt, every earlier
    message and answer) and adds ``prompt_tokens`` of new message; (1, 1) with no app: single requests."""
    keep_alive: float | None = None
    """Sent with each request (Ollama's ``keep_alive``, seconds; negative: forever); None: the server's."""
    num_ctx: int | None = None
    """Sent with each request (Ollama's ``options.num_ctx``); None: Ollama's automatic context."""

    @property
    def converses(self) -> bool:
        """Whether its requests carry prompts with prefixes (a system prompt or a history)."""
        return self.app is not None or self.turns != (1, 1)


@dataclass(frozen=True, slots=True)
class EventSpec:
    """An ``[[events]]`` entry: at ``at`` seconds, change one user's or one group's weight."""

    at: float
    user: str | None
    group: str | None
    weight: float | None
    """The new weight; None with ``clear``."""
    clear: bool = False
    """Drop the user's own weight so its group's (or 1) applies again."""


@dataclass(frozen=True, slots=True)
class Scenario:
    duration: float
    seed: int
    backends: tuple[BackendSpec, ...]
    users: tuple[UserSpec, ...]
    settings: SchedulerSettings
    groups: Mapping[str, float]
    name: str = "scenario"
    description: str = ""
    events: tuple[EventSpec, ...] = ()
    """Sorted by ``at``."""
    models: Mapping[str, ModelSpec] = dataclasses.field(default_factory=dict)
    """The ``[models]`` table; a model not in it is a chat model of unknown size."""
    apps: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """The ``[apps]`` table: each client app's system prompt, in tokens."""

    def model(self, name: str) -> ModelSpec:
        return self.models.get(name) or ModelSpec(name)

    def replace(self, **changes: Any) -> Scenario:
        return dataclasses.replace(self, **changes)
