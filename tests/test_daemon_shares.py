"""Three users at weights 3/2/1 saturating one backend through the daemon get 50/33/17.

Run alone with ``pytest -m shares``. Shares are measured from the token counts
in the responses the clients received, after a 2 s warm-up.
"""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from .fakes import FakeOpenAI

pytestmark = pytest.mark.shares

DURATION = 12.0
WARMUP = 2.0


async def test_weights_3_2_1_get_50_33_17_within_5_points(daemon):
    async with FakeOpenAI(flavor="vllm", models=["llama3"], tokens_per_second=400, completion_tokens=40) as fake:
        await daemon.backend("b1", fake.url, "vllm", max_concurrent=4)
        users = {"fac": ("faculty", 3), "stf": ("staff", 2), "stu": ("student", 1)}
        keys = {name: await daemon.user(name, group) for name, (group, _) in users.items()}
        tokens = {name: 0 for name in users}
        start = time.monotonic()
        stop = start + DURATION

        async def worker(name: str) -> None:
            client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=keys[name], max_retries=0)
            while time.monotonic() < stop:
                reply = await client.chat.completions.create(
                    model="llama3", messages=[{"role": "user", "content": "one two three four five"}], max_tokens=40
                )
                if time.monotonic() - start > WARMUP:
                    tokens[name] += reply.usage.prompt_tokens + reply.usage.completion_tokens
            await client.close()

        await asyncio.gather(*(worker(name) for name in users for _ in range(6)))
        total = sum(tokens.values())
        shares = {name: tokens[name] / total for name in users}
        print("shares", {k: round(v * 100, 1) for k, v in shares.items()}, "tokens", total)
        assert fake.max_seen_in_flight <= 4
        for name, (_, weight) in users.items():
            assert abs(shares[name] - weight / 6) < 0.05, shares
