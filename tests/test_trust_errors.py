"""Issue 28 item 12: ``mindrouter_errors_total`` counts every error answer, once.

Of 5 error answers (bad JSON, 413, 401, unknown model, bad encoding) the metric counted 3: the
guard middleware's answers, aiohttp's parse-level refusals and streams broken after their first
byte were never counted. Here each kind is sent once and the counter read.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections import Counter
from pathlib import Path

from aiohttp import ClientSession

from .conftest import ADMIN_KEY, serve_daemon
from .fakes import FakeOllama
from .harness import daemon, until
from .inprocess import InProcess


async def errors_counted(client: ClientSession, url: str) -> Counter[str]:
    async with client.get(f"{url}/metrics") as resp:
        text = await resp.text()
    return Counter(
        {
            m.group(1): int(float(m.group(2)))
            for m in re.finditer(r'mindrouter_errors_total\{status="([^"]+)"\} (\S+)', text)
        }
    )


def malformed(port: int) -> bytes:
    """200 headers: refused by aiohttp's parser before the app sees the request."""
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + "".join(f"X-H{i}: v\r\n" for i in range(200))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode() + b"Content-Length: 2\r\n\r\n{}")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


async def test_every_kind_of_error_answer_is_counted_once(tmp_path: Path) -> None:
    chat = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    async with (
        FakeOllama(models=["llama3"], completion_tokens=6) as fake,
        serve_daemon(tmp_path, fake.url, "ollama", max_body_bytes=4096) as d,
    ):
        key = {"Authorization": f"Bearer {d.key}"}
        async with ClientSession(auto_decompress=False) as s:
            assert await errors_counted(s, d.url) == Counter()
            sent: Counter[str] = Counter()

            async def expect(status: int, method: str, path: str, **kw: object) -> None:
                async with s.request(method, d.url + path, **kw) as resp:  # type: ignore[arg-type]
                    assert resp.status == status, (path, resp.status, await resp.text())
                sent[str(status)] += 1

            await expect(400, "POST", "/v1/chat/completions", data=b"{not json", headers=key)  # the handler's
            await expect(413, "POST", "/v1/chat/completions", data=b"x" * 5000, headers=key)  # the guard's
            await expect(401, "POST", "/v1/chat/completions", json=chat)
            await expect(404, "POST", "/api/chat", json={**chat, "model": "nosuch"}, headers=key)
            await expect(400, "POST", "/api/chat", data=b"not gzip", headers={**key, "Content-Encoding": "gzip"})
            await expect(404, "GET", "/nosuch")
            await expect(405, "GET", "/api/chat")
            await expect(404, "GET", "/admin/users/nobody/keys", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
            answer = await asyncio.get_running_loop().run_in_executor(None, malformed, d.port)
            assert answer.startswith(b"HTTP/1.1 400") or answer.startswith(b"HTTP/1.0 400"), answer[:100]
            sent["400"] += 1
            # A stream the backend breaks after its first byte: 200, then the error tail.
            fake.drop_next(after_chunks=2)
            async with s.post(d.url + "/api/chat", json={**chat, "stream": True}, headers=key) as resp:
                lines = [json.loads(line) for line in (await resp.read()).splitlines() if line]
            assert resp.status == 200 and "error" in lines[-1], lines[-2:]
            sent["stream"] += 1
            # And answers that are not errors are not counted.
            async with s.post(d.url + "/api/chat", json=chat, headers=key) as resp:
                assert resp.status == 200
            assert await errors_counted(s, d.url) == sent, sent


async def test_a_waiting_stream_that_times_out_after_its_headers_is_one_error_answer(tmp_path: Path) -> None:
    """An OpenAI stream gets its headers while it waits; its queue timeout is then an error tail after a
    200, counted once as "stream" (the 504 it would have been is never prepared, so never counted)."""
    chat = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}
    async with daemon(tmp_path, scheduler={"queue_timeout": 0.5}) as d:
        backend = InProcess(models=("llama3",), held=True)
        await d.backend("b1", backend, max_concurrent=1)
        key = {"Authorization": f"Bearer {await d.user('ann')}"}
        first = asyncio.create_task(d.client.post("/v1/chat/completions", json=chat, headers=key))
        await until(lambda: backend.in_flight == 1, "the first request should hold the slot")
        async with d.client.post("/v1/chat/completions", json={**chat, "stream": True}, headers=key) as resp:
            text = await resp.text()
        assert resp.status == 200 and "in the queue" in text and text.endswith("data: [DONE]\n\n"), text
        backend.open_gate()
        assert (await first).status == 200
        assert await errors_counted(d.client.session, d.url) == Counter({"stream": 1})
