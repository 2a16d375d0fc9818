"""The lab of issue 17: four Ollama workstations, four models, 20 users, and its seeded workload.

Sizes are Ollama's Q4_K_M files (``/api/tags``) and what ``/api/ps`` shows
resident with four slots of context; speeds are single-stream tokens/s of the
order published for llama.cpp on these GPUs. A workstation pulls only the
models that fit its VRAM (the 70B lives on the H100 alone). Everything here is
in lab seconds; the benchmark compresses time.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from _workstation import BATCH_COST, ModelSpec, Speed, WorkstationSpec

CHAT, CODER, BIG, EMBED = "llama3.1:8b", "qwen2.5-coder:14b", "llama3.3:70b", "nomic-embed-text:latest"
MODELS = {
    CHAT: ModelSpec(CHAT, disk_gb=4.9, vram_gb=7.0, family="llama", parameter_size="8.0B"),
    CODER: ModelSpec(CODER, disk_gb=9.0, vram_gb=11.0, family="qwen2", parameter_size="14.8B"),
    BIG: ModelSpec(BIG, disk_gb=42.5, vram_gb=48.0, family="llama", parameter_size="70.6B"),
    EMBED: ModelSpec(EMBED, disk_gb=0.27, vram_gb=0.6, family="nomic-bert", parameter_size="137M", embedding=True),
}
POOL = (
    WorkstationSpec(
        "ws-h100",
        "NVIDIA H100 80GB HBM3",
        80,
        0.30,
        {CHAT: Speed(140, 9000), CODER: Speed(85, 5000), BIG: Speed(24, 1100), EMBED: Speed(0, 30000)},
        preload=(BIG, CHAT, EMBED),
    ),
    WorkstationSpec(
        "ws-4090",
        "NVIDIA GeForce RTX 4090",
        24,
        0.35,
        {CHAT: Speed(125, 6000), CODER: Speed(70, 3200), EMBED: Speed(0, 20000)},
        preload=(CODER, CHAT, EMBED),
    ),
    WorkstationSpec(
        "ws-4080",
        "NVIDIA GeForce RTX 4080",
        16,
        0.45,
        {CHAT: Speed(100, 4500), CODER: Speed(55, 2400), EMBED: Speed(0, 15000)},
        preload=(CHAT, EMBED),
    ),
    WorkstationSpec(
        "ws-3060",
        "NVIDIA GeForce RTX 3060",
        12,
        0.70,
        {CHAT: Speed(55, 1800), CODER: Speed(27, 800), EMBED: Speed(0, 6000)},
        preload=(CHAT,),
    ),
)


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


@dataclass(frozen=True, slots=True)
class Request:
    at: float
    """Lab seconds from the start."""
    user: str
    model: str
    prompt: int
    out: int
    phase: str


SIGMA = 0.6
"""Spread of request sizes (lognormal): the mean is ``exp(SIGMA**2 / 2)``, about 1.2x, the median."""


def _size(rng: random.Random, median: int) -> int:
    return int(min(median * 3.0, max(median * 0.3, rng.lognormvariate(0.0, SIGMA) * median)))


def mean_work(kind: Kind, speed: Speed) -> float:
    """Single-stream GPU seconds of a request of ``kind`` at its mean sizes."""
    decode = kind.out / speed.decode if kind.out else 0.0
    return (kind.prompt / speed.prefill + decode) * math.exp(SIGMA**2 / 2)


def capacity(pool: Sequence[WorkstationSpec] = POOL, kinds: Sequence[Kind] = KINDS) -> float:
    """Requests/s the pool serves with full batches (``num_parallel`` streams): an estimate, not a bound.

    The 70B's requests take the H100's time first; every workstation spends
    the rest of its time on the other models in their shares, as a balanced
    router would. A router that places models by speed can do somewhat better.
    """
    big = next(k for k in kinds if k.model == BIG)
    rest = [k for k in kinds if k is not big]

    def batch(ws: WorkstationSpec) -> float:
        return ws.num_parallel / (1 + BATCH_COST * (ws.num_parallel - 1))

    def work(ws: WorkstationSpec) -> float:
        here = [k for k in rest if k.model in ws.speeds]
        weight = sum(k.share for k in here)
        return sum(k.share / weight * mean_work(k, ws.speeds[k.model]) for k in here)

    host = next(ws for ws in pool if BIG in ws.speeds)
    others = sum(batch(ws) / work(ws) for ws in pool)
    return others / ((1 - big.share) + big.share * mean_work(big, host.speeds[BIG]) / work(host))


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


def scenario(
    seed: int, steady_s: float, burst_s: float, drain_s: float = 300.0, steady: float = 0.6, burst: float = 1.3
) -> str:
    """This lab as an ``mr simulate`` scenario (TOML): the same pool, rates and arrival rates.

    Users send for ``steady_s + burst_s``; the run lasts ``drain_s`` longer (a client's
    timeout in the benchmark), so requests sent late finish as they do live.

    Where it differs from :func:`workload`: its own Poisson draws (the same rates), and sizes
    uniform over [0.3, 2.1] x the median (the clipped lognormal's mean); ``bench_pool.py
    --workload scenario`` replays these very requests live.
    """
    lines = [f"duration = {steady_s + burst_s + drain_s:g}", f"seed = {seed}", ""]
    for m in MODELS.values():
        lines += [f'[models."{m.name}"]', f"size = {m.disk_gb}", f"vram = {m.vram_gb}"]
        lines += ['kind = "embedding"', ""] if m.embedding else [""]
    for ws in POOL:
        lines += [
            "[[backends]]",
            f'name = "{ws.name}"',
            "models = [" + ", ".join(f'"{m}"' for m in ws.speeds) + "]",
            "loaded_models = [" + ", ".join(f'"{m}"' for m in ws.preload) + "]",
            f"max_concurrent = {ws.num_parallel * ws.max_loaded}",
            "tokens_per_second = 1",
            f"vram = {ws.vram_gb:g}",
            f"load_seconds_per_gb = {ws.load_s_per_gb:g}",
            f"parallel = {ws.num_parallel}",
            f"max_loaded = {ws.max_loaded}",
            f"keep_alive = {ws.keep_alive:g}",
            f"slowdown = {BATCH_COST:g}",
            "",
            "[backends.rates]",
            *(f'"{m}" = {{ decode = {s.decode or 1:g}, prefill = {s.prefill:g} }}' for m, s in ws.speeds.items()),
            "",
        ]
    rate = capacity()
    for name, kind in users():
        per_user = rate * kind.share / kind.users
        for start, stop, factor in ((0.0, steady_s, steady), (steady_s, steady_s + burst_s, burst)):
            lines += [
                "[[users]]",
                f'name = "{name}"',
                f'model = "{kind.model}"',
                f"rate = {per_user * factor:.6f}",
                f"start = {start:g}",
                f"stop = {stop:g}",
                f"prompt_tokens = [{int(kind.prompt * 0.3)}, {int(kind.prompt * 2.1)}]",
            ]
            if kind.out:
                lines.append(f"completion_tokens = [{int(kind.out * 0.3)}, {int(kind.out * 2.1)}]")
            lines.append("")
    return "\n".join(lines)
