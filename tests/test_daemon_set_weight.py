"""`mr group set-weight` while two groups saturate a backend: the change acts at once, live, and nobody stalls.

Measured through the API with the openai client, from the token counts in the
answers the clients received.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import openai

from .fakes import FakeOpenAI

BEFORE = 1.5
"""Seconds of saturation at the first weights (student 1, staff 1)."""
MEASURED = 80
"""Answers measured after ``mr group set-weight staff 3``: a count, not a time, so a loaded machine measures as much."""
SETTLE = 16
"""Answers after the change left out of the measure (requests already running and queued at the old rates)."""
LIMIT = 30.0
"""Seconds the whole test may take on a very slow machine."""


async def test_group_set_weight_during_saturation_moves_shares_and_starves_nobody(daemon):
    async with FakeOpenAI(flavor="vllm", models=["llama3"], tokens_per_second=800, completion_tokens=20) as fake:
        await daemon.backend("b1", fake.url, "vllm", max_concurrent=2)
        await daemon.admin("PUT", "/admin/groups/staff", {"weight": 1})
        keys = {"stu": await daemon.user("stu", "student"), "stf": await daemon.user("stf", "staff")}
        start = time.monotonic()
        changed_at = start + BEFORE
        tokens = {name: 0 for name in keys}
        measured = {name: 0 for name in keys}
        finished: dict[str, list[float]] = {name: [] for name in keys}
        done = asyncio.Event()
        after = [0]

        async def worker(name: str) -> None:
            client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=keys[name], max_retries=0)
            while not done.is_set() and time.monotonic() < start + LIMIT:
                reply = await client.chat.completions.create(
                    model="llama3", messages=[{"role": "user", "content": "one two three"}], max_tokens=20
                )
                now = time.monotonic()
                finished[name].append(now)
                if now >= changed_at and not done.is_set():
                    after[0] += 1
                    if after[0] > SETTLE:
                        tokens[name] += reply.usage.prompt_tokens + reply.usage.completion_tokens
                        measured[name] += 1
                        if sum(measured.values()) >= MEASURED:
                            done.set()
            await client.close()

        async def admin() -> None:
            await asyncio.sleep(BEFORE)
            await daemon.admin("PUT", "/admin/groups/staff", {"weight": 3})  # what `mr group set-weight staff 3` sends

        await asyncio.gather(admin(), *(worker(name) for name in keys for _ in range(4)))
        share = tokens["stf"] / (tokens["stf"] + tokens["stu"])
        print("staff share after the change", round(share * 100, 1), "tokens", tokens, "answers", measured)
        assert done.is_set(), measured
        assert fake.max_seen_in_flight <= 2
        assert abs(share - 0.75) <= 0.08, share  # 3 : 1 from the change on, not a stall of either
        for name, times in finished.items():
            gaps = [b - a for a, b in itertools.pairwise(times)]
            worst = max(range(len(gaps)), key=gaps.__getitem__)
            print(
                name,
                "longest gap",
                round(gaps[worst], 3),
                "at",
                round(times[worst] - changed_at, 3),
                "s from the change",
            )
            assert max(gaps) < 1.5, (name, max(gaps))  # answers take ~25 ms; a stall would last the whole measure
        weights = {u["name"]: u["weight"] for u in (await daemon.admin("GET", "/admin/share"))["users"]}
        assert weights == {"stu": 1, "stf": 3}
