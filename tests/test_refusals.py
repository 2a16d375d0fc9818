"""Every refusal a client can receive is JSON in its route's dialect, with an X-Request-Id and no banner (issue 19).

Issue 19 found aiohttp's ``Server: Python/3.11 aiohttp/3.14.5`` on every answer (it tells an
attacker which aiohttp's bugs to try) and refusals no handler saw (an unknown route, a wrong
method, a body too large) without an ``X-Request-Id`` to quote. Each refusal the handlers and
middlewares produce is made here in both dialects, through a real daemon and a fake Ollama.
(Parse-level refusals, malformed HTTP, are aiohttp's protocol's, before any middleware.)
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from .conftest import until
from .fakes import FakeOllama
from .test_request_path import auth

PATHS = {"openai": "/v1/chat/completions", "ollama": "/api/chat"}


def chat(model: str = "llama3", **kw: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False, **kw}


async def refused(resp: Any, dialect: str, status: int) -> str:
    """Assert the refusal's status, shape and headers; its message."""
    assert resp.status == status, (resp.status, await resp.text())
    assert resp.headers.get("Server") == "mindrouter", resp.headers.get("Server")
    assert resp.headers["X-Request-Id"].startswith("mr-"), dict(resp.headers)
    assert resp.content_type == "application/json"
    body = json.loads(await resp.read())
    if dialect == "ollama":
        assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
        return str(body["error"])
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"] and "type" in error and "code" in error, body
    return str(error["message"])


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_every_refusal_is_json_in_its_dialect_with_an_id_and_no_banner(new_daemon, dialect):
    scheduler = {"queue_timeout": 0.5, "max_queued_per_user": 1}
    d = await new_daemon(scheduler=scheduler, backends={"poll_interval": 60})
    path = PATHS[dialect]
    bad = {"options": {"temperature": -1}} if dialect == "ollama" else {"temperature": -1}
    root = "/api" if dialect == "ollama" else "/v1"
    async with FakeOllama(models=["llama3"], completion_tokens=10, tokens_per_second=10) as fake:
        await d.backend("b1", fake.url, "ollama", max_concurrent=1)
        key, other = await d.user("alice"), await d.user("bob")
        cases = {
            "no key": (await d.client.post(path, json=chat()), 401),
            "a wrong key": (await d.client.post(path, json=chat(), headers=auth("mr-nosuch")), 401),
            "not JSON": (await d.client.post(path, data=b"{model", headers=auth(key)), 400),
            "a bad field": (
                await d.client.post(path, json=chat(**bad), headers=auth(key)),
                400,
            ),
            "an unknown model": (await d.client.post(path, json=chat("nosuch"), headers=auth(key)), 404),
            "an unknown route": (await d.client.post(f"{root}/nosuch", json=chat(), headers=auth(key)), 404),
            "a wrong method": (await d.client.get(path, headers=auth(key)), 405),
            "a body too large": (
                await d.client.post(path, data=b"x" * (d.config.server.max_body_bytes + 1), headers=auth(key)),
                413,
            ),
        }
        # The only slot busy: bob's second request waits, his third is one too many, the waiting one times out.
        busy = asyncio.create_task(d.client.post(path, json=chat(), headers=auth(other)))
        await until(lambda: d.scheduler.running_count == 1)
        waiting = asyncio.create_task(d.client.post(path, json=chat(), headers=auth(other)))
        await until(lambda: d.scheduler.queued_count == 1)
        cases["a full queue"] = (await d.client.post(path, json=chat(), headers=auth(other)), 429)
        cases["a queue timeout"] = (await waiting, 504)
        await busy
        await d.admin("PUT", "/admin/users/alice/quota", {"tokens_per_day": 1})
        cases["a spent quota"] = (await d.client.post(path, json=chat(), headers=auth(key)), 429)
        for name, (resp, status) in cases.items():
            message = await refused(resp, dialect, status)
            assert len(message) > 20 and not message.startswith("HTTP"), (name, message)  # a sentence
        ok = await d.client.post(path, json=chat(), headers=auth(other))
        assert ok.status == 200 and ok.headers.get("Server") == "mindrouter"
        health = await d.client.get("/health")
        assert health.status == 200 and health.headers.get("Server") == "mindrouter"
