"""A pool's seeded workload (issue 17's lab by default): its users, their requests, its estimated capacity.

The pools and their users are in ``_pools.py``. Everything here is in lab
seconds; the benchmark compresses time.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from _pools import CHAT, CODER, GEMMA, KINDS, MODELS, POOL, POOL_KINDS, POOLS, SHORT, Kind, pool

from mindrouter.simulate.conversations import Conversation
from mindrouter.simulate.scenario import SHARING, BackendSpec, Rates

BATCH_STREAMS = 16
"""Streams a server without slots per model is taken to batch when the pool's capacity is estimated."""


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


def full_batch(ws: BackendSpec) -> float:
    """Single streams' worth of tokens a server makes with a full batch of one model."""
    n = ws.parallel or min(ws.max_concurrent, BATCH_STREAMS)
    return n / (1 + ws.slowdown * (n - 1))


def capacity(stations: Sequence[BackendSpec] = POOL, kinds: Sequence[Kind] = KINDS) -> float:
    """Requests/s the pool serves with full batches (``num_parallel`` streams): an estimate, not a bound.

    A model that some workstations lack (the 70B, a 32B) takes its hosts' time
    first, split between them in proportion to how fast each serves it; every
    workstation spends the rest of its time on the models all of them serve, in
    their shares, as a balanced router would. A router that places models by
    speed can do somewhat better. Memory is not counted: a model that fits a GPU
    only alone is taken to run there beside the others.
    """
    homes = {k.model: [ws for ws in stations if k.model in ws.models] for k in kinds}
    everywhere = [k for k in kinds if len(homes[k.model]) == len(stations)]
    few = [k for k in kinds if len(homes[k.model]) < len(stations)]

    def work(ws: BackendSpec) -> float:
        weight = sum(k.share for k in everywhere)
        return sum(k.share / weight * mean_work(k, ws.rates[k.model]) for k in everywhere)

    others = sum(full_batch(ws) / work(ws) for ws in stations)
    cost = 0.0  # per request of the pool, what its share of the few-homed models costs in the others' requests
    for k in few:
        speed = [full_batch(ws) / mean_work(k, ws.rates[k.model]) for ws in homes[k.model]]
        split = zip(speed, homes[k.model], strict=True)
        cost += k.share * sum(s / sum(speed) * mean_work(k, ws.rates[k.model]) / work(ws) for s, ws in split)
    return others / (1 - sum(k.share for k in few) + cost)


def users(kinds: Iterable[Kind] = KINDS) -> list[tuple[str, Kind]]:
    """Each kind's users, each on its model: ``chat-01`` ... ``embed-03``."""
    return [(f"{SHORT[k.model]}-{i + 1:02d}", k) for k in kinds for i in range(k.users)]


def workload(
    seed: int, steady_s: float, burst_s: float, steady: float = 0.6, burst: float = 1.3, pool_name: str = "lab"
) -> list[Request]:
    """Poisson arrivals per user of the pool ``pool_name``: ``steady`` x its capacity for ``steady_s``, then
    ``burst`` x its capacity."""
    rng = random.Random(seed)
    kinds = POOL_KINDS[pool_name]
    rate = capacity(POOLS[pool_name], kinds)
    out: list[Request] = []
    for name, kind in users(kinds):
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
WEBUI_TALK = ("webui", (2, 8), (10, 60), (30, 400))
TALKS = {CHAT: WEBUI_TALK, GEMMA: WEBUI_TALK, CODER: ("continue", (2, 6), (20, 90), (300, 2000))}
"""Per model, how its users converse in the conversations workload: app, turns, think time and each turn's
new message (tokens); the 70B's, the 32B's and the embedding model's users send single requests."""


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
    coder users (and gemma2's) hold conversations (``TALKS``) behind their app's system prompt, starting
    as many a second as they sent requests over the turns a conversation has on average. ``pool_name``:
    which pool (``POOLS``) and its users (``POOL_KINDS``).
    """
    kinds = POOL_KINDS[pool_name]
    served = {m for ws in POOLS[pool_name] for m in ws.models}
    lines = [f"duration = {steady_s + burst_s + drain_s:g}", f"seed = {seed}", ""]
    for m in (spec for name, spec in MODELS.items() if name in served):
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
