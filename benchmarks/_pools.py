"""The pools bench_pool runs: issue 17's lab, and pools it was not tuned on (issue 31), with their users.

The workstations are the simulator's ``BackendSpec``s: bench_pool's fake
servers drive the simulator's own workstation model with them. Sizes are
Ollama's Q4 files (``/api/tags``) and what ``/api/ps`` shows resident with
four slots of context; speeds are single-stream tokens/s of the order
published for llama.cpp on these GPUs. A workstation pulls only the models
that fit its VRAM (in the lab the 70B lives on the H100 alone).

- ``lab``: issue 17's four workstations (H100, RTX 4090, 4080, 3060) and 20 users of four models.
- ``replicas``: issue 31's pool (a), the chat model on four vLLM-style replicas.
- ``six``: the lab plus a second RTX 4090 and a second home for the 70B (an RTX A6000 48 GB, where it
  fits only alone), the lab's users: issue 31's held-out pool of six workstations.
- ``mixed``: the lab plus a vLLM-style server (A100-class) serving the chat model under its Hugging Face
  id, pooled with the Ollama tag by an alias: issue 31's held-out pool with a vLLM server in it.
- ``two-popular``: the lab's four GPUs serving two popular 8B-class chat models that compete for VRAM
  and a 32B that fits the RTX 4090 only without another chat model; gemma2 starts where llama3.1, the
  busier and faster of the two, would be better used (the held-out harness saw an RTX 3060 hold gemma2
  all run while llama3.1 queued).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mindrouter.simulate.scenario import SHARING, BackendSpec, ModelSpec, Rates

BATCH_COST = 0.25
"""Extra step time per extra stream in one model's batch: four streams give 2.3x one stream's tokens/s."""
PARALLEL, MAX_LOADED = 4, 3
"""The lab's OLLAMA_NUM_PARALLEL (Ollama's default is 1) and OLLAMA_MAX_LOADED_MODELS (the default)."""
CHAT, CODER, BIG, EMBED = "llama3.1:8b", "qwen2.5-coder:14b", "llama3.3:70b", "nomic-embed-text:latest"
GEMMA, QWEN32 = "gemma2:9b", "qwen2.5:32b"
HF_CHAT = "meta-llama/Llama-3.1-8B-Instruct"
MODELS = {
    CHAT: ModelSpec(CHAT, size=4.9, vram=7.0, family="llama"),
    CODER: ModelSpec(CODER, size=9.0, vram=11.0, family="qwen2"),
    BIG: ModelSpec(BIG, size=42.5, vram=48.0, family="llama"),
    EMBED: ModelSpec(EMBED, size=0.27, vram=0.6, kind="embedding", family="nomic-bert"),
    GEMMA: ModelSpec(GEMMA, size=5.4, vram=8.0, family="gemma2"),
    QWEN32: ModelSpec(QWEN32, size=19.9, vram=22.0, family="qwen2"),
}
MODELS[HF_CHAT] = dataclasses.replace(MODELS[CHAT], name=HF_CHAT)
PARAMETERS = {
    CHAT: "8.0B",
    CODER: "14.8B",
    BIG: "70.6B",
    EMBED: "137M",
    GEMMA: "9.2B",
    QWEN32: "32.8B",
    HF_CHAT: "8.0B",
}
"""Each model's parameter size, as ``/api/tags`` reports it."""
SHORT = {CHAT: "chat", CODER: "coder", BIG: "big", EMBED: "embed", GEMMA: "gemma", QWEN32: "qwen32"}
"""What a model's users are called: ``chat-01`` ... ``embed-03``."""
GPUS = {
    "ws-h100": "NVIDIA H100 80GB HBM3",
    "ws-4090": "NVIDIA GeForce RTX 4090",
    "ws-4090b": "NVIDIA GeForce RTX 4090",
    "ws-4080": "NVIDIA GeForce RTX 4080",
    "ws-3060": "NVIDIA GeForce RTX 3060",
    "ws-a6000": "NVIDIA RTX A6000",
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


RTX_4090 = {CHAT: (125, 6000), CODER: (70, 3200), EMBED: (0, 20000)}
POOL = (
    _station(
        "ws-h100",
        80,
        0.30,
        {CHAT: (140, 9000), CODER: (85, 5000), BIG: (24, 1100), EMBED: (0, 30000)},
        preload=(BIG, CHAT, EMBED),
    ),
    _station("ws-4090", 24, 0.35, RTX_4090, preload=(CODER, CHAT, EMBED)),
    _station("ws-4080", 16, 0.45, {CHAT: (100, 4500), CODER: (55, 2400), EMBED: (0, 15000)}, preload=(CHAT, EMBED)),
    _station("ws-3060", 12, 0.70, {CHAT: (55, 1800), CODER: (27, 800), EMBED: (0, 6000)}, preload=(CHAT,)),
)
"""Issue 17's lab."""
SIX = (
    *POOL,
    _station("ws-4090b", 24, 0.35, RTX_4090, preload=(CHAT, EMBED)),
    _station(
        "ws-a6000",
        48,
        0.40,
        {CHAT: (110, 5000), CODER: (60, 2800), BIG: (16.5, 800), EMBED: (0, 18000)},
        preload=(BIG,),
    ),
)
"""The lab, a second RTX 4090 like the first and an RTX A6000 (48 GB): the 70B's 48 GB fill it, so anything
else loads there only once the 70B is evicted."""
TWO_POPULAR = (
    _station(
        "ws-h100",
        80,
        0.30,
        {CHAT: (140, 9000), GEMMA: (125, 8000), QWEN32: (34, 2200), EMBED: (0, 30000)},
        preload=(CHAT, QWEN32, EMBED),
    ),
    _station(
        "ws-4090",
        24,
        0.35,
        {CHAT: (125, 6000), GEMMA: (112, 5400), QWEN32: (28, 1400), EMBED: (0, 20000)},
        preload=(GEMMA, CHAT, EMBED),
    ),
    _station("ws-4080", 16, 0.45, {CHAT: (100, 4500), GEMMA: (90, 4000), EMBED: (0, 15000)}, preload=(GEMMA, EMBED)),
    _station("ws-3060", 12, 0.70, {CHAT: (55, 1800), GEMMA: (48, 1600), EMBED: (0, 6000)}, preload=(GEMMA,)),
)
"""The lab's GPUs with two 8B-class models (gemma2 a little slower than llama3.1) and a 32B (40% of the coder's
decode). The 4080 and the 3060 hold one of the two 8B-class models at a time, and start with gemma2."""
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
a replica at ``BATCH_STREAMS`` (``_lab.py``; with 16 the pool ran past mr serve's cap while the baselines, which
have none, batched more)."""
MIXED = (*POOL, dataclasses.replace(REPLICAS[0], name="vllm-a100"))
"""The lab and one vLLM-style server like a replica of pool (a), which lists the chat model as ``HF_CHAT``."""
POOLS = {"lab": POOL, "replicas": REPLICAS, "six": SIX, "two-popular": TWO_POPULAR, "mixed": MIXED}
SERVED_AS = {"vllm-a100": {CHAT: HF_CHAT}}
"""Servers that list a model under another name than the pool's (a vLLM server names it by its Hugging Face id):
the pools above and the simulator use the pool's names; the fakes serve these, mr serve is told ``ALIASES``
(``mr model alias``), and the baselines map them back as a LiteLLM ``model_list`` would."""
ALIASES = {other: model for names in SERVED_AS.values() for model, other in names.items()}
"""Each other name, and the pool's name of the model it names."""


def served(spec: BackendSpec) -> BackendSpec:
    """``spec`` with its models under the names its server lists them by (``SERVED_AS``)."""
    names = SERVED_AS.get(spec.name, {})
    if not names:
        return spec
    return dataclasses.replace(
        spec,
        models=tuple(names.get(m, m) for m in spec.models),
        loaded_models=tuple(names.get(m, m) for m in spec.loaded_models),
        rates={names.get(m, m): r for m, r in spec.rates.items()},
    )


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
POOL_KINDS = {
    "lab": KINDS,
    "replicas": (Kind(CHAT, 1.0, prompt=500, out=300, users=16),),
    "six": KINDS,
    "mixed": (
        Kind(CHAT, 0.70, prompt=500, out=300, users=14),
        Kind(CODER, 0.13, prompt=4000, out=250, users=4),
        Kind(BIG, 0.027, prompt=800, out=350, users=2),
        Kind(EMBED, 0.143, prompt=3000, out=0, users=3),
    ),
    "two-popular": (
        Kind(CHAT, 0.40, prompt=500, out=300, users=8),
        Kind(GEMMA, 0.30, prompt=500, out=300, users=6),
        Kind(QWEN32, 0.12, prompt=800, out=350, users=3),
        Kind(EMBED, 0.18, prompt=3000, out=0, users=3),
    ),
}
"""What each pool's users send. In ``mixed`` the vLLM server adds chat capacity, so more of the lab's users
chat; the 70B, whose one home is the H100 still, arrives at the lab's rate (with the lab's shares it came at
twice what the H100 serves, and both routers lost requests to its timeouts)."""
WORKLOADS = {
    "lab": ("lab", "scenario", "conversations"),
    "replicas": ("scenario", "conversations"),
    "six": ("lab", "scenario", "conversations"),
    "mixed": ("lab", "scenario", "conversations"),
    "two-popular": ("lab", "scenario", "conversations"),
}
"""The ``--workload`` values each pool runs: the replicas (issue 31's pool (a)) are measured on the simulator's
requests."""
