"""Who gets in and what leaks (issue 10 item 4): keys, the admin API, /metrics, /health, backend URLs."""

from __future__ import annotations

import io
import json
import logging
import socket

import aiohttp
import pytest
from typer.testing import CliRunner

from mindrouter.cli import app as mr_app
from mindrouter.daemon.edge.logsafe import OneLineFormatter
from mindrouter.errors import UsageError

from .fakes import FakeOllama
from .harness import ADMIN_KEY
from .inprocess import InProcess

pytestmark = pytest.mark.asyncio

CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_one_key_is_revoked_alone_and_keys_are_listed_without_the_key(daemon):
    fake = InProcess(models=("llama3",), completion_tokens=8)
    await daemon.backend("b1", fake)
    k1 = await daemon.user("alice")
    k2 = (await daemon.admin("POST", "/admin/users/alice/keys"))["key"]
    assert (await daemon.client.post("/v1/chat/completions", json=CHAT, headers=bearer(k1))).status == 200
    keys = await daemon.admin("GET", "/admin/users/alice/keys")
    assert [set(k) for k in keys] == [{"id", "user", "label", "prefix", "created", "last_used"}] * 2
    assert keys[0]["last_used"] is not None and keys[1]["last_used"] is None
    assert k1 not in str(keys) and k2 not in str(keys) and keys[0]["prefix"] == k1[:9]

    await daemon.admin("DELETE", f"/admin/users/alice/keys/{keys[0]['id']}")
    assert (await daemon.client.post("/v1/chat/completions", json=CHAT, headers=bearer(k1))).status == 401
    assert (await daemon.client.post("/v1/chat/completions", json=CHAT, headers=bearer(k2))).status == 200
    assert [k["id"] for k in await daemon.admin("GET", "/admin/users/alice/keys")] == [keys[1]["id"]]
    # Another user's key id is not this user's to revoke.
    await daemon.user("bob")
    bob_key = (await daemon.admin("GET", "/admin/users/bob/keys"))[0]["id"]
    answer = await daemon.admin("DELETE", f"/admin/users/alice/keys/{bob_key}", status=404)
    assert "mr user keys alice" in answer["error"]["message"]


@pytest.mark.parametrize(
    "header", [None, "Bearer wrong", f"Bearer {ADMIN_KEY}x", f"Basic {ADMIN_KEY}", f"Bearer {ADMIN_KEY[:-1]}"]
)
async def test_admin_calls_on_tcp_need_the_exact_admin_key(daemon, header):
    resp = await daemon.client.get("/admin/users", headers={"Authorization": header} if header else {})
    assert resp.status == 401 and (await resp.json())["error"]["code"] == "admin_key_required"


async def test_admin_api_on_tcp_is_closed_without_an_admin_key(new_daemon):
    client = (await new_daemon(server={"admin_key": ""})).client
    for header in ({}, bearer(""), bearer(ADMIN_KEY)):
        assert (await client.get("/admin/status", headers=header)).status == 401


async def test_health_answers_without_a_key_and_says_nothing_more(daemon):
    resp = await daemon.client.get("/health")
    assert resp.status == 200 and await resp.text() == "ok\n"


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
async def test_metrics_show_who_uses_what_only_to_a_trusted_caller(new_daemon, host):
    d = await new_daemon(server={"host": host, "metrics_key": "scrape-me"})
    fake = InProcess(models=("llama3",), completion_tokens=8)
    await d.backend("b1", fake)
    key = await d.user("alice")
    assert (await d.client.post("/v1/chat/completions", json=CHAT, headers=bearer(key))).status == 200
    anonymous = await (await d.client.get("/metrics")).text()
    assert "mindrouter_requests_total 1.0" in anonymous  # counts for everyone
    assert 'user="alice"' not in anonymous  # on loopback too: a shared workstation has other accounts
    for secret in ("scrape-me", ADMIN_KEY):
        assert 'user="alice"' in await (await d.client.get("/metrics", headers=bearer(secret))).text()
    with_user_key = await (await d.client.get("/metrics", headers=bearer(key))).text()
    assert 'user="alice"' not in with_user_key  # a user's key is not a metrics key


@pytest.mark.parametrize("url", ["file:///etc/passwd", "unix:///run/ollama.sock", "ftp://ws3:21", "http://"])
async def test_backend_urls_are_http_only(daemon, url):
    answer = await daemon.admin("POST", "/admin/backends", {"name": "b", "url": url, "engine": "ollama"}, status=400)
    assert "http(s) URL" in answer["error"]["message"]


@pytest.mark.parametrize(
    "again", ["http://localhost:{port}", "http://127.0.0.1:{port}/", "http://LOCALHOST:{port}//", "http://[::1]:{port}"]
)
async def test_one_server_is_one_backend(daemon, again):
    async with FakeOllama(models=["llama3"]) as fake:
        await daemon.backend("gpu1", fake.url, "ollama")
        answer = await daemon.admin(
            "POST",
            "/admin/backends",
            {"name": "gpu2", "url": again.format(port=fake.port), "engine": "ollama"},
            status=409,
        )
        assert "already in the pool as backend 'gpu1'" in answer["error"]["message"]
        assert [b["name"] for b in await daemon.admin("GET", "/admin/backends")] == ["gpu1"]


