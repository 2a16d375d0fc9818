"""The lab of issue 17: four Ollama workstations, four models, 20 users, and its seeded workload.

The workstations are the simulator's ``BackendSpec``s: bench_pool's fake
servers drive the simulator's own workstation model with them. Sizes are
Ollama's Q4_K_M files (``/api/tags``) and what ``/api/ps`` shows resident with
four slots of context; speeds are single-stream tokens/s of the order
published for llama.cpp on these GPUs. A workstation pulls only the models
that fit its VRAM (the 70B lives on the H100 alone). Everything here is in lab
seconds; the benchmark compresses time.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mindrouter.simulate.conversations import Conversation
from mindrouter.simulate.scenario import SHARING, BackendSpec, ModelSpec, Rates

BATCH_COST = 0.25
"""Extra step time per extra stream in one model's batch: four streams give 2.3x one stream's tokens/s."""
PARALLEL, MAX_LOADED = 4, 3
"""The lab's OLLAMA_NUM_PARALLEL (Ollama's default is 1) and OLLAMA_MAX_LOADED_MODELS (the default)."""
CHAT, CODER, BIG, EMBED = "llama3.1:8b", "qwen2.5-coder:14b", "llama3.3:70b", "nomic-embed-text:latest"
MODELS = {
    CHAT: ModelSpec(CHAT, size=4.9, vram=7.0, family="llama"),
    CODER: ModelSpec(CODER, size=9.0, vram=11.0, family="qwen2"),
    BIG: ModelSpec(BIG, size=42.5, vram=48.0, family="llama"),
    EMBED: ModelSpec(EMBED, size=0.27, vram=0.6, kind="embedding", family="nomic-bert"),
}
PARAMETERS = {CHAT: "8.0B", CODER: "14.8B", BIG: "70.6B", EMBED: "137M"}
"""Each model's parameter size, as ``/api/tags`` reports it."""
GPUS = {
    "ws-h100": "NVIDIA H100 80GB HBM3",
    "ws-4090": "NVIDIA GeForce RTX 4090",
    "ws-4080": "NVIDIA GeForce RTX 4080",
    "ws-3060": "NVIDIA GeForce RTX 3060",
}


def _station(
    name: str, vram: float, load_s_per_gb: float, speeds: dict[str, tuple[float, float]], preload: tuple[str, ...]
) -> BackendSpec:
    """A workstation as the simulator describes it: ``speeds`` are one stream's (decode, prefill) tokens/s."""
    return BackendSpec(
        name=name,
        models=tuple(speeds),
        max_concurrent=PARALLEL * MAX_LOADED,
        tokens_per_second=1.0,
        prefill_tokens_per_second=10.0,
        loaded_models=preload,
        vram=vram,
        load_seconds_per_gb=load_s_per_gb,
        parallel=PARALLEL,
        max_loaded=MAX_LOADED,
        keep_alive=300.0,
        slowdown=BATCH_COST,
        rates={m: Rates(decode or 1.0, prefill) for m, (decode, prefill) in speeds.items()},
        load_start_seconds=1.0,
    )


POOL = (
    _station(
        "ws-h100",
        80,
        0.30,
        {CHAT: (140, 9000), CODER: (85, 5000), BIG: (24, 1100), EMBED: (0, 30000)},
        preload=(BIG, CHAT, EMBED),
    ),
    _station(
        "ws-4090", 24, 0.35, {CHAT: (125, 6000), CODER: (70, 3200), EMBED: (0, 20000)}, preload=(CODER, CHAT, EMBED)
    ),
    _station("ws-4080", 16, 0.45, {CHAT: (100, 4500), CODER: (55, 2400), EMBED: (0, 15000)}, preload=(CHAT, EMBED)),
    _station("ws-3060", 12, 0.70, {CHAT: (55, 1800), CODER: (27, 800), EMBED: (0, 6000)}, preload=(CHAT,)),
)


REPLICAS = tuple(
    BackendSpec(
        name=f"vllm-{i + 1}",
        models=(CHAT,),
        max_concurrent=64,
        tokens_per_second=1.0,
        prefill_tokens_per_second=10.0,
        loaded_models=(CHAT,),
        engine="vllm",
        kv_cache_tokens=200_000,
        slowdown=0.05,
        rates={CHAT: Rates(110, 8000)},
    )
    for i in range(4)
)
"""Issue 31's pool (a): the chat model on four vLLM-style replicas (A100-class, prefix blocks in a 200k-token
KV cache, batching that slows a stream 5% per other stream), behind ``--pool replicas``. Each batches up to 64
streams (vLLM's ``max_num_seqs`` is 256; mr serve's ``--max-concurrent`` is this), while the arrival rates take
a replica at ``BATCH_STREAMS`` (with 16 the pool ran past mr serve's cap while the baselines, which have none,
batched more)."""
BATCH_STREAMS = 16
"""Streams a server without slots per model is taken to batch when the pool's capacity is estimated."""
POOLS = {"lab": POOL, "replicas": REPLICAS}


