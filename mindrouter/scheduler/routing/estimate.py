"""Where a job finishes first: per candidate, when it would start and finish there.

The seed's soft scores (model loaded, low utilization, latency, short queue,
high throughput) added points that did not compare: one request in flight
cost more than the whole gap between an H100 and an RTX 3060, and a 15 s 70B
load scored like a 0.1 s embedding load (issue 17). Routing now estimates, in
seconds from now, for each candidate with a free slot:

    start   = the rest of a load under way, or a whole load (size / load speed) where the model is not resident
              or its runner holds another context than the job asks (Ollama reloads it)
    prefill = (prompt tokens - those expected in its prompt cache) / (prefill rate / slowdown)
    decode  = expected answer tokens / (decode rate / slowdown)
    finish  = start + prefill + decode
    slowdown = 1 + s * (streams already on that backend + its own queue), s its slowdown per stream
               learned from its answers (``learning.py``; ``stream_slowdown`` until then),
               or 1 + utilization where none of ours run there (someone else's work)

The delay is what the job costs the others: finishing first is not the
only aim. The scarcity is what it costs work that can go nowhere else: for
each job of another class whose only candidate is this backend (a 70B on the
one H100) that this one would hold up there (running beside it, or queued for
the slot or model place it takes; ``Classes.contested``), this job's time
there is charged once more, so a job that can run elsewhere goes elsewhere.
The rates are those of that (backend, model) pair learned from
answers (``Speeds``); a pair with none yet borrows the best rate known for the
model elsewhere, scaled by how this backend compares on the models it has
served (so a new backend gets tried, as what it is), else the settings' defaults.
Evicting an idle model to make room costs its reload time (``eviction_price``
per second). The score, higher is better as in the seed's records, is

    delay    = streams already running there x (s x this job's time alone there
               + its prompt's reading alone, where prompts stall decoding: vLLM's chunked prefill)
    scarcity = (jobs with no other home it holds up there) x (prefill + decode)
    score = priority - (start + eviction cost) - prefill - decode - delay - scarcity - retry penalty   (seconds)

so an admin's ``priority`` is worth that many seconds of expected finish. The
seed's ``SCHEDULER_SCORE_*`` settings weigh the terms against their defaults:
``model_loaded`` the load and eviction seconds, ``latency`` the prefill,
``high_throughput`` the decode, ``short_queue`` the slowdown per stream (and the scarcity) and
``low_utilization`` the slowdown from others' use of the GPU; at their
defaults each weighs 1x, and 0 leaves a term out of the choice.

Invariant: ``estimate`` is pure (it reads a backend, its load and the rates
known, and changes none of them), so the router may ask it for a route and for
the price of a hold alike (``Router.estimate``).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from ..settings import SchedulerSettings, ScoreWeights
from .backend import Backend, BackendLoad, ModelSpeed
from .constraints import fit

__all__ = ["Estimate", "Speeds", "estimate", "load_seconds"]

_SEED = ScoreWeights()
"""The seed's score weights: each setting weighs its term against these (the default weighs every term 1x)."""


@dataclass(frozen=True, slots=True)
class Estimate:
    """One candidate's expected start and finish for a job (what ``mr why`` shows), seconds from the decision."""

    backend_id: Hashable
    score: float
    start: float
    """Until the model is resident: the rest of a load under way, or a whole load."""
    prefill: float
    decode: float
    finish: float
    evicts: tuple[str, ...] = ()
    """Idle models Ollama would evict to make room."""
    eviction: float = 0.0
    """Seconds of reload that evicting them costs the pool."""
    delay: float = 0.0
    """Seconds this job adds, in all, to the streams already running there."""
    scarcity: float = 0.0
    """Seconds it takes from work that can run only there (running beside it, or queued for its slot or place)."""
    decode_rate: float = 0.0
    """Tokens per second this job is expected to get there (after the slowdown)."""
    streams: int = 0
    """Streams already on that backend (and its own queue)."""
    learned: bool = False
    """The rates come from this backend's own answers for this model."""
    priority: float = 0.0
    penalty: float = 0.0
    """Subtracted when this backend already failed this request."""
    cached: int = 0
    """Prompt tokens expected in its prompt cache already (``prefixes.py``): no prefill for them."""
    reading: float = 0.0
    """Seconds its prompt's part not cached takes to read there alone (what stalls the streams there, where
    prompts stall decoding)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "score": round(self.score, 3),
            "start": round(self.start, 3),
            "prefill": round(self.prefill, 3),
            "decode": round(self.decode, 3),
            "finish": round(self.finish, 3),
            "evicts": list(self.evicts),
            "eviction": round(self.eviction, 3),
            "delay": round(self.delay, 3),
            "scarcity": round(self.scarcity, 3),
            "decode_rate": round(self.decode_rate, 2),
            "streams": self.streams,
            "learned": self.learned,
            "priority": self.priority,
            "penalty": self.penalty,
            "cached_tokens": self.cached,
        }


def load_seconds(backend: Backend, load: BackendLoad, model: str, settings: SchedulerSettings) -> float:
    """Seconds to load ``model`` on ``backend``: its size over the backend's measured load speed."""
    size = backend.model_sizes.get(model) or backend.model_vram.get(model) or backend.resident_vram.get(model)
    if not size:
        return settings.default_load_seconds
    return size / (load.load_bytes_per_second or settings.default_load_bytes_per_second)


