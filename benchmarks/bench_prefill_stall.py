"""Prefill beside decode on a real llama-server: does a prompt being read stall the streams decoding beside it?

Issue 31 asks how a server shares its work between one request's prompt and
the others' answers. The workstation model (``mindrouter/simulate/workstation/gpu.py``)
takes vLLM's step (every decoding stream's token, then a chunk of prompt up to
the step's budget), under which a prompt stalls every decoding stream for
about its own reading, and takes Ollama's and llama.cpp's prompts to slow the
others as one more stream does. llama-server builds each step as vLLM does
(decoding slots' tokens, then prompt tokens up to ``--batch-size``), and so
does Ollama's runner with its ``num_batch`` of 512. This measures it: stream A
writes a long answer; B's long prompt is sent while A writes; A's lost seconds
over B's prompt time alone say which law holds (about 1: the step's; about the
slowdown per stream, 0.05-0.2: one more stream's).

    scripts/llama-server.sh build && scripts/llama-server.sh model smollm2
    python benchmarks/bench_prefill_stall.py [--model smollm2] [--batch 2048 512] [--prompt 1500] [--trials 3]

On a GPU (issue 31's device) point it at a server started by hand: ``--url
http://127.0.0.1:8080``. Figures are wall seconds on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "llama-server.sh"
WORDS = ("alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "maple", "orbit", "candle", "harbor", "violet")
EXACT = {"grammar": "root ::= [a-z ]+", "ignore_eos": True, "cache_prompt": False}
"""Every answer exactly ``n_predict`` tokens, and no prompt found in a slot's cache."""


@dataclass
class Trial:
    prompt_tokens: int
    alone_s: float
    """B's prompt reading with nothing beside it (the server's ``timings.prompt_ms``)."""
    beside_s: float
    """B's prompt reading while A writes."""
    gap_s: float
    """A's usual seconds per token before B came."""
    lost_s: float
    """Seconds A wrote nothing it would have written at its usual pace, while B's prompt was read."""
    longest_s: float
    """A's longest wait for one token while B's prompt was read."""


def text(tokens: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randrange(1000)) for _ in range(tokens // 3))


async def completion(session: aiohttp.ClientSession, url: str, prompt: str, n: int) -> dict:
    async with session.post(f"{url}/completion", json={"prompt": prompt, "n_predict": n, **EXACT}) as r:
        r.raise_for_status()
        return await r.json()


async def stream(session: aiohttp.ClientSession, url: str, prompt: str, n: int, stamps: list[float]) -> None:
    body = {"prompt": prompt, "n_predict": n, "stream": True, **EXACT}
    async with session.post(f"{url}/completion", json=body) as r:
        r.raise_for_status()
        async for line in r.content:
            if line.startswith(b"data: ") and json.loads(line[6:]).get("content"):
                stamps.append(time.monotonic())


async def trial(session: aiohttp.ClientSession, url: str, prompt_tokens: int, answer: int, rng: random.Random) -> Trial:
    alone = await completion(session, url, text(prompt_tokens, rng), 1)
    stamps: list[float] = []
    writer = asyncio.create_task(stream(session, url, text(20, rng), answer, stamps))
    while len(stamps) < 40:  # A's pace settles first
        await asyncio.sleep(0.01)
    sent = time.monotonic()
    beside = await completion(session, url, text(prompt_tokens, rng), 1)
    read = time.monotonic()
    await writer
    return Trial(
        alone["timings"]["prompt_n"],
        alone["timings"]["prompt_ms"] / 1000,
        beside["timings"]["prompt_ms"] / 1000,
        *pace(stamps, sent, read),
    )


def pace(stamps: list[float], sent: float, read: float) -> tuple[float, float, float]:
    """A's usual seconds a token before ``sent`` (its first 5 tokens left out), the seconds it wrote nothing it
    would have at that pace between ``sent`` and ``read``, and its longest wait for a token then."""
    gap = statistics.median([b - a for a, b in itertools.pairwise(stamps) if b <= sent][5:])
    during = [t for t in stamps if sent < t <= read]
    waits = [b - a for a, b in zip([sent, *during], [*during, read], strict=True)]
    return gap, max(0.0, (read - sent) - len(during) * gap), max(waits)


async def measure(url: str, prompt_tokens: int, answer: int, trials: int, seed: int) -> list[Trial]:
    rng = random.Random(seed)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        return [await trial(session, url, prompt_tokens, answer, rng) for _ in range(trials)]


def start(port: int, model: str, batch: int, threads: int) -> str:
    env = {"MR_LLAMA_CTX": "16384", "MR_LLAMA_THREADS": str(threads), "MR_LLAMA_WAIT": "60"}
    args = [str(SCRIPT), "start", str(port), "--model", model, "--parallel", "2", "--", "-b", str(batch)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, env={**os.environ, **env}, check=True)
    return out.stdout.strip()


def report(label: str, rows: list[Trial]) -> None:
    alone, lost = statistics.median(r.alone_s for r in rows), statistics.median(r.lost_s for r in rows)
    beside, gap = statistics.median(r.beside_s for r in rows), statistics.median(r.gap_s for r in rows)
    print(
        f"{label:<22} prompt {rows[0].prompt_tokens:>5} tokens: read alone {alone:6.3f} s, beside A {beside:6.3f} s;"
        f" A's pace {gap * 1000:5.1f} ms a token, lost {lost:6.3f} s ({lost / alone:4.2f} of B's reading),"
        f" longest wait {statistics.median(r.longest_s for r in rows):6.3f} s  [{len(rows)} trials]",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running llama-server (else one is started per --batch)")
    parser.add_argument("--model", default="smollm2", help="tiny, smollm2 or a GGUF path (scripts/llama-server.sh)")
    parser.add_argument("--batch", type=int, nargs="*", default=[2048, 512], help="llama-server --batch-size values")
    parser.add_argument("--prompt", type=int, default=1500, help="B's prompt, in tokens (about)")
    parser.add_argument("--answer", type=int, default=400, help="A's answer, in tokens")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--port", type=int, default=18431)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.url:
        report("given server", asyncio.run(measure(args.url, args.prompt, args.answer, args.trials, args.seed)))
        return
    for batch in args.batch:
        url = start(args.port, args.model, batch, args.threads)
        try:
            report(f"--batch-size {batch}", asyncio.run(measure(url, args.prompt, args.answer, args.trials, args.seed)))
        finally:
            subprocess.run([str(SCRIPT), "stop", str(args.port)], capture_output=True, timeout=60, check=False)


if __name__ == "__main__":
    main()