def pool(sharing: str = SHARING[0], name: str = "lab") -> tuple[BackendSpec, ...]:
    """The pool ``name``'s servers (the lab's workstations by default), their GPUs shared by ``sharing``."""
    return tuple(dataclasses.replace(ws, sharing=sharing) for ws in POOLS[name])


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of request: its model, its share of arrivals, median sizes (lognormal, clipped)."""

    model: str
    share: float
    prompt: int
    out: int
    users: int


KINDS = (
    Kind(CHAT, 0.55, prompt=500, out=300, users=11),
    Kind(CODER, 0.20, prompt=4000, out=250, users=4),
    Kind(BIG, 0.07, prompt=800, out=350, users=2),
    Kind(EMBED, 0.18, prompt=3000, out=0, users=3),
)
POOL_KINDS = {"lab": KINDS, "replicas": (Kind(CHAT, 1.0, prompt=500, out=300, users=16),)}
"""What each pool's users send."""


@dataclass(frozen=True, slots=True)
class Request:
    at: float
    """Lab seconds from the start."""
    user: str
    model: str
    prompt: int
    out: int
    phase: str
    conversation: Conversation | None = None
    """The conversation this request is a turn of (``prompt`` and ``out`` are that turn's), or None."""
    turn: int = 0


SIGMA = 0.6
"""Spread of request sizes (lognormal): the mean is ``exp(SIGMA**2 / 2)``, about 1.2x, the median."""


def _size(rng: random.Random, median: int) -> int:
    return int(min(median * 3.0, max(median * 0.3, rng.lognormvariate(0.0, SIGMA) * median)))


def mean_work(kind: Kind, speed: Rates) -> float:
    """Single-stream GPU seconds of a request of ``kind`` at its mean sizes."""
    decode = kind.out / speed.decode if kind.out else 0.0
    return (kind.prompt / speed.prefill + decode) * math.exp(SIGMA**2 / 2)


def capacity(stations: Sequence[BackendSpec] = POOL, kinds: Sequence[Kind] = KINDS) -> float:
    """Requests/s the pool serves with full batches (``num_parallel`` streams): an estimate, not a bound.

    The 70B's requests take the H100's time first; every workstation spends
    the rest of its time on the other models in their shares, as a balanced
    router would. A router that places models by speed can do somewhat better.
    """
    big = next((k for k in kinds if k.model == BIG), None)
    rest = [k for k in kinds if k is not big]

    def batch(ws: BackendSpec) -> float:
        n = ws.parallel or min(ws.max_concurrent, BATCH_STREAMS)
        return n / (1 + ws.slowdown * (n - 1))

    def work(ws: BackendSpec) -> float:
        here = [k for k in rest if k.model in ws.models]
        weight = sum(k.share for k in here)
        return sum(k.share / weight * mean_work(k, ws.rates[k.model]) for k in here)

    others = sum(batch(ws) / work(ws) for ws in stations)
    if big is None:
        return others
    host = next(ws for ws in stations if BIG in ws.models)
    return others / ((1 - big.share) + big.share * mean_work(big, host.rates[BIG]) / work(host))


def users(kinds: Iterable[Kind] = KINDS) -> list[tuple[str, Kind]]:
    """20 users, each on one model: ``chat-01`` ... ``embed-03``."""
    short = {CHAT: "chat", CODER: "coder", BIG: "big", EMBED: "embed"}
    return [(f"{short[k.model]}-{i + 1:02d}", k) for k in kinds for i in range(k.users)]


def workload(seed: int, steady_s: float, burst_s: float, steady: float = 0.6, burst: float = 1.3) -> list[Request]:
    """Poisson arrivals per user: ``steady`` x capacity for ``steady_s``, then ``burst`` x capacity."""
    rng = random.Random(seed)
    rate = capacity()
    out: list[Request] = []
    for name, kind in users():
        per_user = rate * kind.share / kind.users
        t = 0.0
        for phase, factor, end in (("steady", steady, steady_s), ("burst", burst, steady_s + burst_s)):
            while True:
                t += rng.expovariate(per_user * factor)
                if t >= end:
                    t = end
                    break
                prompt = _size(rng, kind.prompt)
                done = _size(rng, kind.out) if kind.out else 0
                out.append(Request(t, name, kind.model, prompt, done, phase))
    return sorted(out, key=lambda r: r.at)