@dataclass(slots=True)
class Speeds:
    """The best decode and prefill rates known per model across the pool, the prior for unlearned pairs."""

    best: dict[str, ModelSpeed] = field(default_factory=dict)

    def learned(self, model: str, speed: ModelSpeed) -> None:
        best = self.best.setdefault(model, ModelSpeed())
        if speed.decode is not None and (best.decode is None or speed.decode > best.decode):
            best.decode = speed.decode
        if speed.prefill is not None and (best.prefill is None or speed.prefill > best.prefill):
            best.prefill = speed.prefill


def _relative(load: BackendLoad, prior: Speeds) -> tuple[float, float]:
    """How this backend's decode and prefill compare with the pool's best, on the models it has answered.

    The highest ratio of its models (1 where it knows none): a guess that still lets it be tried.
    """
    decode = prefill = 0.0
    for model, speed in load.speeds.items():
        best = prior.best.get(model)
        if best is None:
            continue
        if speed.decode and best.decode:
            decode = max(decode, speed.decode / best.decode)
        if speed.prefill and best.prefill:
            prefill = max(prefill, speed.prefill / best.prefill)
    return decode or 1.0, prefill or 1.0


def _borrowed(
    load: BackendLoad,
    model: str,
    prior: Speeds,
    decode: float | None,
    prefill: float | None,
    settings: SchedulerSettings,
) -> tuple[float, float]:
    """Rates for a (backend, model) pair that has not answered yet (bench_pool, issue 17).

    The best rates known for ``model`` elsewhere, scaled by how this backend compares with the
    best on the models it has served: borrowed unscaled, an RTX 3060 new to the coder looked as
    fast as the H100 and took four long prompts in a row before its first answer said otherwise.
    """
    best = prior.best.get(model)
    scale = _relative(load, prior) if best is not None else (1.0, 1.0)
    decode = decode or (best and best.decode and best.decode * scale[0]) or settings.default_decode_rate
    prefill = prefill or (best and best.prefill and best.prefill * scale[1]) or decode * settings.prefill_speedup
    return decode, prefill


def estimate(
    backend: Backend,
    load: BackendLoad,
    model: str,
    prompt_tokens: float,
    answer_tokens: float,
    now: float,
    settings: SchedulerSettings,
    prior: Speeds,
    penalty: float = 0.0,
    queued: int = 0,
    contested: float = 0,
    cached: int = 0,
    context: int | None = None,
) -> Estimate | None:
    """When a job would start and finish on ``backend``; None when its model cannot be made resident.

    With ``queued`` jobs of its class waiting (itself included), every slot it could use there is
    taken: it would start once that many slots have freed, each expected after a typical job's
    time there divided by the jobs holding those slots. ``contested``: how many jobs with no other
    candidate it would hold up there (``Classes.contested``). ``cached``: its prompt tokens expected in the
    backend's prompt cache. ``context``: the ``num_ctx`` the job asks, if any.
    """
    resident = load.resident(backend, now, settings.load_confirm_seconds)
    evicts = fit(backend, load, model, resident)
    if isinstance(evicts, str):
        return None
    w = settings.scores
    own = load.speeds.get(model)
    decode = own.decode if own is not None else None
    prefill = own.prefill if own is not None else None
    if not (decode and prefill):
        decode, prefill = _borrowed(load, model, prior, decode, prefill, settings)
    streams = load.in_flight + backend.backend_waiting
    per_stream = settings.stream_slowdown if load.slowdown is None else load.slowdown
    slowdown = 1.0 + per_stream * streams * w.short_queue / _SEED.short_queue
    if not streams and backend.utilization:  # the GPU is busy with work that is not ours
        slowdown += min(1.0, max(0.0, backend.utilization)) * w.low_utilization / _SEED.low_utilization
    ready = load.loading.get(model)
    if ready is not None:
        start = max(0.0, ready - now)
    elif model in resident and (context is None or backend.resident_context.get(model, context) == context):
        start = 0.0
    else:
        start = load_seconds(backend, load, model, settings)
    if queued:
        holding = load.model_in_flight.get(model, 0) if backend.parallel is not None else load.in_flight
        typical = (prompt_tokens / prefill + answer_tokens / decode) * slowdown
        start = max(start, typical * queued / max(1, holding))
    loads = w.model_loaded / _SEED.model_loaded
    reading = (prompt_tokens - cached) / prefill
    # Where prompts stall decoding, decoding hardly slows a prompt's reading (one token a stream per step), and
    # the prompts sent before it are read first (they share each step's budget).
    if backend.prefill_stalls:
        t_prefill = load.pending(now) + reading
    else:
        t_prefill = reading * slowdown
    t_decode = answer_tokens * slowdown / decode
    finish = start + t_prefill + t_decode
    eviction = settings.eviction_price * (
        sum(load_seconds(backend, load, m, settings) for m in evicts) if evicts else 0
    )
    # Each stream already there runs slower while this one runs: about per_stream of this job's time alone;
    # where prompts stall decoding (vLLM's chunked prefill), each also waits for this one's prompt to be read.
    delay = load.in_flight * (per_stream * (reading + t_decode / slowdown) + backend.prefill_stalls * reading)
    scarcity = contested * (t_prefill + t_decode)
    weighed = (
        loads * (start + eviction)
        + (delay + scarcity) * w.short_queue / _SEED.short_queue
        + t_prefill * w.latency / _SEED.latency
        + t_decode * w.high_throughput / _SEED.high_throughput
    )
    return Estimate(
        backend.id,
        backend.priority - weighed - penalty,
        start,
        t_prefill,
        t_decode,
        finish,
        evicts,
        eviction,
        delay,
        scarcity,
        decode / slowdown,
        streams,
        own is not None and own.decode is not None,
        backend.priority,
        penalty,
        cached,
        reading,
    )
