"""Issue 28 item 11: work a client leaves behind is recorded and charged to the person.

A client whose non-streamed requests timed out at 6 s and were sent again, while each answer took 10 s
at the backend, held about 80 slot-seconds in 41 s and had no row in ``mr usage``: a request whose
client left before its whole answer came was settled with 0 tokens, and only requests with tokens get
a row. Here each answer takes 1 s and the client gives up after 0.4 s, three times.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from mindrouter.daemon.edge.services import SERVICES

from .conftest import Daemon, until
from .fakes import FakeOllama

CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "tell me a long story " * 20}], "stream": False}


def rows(d: Daemon, user: str) -> list[tuple[int, int, float]]:
    d.app[SERVICES].usage.write()
    return [
        tuple(r)
        for r in d.app[SERVICES].store._db.execute(
            "SELECT prompt_tokens, completion_tokens, gpu_seconds FROM usage JOIN users u ON u.id = usage.user_id"
            " WHERE u.name = ? ORDER BY usage.id",
            (user,),
        )
    ]


async def test_whole_answers_a_client_left_are_recorded_with_the_backends_time_and_an_estimate(
    daemon: Daemon,
) -> None:
    async with FakeOllama(models=["llama3"], tokens_per_second=20, completion_tokens=20) as fake:
        await daemon.backend("gpu", fake.url, "ollama", max_concurrent=1)
        key = await daemon.user("ann")
        headers = {"Authorization": f"Bearer {key}"}
        resp = await daemon.client.post("/api/chat", json=CHAT, headers=headers)  # teaches the backend's pace
        assert resp.status == 200 and (await resp.json())["eval_count"] == 20
        ((prompt, completion, held),) = rows(daemon, "ann")
        assert completion == 20 and held >= 0.9
        for _ in range(3):  # gives up after 0.4 s, as a client with a short timeout does, and sends it again
            try:
                await daemon.client.post(
                    "/api/chat", json=CHAT, headers=headers, timeout=aiohttp.ClientTimeout(total=0.4)
                )
            except TimeoutError:
                pass
            else:
                raise AssertionError("the answer came within 0.4 s")
        await until(lambda: daemon.scheduler.running_count == 0, "the abandoned answers still hold the slot")
        left = rows(daemon, "ann")[1:]
        print(f"abandoned whole answers recorded as (prompt, completion, gpu_seconds): {left}")
        assert len(left) == 3, left
        for p, c, g in left:
            assert p == prompt or abs(p - prompt) <= prompt // 2, (p, prompt)  # the prompt's estimate
            assert 2 <= c <= 20, c  # about 20 tokens a second for about 0.4 s, never more than the answer
            assert 0.3 <= g < 1.0, g
        report = await daemon.admin("GET", "/admin/usage?by=user&since=1h")
        (ann,) = [r for r in report["rows"] if r["user"] == "ann"]
        assert ann["requests"] == 4 and ann["completion_tokens"] == 20 + sum(c for _, c, _ in left)


async def test_a_stream_left_before_its_first_chunk_is_charged_its_prompt(daemon: Daemon, tmp_path: Any) -> None:
    async with FakeOllama(models=["llama3"], first_byte_delay=2.0) as fake:
        await daemon.backend("gpu", fake.url, "ollama", max_concurrent=1)
        key = await daemon.user("bo")
        try:
            await daemon.client.post(
                "/api/chat",
                json={**CHAT, "stream": True},
                headers={"Authorization": f"Bearer {key}"},
                timeout=aiohttp.ClientTimeout(total=0.4),
            )
        except TimeoutError:
            pass
        await until(lambda: daemon.scheduler.running_count == 0, "the abandoned stream still holds the slot")
        ((prompt, completion, held),) = rows(daemon, "bo")
        assert prompt > 0 and completion == 0 and held >= 0.3
