"""What a finished answer teaches about its backend: latency, throughput, and per-model rates.

Rates are learned per (backend, model), as one stream alone would get them:
a sample measured while ``k`` streams shared the backend is multiplied by the
slowdown ``1 + s * (k - 1)`` that the estimate divides by, so the two stay
consistent. ``s``, how much a stream slows each other one there, is learned
per backend too (``BackendLoad.slowdown``; ``stream_slowdown`` until then):
seconds per token grow with the other streams beside it as ``(1 + s x) /
rate``, a line whose slope over its intercept is ``s``, fitted by moving
least squares over a model's answers once they ran beside varied numbers of
others. So a vLLM server, whose batch costs a stream a few percent, is not
priced as an Ollama one. Where the backend's streams slow each other less
than that model says (not at all, in the simulator's default), the scaled
rate is too high for a stream as it runs: 80 tokens/s learned where four
streams each wrote 50. So the rate each stream got, unscaled, is kept beside
it (``ModelSpeed.observed``) for charging whole answers as they run. The
backend's own timings are used where it reports them (Ollama's
``prompt_eval_duration``, ``eval_duration`` and ``load_duration``); otherwise
the shell's clock: a stream's prompt is read by its first byte and its answer
written after it; an embedding is all prompt, read by its whole answer.

Invariant: samples that are not finite, not positive or beyond any GPU's
reach are dropped, so every learned rate is finite and positive: a backend is
not trusted to report sanely.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..jobs import Job, Modality, Timings
from ..settings import SchedulerSettings
from .backend import BackendLoad, ModelSpeed
from .estimate import Speeds

__all__ = ["Sample", "learn"]

# Limits of a valid reading, not settings: nothing to tune, only what no hardware reaches.
#: Tokens per second no backend reaches: a rate above it is a bad reading.
MAX_RATE = 1e6
#: Bytes per second no load reaches (PCIe 6 x16 is about 1.2e11).
MAX_LOAD_RATE = 1e12
#: The most a stream is taken to slow each other one on a backend (a reading beyond it is bad).
MAX_SLOWDOWN = 4.0
#: The variance of other streams' counts the answers in the sums must show before the line says anything.
MIN_SPREAD = 0.25


@dataclass(frozen=True, slots=True)
class Sample:
    """One finished job's figures, as the shell measured them and the backend reported them."""

    prompt_tokens: int | None
    completion_tokens: int | None
    latency: float | None
    duration: float | None
    timings: Timings
    model_size: int | None
    """Bytes of the model, for the load speed."""
    cached: int = 0
    """Of ``prompt_tokens``, those found in the engine's prompt cache (as it said, else as routing expected):
    not read, so not in the prefill's time. vLLM's usage and Ollama's ``prompt_eval_count`` count them."""
    stalled: float = 0.0
    """Seconds of other prompts' reading sent to its backend while it ran, where prompts stall decoding
    (``Backend.prefill_stalls``): time it waited, not time its own prompt or answer took."""
    stalls: bool = False
    """Its backend's prompts stall decoding (``Backend.prefill_stalls``), and decoding streams hardly slow a
    prompt's reading there: a prompt's rate is not scaled by the streams beside it."""
    behind: float = 0.0
    """Seconds of other prompts' reading it was sent behind there (``BackendLoad.pending``): part of its first
    byte's wait that is not its own prompt's."""


def _rate(tokens: float | None, seconds: float | None, limit: float) -> float | None:
    if tokens is None or seconds is None or not tokens > 0 or not seconds > 0:
        return None
    rate = tokens / seconds
    return rate if math.isfinite(rate) and rate <= limit else None