APPS = {"webui": 1000, "continue": 2500}
"""Client apps of the conversations workload and their system prompts, in tokens."""
TALKS = {CHAT: ("webui", (2, 8), (10, 60), (30, 400)), CODER: ("continue", (2, 6), (20, 90), (300, 2000))}
"""Per model, how its users converse in the conversations workload: app, turns, think time and each turn's
new message (tokens); the 70B and embedding users send single requests."""


def scenario(
    seed: int,
    steady_s: float,
    burst_s: float,
    drain_s: float = 300.0,
    steady: float = 0.6,
    burst: float = 1.3,
    *,
    sharing: str = SHARING[0],
    conversations: bool = False,
    pool_name: str = "lab",
) -> str:
    """This lab as an ``mr simulate`` scenario (TOML): the same pool, rates and arrival rates.

    Users send for ``steady_s + burst_s``; the run lasts ``drain_s`` longer (a client's
    timeout in the benchmark), so requests sent late finish as they do live.

    Where it differs from :func:`workload`: its own Poisson draws (the same rates), and sizes
    uniform over [0.3, 2.1] x the median (the clipped lognormal's mean); ``bench_pool.py
    --workload scenario`` replays these very requests live. With ``conversations``, the chat and
    coder users hold conversations (``TALKS``) behind their app's system prompt, starting as many
    a second as they sent requests over the turns a conversation has on average. ``pool_name``: which
    pool (``POOLS``) and its users (``POOL_KINDS``).
    """
    kinds = POOL_KINDS[pool_name]
    lines = [f"duration = {steady_s + burst_s + drain_s:g}", f"seed = {seed}", ""]
    for m in MODELS.values():
        lines += [f'[models."{m.name}"]', f"size = {m.size}", f"vram = {m.vram}", f'family = "{m.family}"']
        lines += ['kind = "embedding"', ""] if m.kind == "embedding" else [""]
    if conversations:
        for app, system in APPS.items():
            lines += [f"[apps.{app}]", f"system_prompt = {system}", ""]
    for ws in pool(sharing, pool_name):
        lines += [
            "[[backends]]",
            f'name = "{ws.name}"',
            f'engine = "{ws.engine}"',
            "models = [" + ", ".join(f'"{m}"' for m in ws.models) + "]",
            "loaded_models = [" + ", ".join(f'"{m}"' for m in ws.loaded_models) + "]",
            f"max_concurrent = {ws.max_concurrent}",
            "tokens_per_second = 1",
            f"slowdown = {ws.slowdown:g}",
            f'sharing = "{ws.sharing}"',
        ]
        if ws.vram is not None:  # a server that loads models
            lines += [
                f"load_seconds_per_gb = {ws.load_seconds_per_gb:g}",
                f"load_start_seconds = {ws.load_start_seconds:g}",
            ]
        for key in ("vram", "parallel", "max_loaded", "keep_alive", "kv_cache_tokens"):
            if getattr(ws, key) is not None:
                lines.append(f"{key} = {getattr(ws, key):g}")
        lines += [
            "",
            "[backends.rates]",
            *(f'"{m}" = {{ decode = {r.decode:g}, prefill = {r.prefill:g} }}' for m, r in ws.rates.items()),
            "",
        ]
    rate = capacity(POOLS[pool_name], kinds)
    for name, kind in users(kinds):
        per_user = rate * kind.share / kind.users
        talk = TALKS.get(kind.model) if conversations else None
        if talk is not None:
            per_user /= sum(talk[1]) / 2
        for start, stop, factor in ((0.0, steady_s, steady), (steady_s, steady_s + burst_s, burst)):
            lines += [
                "[[users]]",
                f'name = "{name}"',
                f'model = "{kind.model}"',
                f"rate = {per_user * factor:.6f}",
                f"start = {start:g}",
                f"stop = {stop:g}",
            ]
            if talk is None:
                lines.append(f"prompt_tokens = [{int(kind.prompt * 0.3)}, {int(kind.prompt * 2.1)}]")
            else:
                app, turns, think, message = talk
                lines += [f'app = "{app}"', f"turns = {list(turns)}", f"think_time = {list(think)}"]
                lines.append(f"prompt_tokens = {list(message)}")
            if kind.out:
                lines.append(f"completion_tokens = [{int(kind.out * 0.3)}, {int(kind.out * 2.1)}]")
            lines.append("")
    return "\n".join(lines)
