"""`mr group set-weight` while two groups saturate a backend: the change acts at once, live, and nobody stalls.

Measured through the API with the openai client, from the token counts in the
answers the clients received. The backend is in-process (tests/inprocess.py)
and every phase is a count of answers, not a time, so a loaded machine
measures the same.
"""

from __future__ import annotations

import asyncio

import openai

from .harness import Daemon, until
from .inprocess import InProcess

BEFORE = 24
"""Answers at the first weights (student 1, staff 1) before ``mr group set-weight staff 3``."""
SETTLE = 2
"""Answers after the change left out of the measure: the two already running when it came."""
MEASURED = 48
"""Answers measured after the change."""
WINDOW = 8
"""Any run of this many measured answers holds one of each group's: at 3 : 1 a stall would leave one out."""


async def test_group_set_weight_during_saturation_moves_shares_and_starves_nobody(daemon: Daemon) -> None:
    backends = InProcess(models=("llama3",), completion_tokens=20, held=True)
    await daemon.backend("b1", backends, max_concurrent=2)
    await daemon.admin("PUT", "/admin/groups/staff", {"weight": 1})
    keys = {"stu": await daemon.user("stu", "student"), "stf": await daemon.user("stf", "staff")}
    order: list[tuple[str, int]] = []  # (who, tokens) in the order the answers came back
    end = BEFORE + SETTLE + MEASURED

    async def worker(name: str) -> None:
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=keys[name], max_retries=0)
        while len(order) < end:
            reply = await client.chat.completions.create(
                model="llama3", messages=[{"role": "user", "content": "one two three"}], max_tokens=20
            )
            assert reply.usage is not None
            order.append((name, reply.usage.prompt_tokens + reply.usage.completion_tokens))
        await client.close()

    async def backend() -> None:
        """Finishes one request at a time, each while both slots run and the six others wait."""
        while len(order) < end:
            await until(lambda: backends.in_flight == 2 and daemon.scheduler.queued_count == 6, "the pool is saturated")
            answered = len(order)
            backends.let_one()
            await until(lambda answered=answered: len(order) > answered, "the answer came back")
            if len(order) == BEFORE:
                await daemon.admin("PUT", "/admin/groups/staff", {"weight": 3})  # what `mr group set-weight` sends
        backends.open_gate()

    await asyncio.gather(backend(), *(worker(name) for name in keys for _ in range(4)))
    measured = order[BEFORE + SETTLE : end]
    tokens = {name: sum(t for who, t in measured if who == name) for name in keys}
    share = tokens["stf"] / (tokens["stf"] + tokens["stu"])
    print("staff share after the change", round(share * 100, 1), "tokens", tokens)
    assert abs(share - 0.75) <= 0.08, share  # 3 : 1 from the change on
    before = [who for who, _ in order[:BEFORE]]
    assert abs(before.count("stf") / BEFORE - 0.5) <= 0.1, before  # 1 : 1 until then
    for start in range(len(measured) - WINDOW + 1):
        window = {who for who, _ in measured[start : start + WINDOW]}
        assert window == {"stu", "stf"}, (start, measured)  # neither group stalls
    weights = {u["name"]: u["weight"] for u in (await daemon.admin("GET", "/admin/share"))["users"]}
    assert weights == {"stu": 1, "stf": 3}