async def test_no_key_prompt_or_completion_in_logs_or_decision_records(daemon, caplog):
    caplog.set_level(logging.DEBUG)
    fake = InProcess(models=("llama3",), completion_tokens=8)
    await daemon.backend("b1", fake)
    key = await daemon.user("alice")
    secret = {"model": "llama3", "messages": [{"role": "user", "content": "my secret prompt"}], "max_tokens": 3}
    for path, stream in (("/v1/chat/completions", False), ("/v1/chat/completions", True), ("/api/chat", True)):
        resp = await daemon.client.post(path, json={**secret, "stream": stream}, headers=bearer(key))
        assert resp.status == 200 and "tok2" in await resp.text()
    await daemon.client.post("/v1/chat/completions", json=secret, headers=bearer(key + "x"))  # a wrong key
    records = await daemon.admin("GET", "/admin/decisions?limit=50")
    assert len(records) == 3
    for text in (caplog.text, json.dumps(records)):
        assert key not in text and key[3:] not in text and "secret prompt" not in text and "tok1" not in text


async def test_a_client_chosen_name_cannot_forge_a_log_line(daemon):
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(OneLineFormatter("%(levelname)s %(name)s: %(message)s"))  # as `mr serve` logs
    logger = logging.getLogger("mindrouter")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)  # not `logger.level = ...`: that keeps the loggers' cached "INFO is off"
    try:
        key = await daemon.user("alice")
        for path in ("/v1/chat/completions", "/api/chat"):
            messages = [{"role": "user", "content": "x"}]
            body = {"model": "nosuch\nCRITICAL mindrouter: forged\r\x1b[2K", "messages": messages}
            resp = await daemon.client.post(path, json=body, headers=bearer(key))
            assert resp.status == 404
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    lines = out.getvalue().splitlines()
    assert lines and all(not line.startswith("CRITICAL") for line in lines), lines
    assert any("nosuch\\nCRITICAL" in line for line in lines), lines  # logged, escaped


async def test_discovery_never_adds_a_server_already_configured(tmp_path):
    """The first start adds what answers on this machine, each server once, and nothing already there."""
    from mindrouter.daemon.pollers.discover import discover_local_backends
    from mindrouter.store import Store

    async with FakeOllama(models=["llama3"]) as fake, aiohttp.ClientSession() as session:
        candidates = (
            ("local-ollama", f"http://127.0.0.1:{fake.port}", "ollama", "/api/tags"),
            ("local-again", f"http://localhost:{fake.port}/", "ollama", "/api/tags"),
        )
        with Store(tmp_path / "s.db") as store:
            assert [r.name for r in await discover_local_backends(session, store, candidates)] == ["local-ollama"]
            store.remove_backend("local-ollama")
            store.add_backend("gpu1", f"http://localhost:{fake.port}", "ollama")
            assert await discover_local_backends(session, store, candidates) == []
            assert [b.name for b in store.list_backends()] == ["gpu1"]


async def test_an_unreachable_gpu_agent_is_reported_in_the_answer_the_list_the_status_and_the_log(daemon, caplog):
    caplog.set_level(logging.INFO, logger="mindrouter")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        node = f"http://127.0.0.1:{s.getsockname()[1]}"
    fake = InProcess(models=("llama3",), completion_tokens=8)
    added = await daemon.backend("ws3", fake, node=node)
    assert added["status"] == "healthy" and "cannot reach GPU agent" in added["node_error"]
    assert added["error"] == added["node_error"]  # no longer null
    (listed,) = await daemon.admin("GET", "/admin/backends")
    assert listed["node_error"] == added["node_error"]
    assert (await daemon.admin("GET", "/admin/status"))["nodes_unreachable"] == [node]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "GPU agent does not answer" in r.msg]
    assert len(warnings) == 1  # once when it stops answering, not every poll


async def test_mr_agent_beyond_loopback_needs_a_key():
    run = CliRunner().invoke(mr_app, ["agent", "--host", "0.0.0.0"], env={"MR_AGENT_KEY": None})
    assert isinstance(run.exception, UsageError) and run.exception.exit_code == 2
    assert "needs a key" in str(run.exception)


async def test_every_admin_route_on_tcp_needs_the_admin_key(daemon):
    routes = {(r.method, r.resource.canonical) for r in daemon.app.router.routes() if r.resource is not None}
    admin = sorted((m, p) for m, p in routes if p.startswith("/admin/") and m != "HEAD")
    assert len(admin) > 20
    for method, path in admin:
        path = path.replace("{name}", "alice").replace("{request_id}", "x").replace("{key_id}", "1")
        resp = await daemon.client.request(method, path, json={}, headers=bearer("not-the-admin-key"))
        assert resp.status in (401, 429), (method, path, resp.status)  # after 11 wrong keys the address waits