def _ema(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else old + alpha * (new - old)


def _fit_slowdown(load: BackendLoad, sums: list[float], x: float, y: float, alpha: float) -> None:
    """Add (x other streams, y seconds per token) to the moving sums; where the x seen vary, the line's
    slope over its intercept is the backend's slowdown per stream."""
    keep = 1.0 - alpha
    for i, value in enumerate((1.0, x, y, x * x, x * y)):
        sums[i] = sums[i] * keep + value
    weight, sx, sy, sxx, sxy = sums
    mx, my = sx / weight, sy / weight
    spread = sxx / weight - mx * mx
    if spread < MIN_SPREAD:
        return
    slope = (sxy / weight - mx * my) / spread
    intercept = my - slope * mx
    if intercept > 0:
        load.slowdown = min(MAX_SLOWDOWN, max(0.0, slope / intercept))


def learn(load: BackendLoad, speeds: Speeds, job: Job, sample: Sample, settings: SchedulerSettings) -> None:
    """Fold one finished job into ``load`` (called while the job still counts as in flight)."""
    alpha = settings.latency_ema_alpha
    load.completed += 1
    latency, duration, t = sample.latency, sample.duration, sample.timings
    if latency is not None and math.isfinite(latency) and latency >= 0:
        load.latency_ema = _ema(load.latency_ema, latency, alpha)
    tps = _rate(sample.completion_tokens, duration, MAX_RATE)
    if tps is not None:
        load.tokens_per_second = _ema(load.tokens_per_second, tps, alpha)
    per_stream = settings.stream_slowdown if load.slowdown is None else load.slowdown
    others = max(0, load.in_flight - 1)
    slowdown = 1.0 + per_stream * others
    decode_s = t.decode
    prefill_s = t.prefill
    if decode_s is None and duration is not None:
        decode_s = duration - latency if job.stream and latency is not None else duration
    reads_only = job.stream or job.modality is Modality.EMBEDDINGS  # its first byte ends the prompt's reading
    if prefill_s is None and reads_only and latency is not None and t.load is None and job.model not in load.loading:
        prefill_s = latency  # no load came before the first byte
    if (sample.stalled > 0 or sample.behind > 0) and duration:  # at least a quarter of each phase was its own
        if decode_s is not None:
            decode_s -= min(0.75 * decode_s, sample.stalled * decode_s / duration)
        if prefill_s is not None:
            prefill_s -= min(0.75 * prefill_s, sample.behind + sample.stalled * prefill_s / duration)
    speed = load.speeds.setdefault(job.model, ModelSpeed())
    decode = _rate(sample.completion_tokens, decode_s, MAX_RATE)
    if decode is not None:
        # Where prompts stall decoding, seconds per token swing with the prompts read beside each answer: weighing
        # the newest 0.2, four equal vLLM-like replicas learned slopes from 0 to 0.5 (truth 0.05) and routing
        # herded onto the lowest; over 4x as many answers, 0.03-0.06, still apart enough to herd. Their line takes
        # 64x as many answers (a batch's cost per stream hardly changes; elsewhere that slowed lab-pool's balance).
        _fit_slowdown(load, speed.crowd, others, 1.0 / decode, alpha / 64 if sample.stalls else alpha)
        speed.decode = _ema(speed.decode, decode * slowdown, alpha)
        speed.observed = _ema(speed.observed, decode, alpha)
        speed.answers += 1
    # A prompt read mostly from the cache took the time of the rest only: counted whole, a hit taught a
    # faster prefill and the next hit looked worth less (issue 31: turns left the replica with their history).
    prompt = None if sample.prompt_tokens is None else sample.prompt_tokens - min(sample.cached, sample.prompt_tokens)
    if prompt is not None and prompt >= settings.min_prefill_sample_tokens:
        prefill = _rate(prompt, prefill_s, MAX_RATE)
        if prefill is not None:
            speed.prefill = _ema(speed.prefill, prefill if sample.stalls else prefill * slowdown, alpha)
    # Only the job that started a load times all of it: one that joined it later, or waited
    # behind the backend's queue, reports part of a load or a wait (Ollama's load_duration).
    if t.load is not None and t.load >= settings.min_load_sample_seconds and job.id in load.loaders:
        bps = _rate(sample.model_size, t.load, MAX_LOAD_RATE)
        if bps is not None:
            load.load_bytes_per_second = _ema(load.load_bytes_per_second, bps, alpha)
    speeds.learned(job.model, speed)
