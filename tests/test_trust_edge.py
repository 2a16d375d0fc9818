"""Issue 28 items 7, 9 and 10: what a client without a key can make the daemon log, and what every refusal looks like.

A body falsely labelled gzip was a 400 plus a 2 KB traceback in the log for each try;
a key id beyond 64 bits was a 500; parse-level refusals on ``/api`` came in OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from pathlib import Path

import aiohttp
import pytest

from .conftest import ADMIN_KEY, Daemon, serve_daemon
from .fakes import FakeOllama
from .test_web_ui import csrf_of, login

CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": False}


def exchange(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``raw`` on a new connection; the status, headers and body of the answer (read to the close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split(" ")[1]), headers, body


def request(path: str, headers: list[str], body: bytes = b"{}") -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: x", "Connection: close", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def assert_dialect(path: str, body: bytes) -> str:
    """The error's message, after checking its shape: Ollama's ``{"error": "..."}`` on /api, else OpenAI's."""
    error = json.loads(body)["error"]
    if path.startswith("/api/"):
        assert isinstance(error, str) and error, body
        return error
    assert isinstance(error, dict) and error["message"] and "code" in error, body
    return str(error["message"])


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate", "/v1/chat/completions"])
async def test_parse_level_refusals_come_in_the_dialect_of_their_path(tmp_path: Path, path: str) -> None:
    """Item 10: too many headers, a header over 8,190 bytes and an undecodable br body, each refused by
    aiohttp's parser before the app sees it, in the path's dialect (they came in OpenAI's shape on /api)."""
    many = [f"X-Header-{i}: {i}" for i in range(200)]
    cases = {
        "too many headers": request(path, many),
        "a header over 8,190 bytes": request(path, ["X-Long: " + "a" * 9000]),
        "an undecodable br body": request(path, ["Content-Encoding: br"], b"\x00not brotli at all"),
    }
    async with FakeOllama(models=["llama3"]) as fake, serve_daemon(tmp_path, fake.url, "ollama") as d:
        loop = asyncio.get_running_loop()
        for what, raw in cases.items():
            status, headers, body = await loop.run_in_executor(None, exchange, d.port, raw)
            assert status == 400, (what, status, body)
            assert headers["Content-Type"].startswith("application/json"), (what, headers)
            assert_dialect(path, body)
        # A later request on a new connection is served as usual.
        status, _, body = await loop.run_in_executor(
            None,
            exchange,
            d.port,
            request("/api/chat", [f"Authorization: Bearer {d.key}"], json.dumps(CHAT).encode()),
        )
        assert status == 200, body


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
async def test_a_body_falsely_labelled_gzip_is_a_400_with_at_most_one_log_line(
    tmp_path: Path, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Item 7: 50 bodies that claim gzip and are not; each a 400 in its dialect, and the log holds no traceback
    (each was one of 2 KB: 0.66 MB/s from one client), one line at most about undecodable bodies, and one
    line at most per request (a body that decodes to something else is refused as bad JSON)."""
    async with FakeOllama(models=["llama3"]) as fake, serve_daemon(tmp_path, fake.url, "ollama") as d:
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            async with aiohttp.ClientSession(auto_decompress=False) as session:
                for i in range(50):
                    resp = await session.post(
                        f"{d.url}{path}",
                        data=b'{"model": "llama3"}' if i % 2 else b"\x1f\x8b\x08\x00garbage",
                        headers={"Authorization": f"Bearer {d.key}", "Content-Encoding": "gzip"},
                    )
                    assert resp.status == 400, await resp.text()
                    assert_dialect(path, await resp.read())
            await asyncio.sleep(0.1)  # aiohttp logged its traceback after the answer, draining the body
        records = caplog.records
        assert not [r for r in records if r.exc_info], [r.getMessage()[:200] for r in records if r.exc_info]
        undecodable = [r for r in records if "read as sent" in r.getMessage() or "gzip" in r.getMessage()]
        assert len(undecodable) <= 1, [r.getMessage()[:200] for r in undecodable]
        assert len(records) <= 50 + 1 and max(len(r.getMessage()) for r in records) < 300
        async with aiohttp.ClientSession() as session:
            resp = await session.post(f"{d.url}/api/chat", json=CHAT, headers={"Authorization": f"Bearer {d.key}"})
            assert resp.status == 200


BEYOND_64_BITS = "1" + "0" * 29


async def test_a_key_id_beyond_64_bits_is_a_404_in_the_admin_api(daemon: Daemon) -> None:
    """Item 9: ``DELETE /admin/users/NAME/keys/1e29`` (in digits) was an OverflowError into SQLite, a 500."""
    await daemon.user("ana")
    for key_id in (BEYOND_64_BITS, str(2**63), str(2**64)):
        answer = await daemon.admin("DELETE", f"/admin/users/ana/keys/{key_id}", status=404)
        assert "mr user keys ana" in answer["error"]["message"]
    assert len(await daemon.admin("GET", "/admin/users/ana/keys")) == 1


async def test_a_key_id_beyond_64_bits_in_the_ui_revoke_form_is_a_flash_error(daemon: Daemon) -> None:
    await daemon.user("ana")
    await login(daemon, ADMIN_KEY)
    token = csrf_of(await (await daemon.client.get("/ui/admin/users/ana")).text())
    resp = await daemon.client.post(f"/ui/admin/users/ana/keys/{BEYOND_64_BITS}/revoke", data={"csrf": token})
    page = await resp.text()
    assert resp.status < 500, (resp.status, page[:300])  # the form's page again, with the refusal flashed
    assert 'class="flash error"' in page and "has no key with id" in page
    assert len(await daemon.admin("GET", "/admin/users/ana/keys")) == 1


async def test_a_new_key_for_an_unknown_user_in_the_ui_is_a_404_page(daemon: Daemon) -> None:
    """Found by the web UI form fuzz (tests/test_bad_input.py): the store's "does not exist" escaped the
    page that makes a key, a 500."""
    await daemon.user("ana")
    await login(daemon, ADMIN_KEY)
    token = csrf_of(await (await daemon.client.get("/ui/admin/users/ana")).text())
    resp = await daemon.client.post("/ui/admin/users/nobody/keys", data={"csrf": token})
    page = await resp.text()
    assert resp.status == 404, (resp.status, page[:300])
    assert 'class="flash error"' in page and "user &#39;nobody&#39; does not exist" in page
