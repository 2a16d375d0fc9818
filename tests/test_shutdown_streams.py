"""SIGTERM under load: every stream, queued or running, ends with its dialect's error ending."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import aiohttp

from .fakes import FakeOpenAI
from .harness import until
from .test_serve import free_port, pool_of_one, start_serve

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def ends_in_its_dialect(path: str, text: str) -> bool:
    """An Ollama stream's last line is ``{"error": ...}``; an OpenAI stream's last event is an error, then [DONE]."""
    if path.startswith("/api/"):
        last = text.strip().splitlines()[-1] if text.strip() else ""
        return last.startswith("{") and "error" in json.loads(last)
    events = [e for e in text.split("\n\n") if e.startswith("data: ")]
    return len(events) >= 2 and events[-1] == "data: [DONE]" and '"error"' in events[-2]


async def test_sigterm_ends_every_queued_and_running_stream_in_its_dialect(tmp_path: Path):
    """A stream running past the grace, and streams queued on a fresh and on a reused connection,
    in both dialects: each gets its error ending (a queued Ollama stream, whose headers wait for its
    slot, a 503), none an empty body."""
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(
        f'[server]\nport = {port}\nsocket = "{tmp_path / "mr.sock"}"\nstate_dir = "{tmp_path / "state"}"\n'
        "shutdown_grace_seconds = 1.5\n[backends]\npoll_interval = 0.5\n"
    )
    proc, _ = await asyncio.to_thread(start_serve, config, tmp_path / "serve.log", tmp_path / "mr.sock")
    try:
        async with FakeOpenAI(flavor="vllm", models=["m"], tokens_per_second=10, completion_tokens=300) as fake:
            key = await pool_of_one(config, fake.url, "--max-concurrent", "1")
            base, headers = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {key}"}

            async def ask(path: str, reuse: bool, stream: bool = True) -> tuple[int, str]:
                connector = aiohttp.TCPConnector(limit=1)
                async with aiohttp.ClientSession(connector=connector) as session:
                    if reuse:  # a second request on one connection: aiohttp's handler answers it
                        async with session.get(f"{base}/api/version") as first:
                            await first.read()
                    body = {**CHAT, "stream": stream}
                    async with session.post(f"{base}{path}", json=body, headers=headers) as resp:
                        got = bytearray()
                        try:
                            async for data in resp.content.iter_any():
                                got += data
                        except aiohttp.ClientPayloadError:
                            got += b"<cut: unterminated body>"
                        return resp.status, got.decode()

            running = asyncio.create_task(ask("/api/chat", False))  # 30 s of tokens: cut at the grace
            await until(lambda: fake.in_flight == 1, "the 30 s stream should hold the one slot")
            cases = [(p, reuse) for p in ("/api/chat", "/v1/chat/completions") for reuse in (False, True)]
            queued = [asyncio.create_task(ask(p, reuse)) for p, reuse in cases]
            plain = [asyncio.create_task(ask(p, True, stream=False)) for p in ("/api/chat", "/v1/chat/completions")]

            async def all_six_wait() -> bool:
                async with aiohttp.ClientSession() as session, session.get(f"{base}/metrics") as metrics:
                    return "mindrouter_queue_depth 6.0" in await metrics.text()

            await until(all_six_wait, "six requests should wait for the one slot", timeout=30)
            began = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            answers = await asyncio.wait_for(asyncio.gather(*queued), 10)
            refusals = await asyncio.wait_for(asyncio.gather(*plain), 10)
            status, text = await asyncio.wait_for(running, 10)
        for (path, reuse), (code, body) in zip(cases, answers, strict=True):
            if path.startswith("/api/"):  # a waiting Ollama stream has no headers yet: a 503 in its dialect
                assert code == 503 and ends_in_its_dialect(path, body), (path, reuse, body)
            else:
                assert code == 200 and ends_in_its_dialect(path, body), (path, reuse, body)
            assert "shutting down" in body, (path, reuse, body)
        for code, body in refusals:  # not streamed, queued behind a reused connection: a 503 in its dialect
            assert code == 503 and "shutting down" in body, (code, body)
        assert status == 200 and '"content"' in text and ends_in_its_dialect("/api/chat", text), text[-300:]
        assert await asyncio.to_thread(proc.wait, 15) == 0
        assert time.monotonic() - began < 8
        assert "Traceback" not in (tmp_path / "serve.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


async def test_sigkill_keeps_the_usage_streams_had_delivered(tmp_path: Path):
    """Three streams killed mid-answer: after the restart each has a usage row for what its client got
    (charges are written while streaming, once a second; a kill loses at most that last second)."""
    import sqlite3

    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(
        f'[server]\nport = {port}\nsocket = "{tmp_path / "mr.sock"}"\nstate_dir = "{tmp_path / "state"}"\n'
    )
    proc, _ = await asyncio.to_thread(start_serve, config, tmp_path / "serve.log", tmp_path / "mr.sock")
    try:
        async with FakeOpenAI(flavor="vllm", models=["m"], tokens_per_second=20, completion_tokens=400) as fake:
            key = await pool_of_one(config, fake.url)
            got = [0, 0, 0]

            async def stream(i: int) -> None:
                async with aiohttp.ClientSession() as session:
                    path, body = ("/api/chat", CHAT) if i else ("/v1/chat/completions", CHAT)
                    try:
                        async with session.post(
                            f"http://127.0.0.1:{port}{path}", json=body, headers={"Authorization": f"Bearer {key}"}
                        ) as resp:
                            async for line in resp.content:
                                got[i] += b'"content"' in line and b'"content":""' not in line
                    except aiohttp.ClientError:
                        pass  # killed

            tasks = [asyncio.create_task(stream(i)) for i in range(3)]
            await until(lambda: min(got) >= 60, "60 tokens on each stream before the kill", timeout=30)
            proc.kill()
            await asyncio.gather(*tasks)
        await asyncio.to_thread(proc.wait, 10)
        again, _ = await asyncio.to_thread(start_serve, config, tmp_path / "serve.log", tmp_path / "mr.sock")
        again.terminate()
        await asyncio.to_thread(again.wait, 15)
        with sqlite3.connect(tmp_path / "state" / "mindrouter.db") as db:
            rows = sorted(r[0] for r in db.execute("SELECT completion_tokens FROM usage"))
        print(f"SIGKILL mid-stream: clients got {sorted(got)} tokens, usage rows say {rows}")
        assert len(rows) == 3, rows
        assert all(g - 25 <= r <= g + 5 for r, g in zip(rows, sorted(got), strict=True)), (rows, got)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
