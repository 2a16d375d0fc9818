"""Issue 32's smaller defects at the edges: settings files, `mr serve`'s port, the key header, the root page."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from mindrouter.config import load_config
from mindrouter.errors import ConfigError

from . import test_cli_fake
from .conftest import Daemon
from .test_cli_fake import FakeDaemon, decision, mr
from .test_serve import MR, free_port

fake = test_cli_fake.fake
fake_server = test_cli_fake.fake_server


def test_mr_config_naming_a_missing_file_is_refused_as_config_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A typo in MR_CONFIG used to give the defaults: a second, empty router, or commands aimed at another daemon."""
    missing = tmp_path / "lab.tmol"
    monkeypatch.setenv("MR_CONFIG", str(missing))
    for args in (["status"], ["config", "show"], ["group", "list", "--json"]):
        run = mr(*args)
        assert (run.exit_code, run.stdout) == (1, ""), (args, run)
        assert run.stderr == (
            f"mr: MR_CONFIG names {missing}, which does not exist; correct MR_CONFIG, "
            "or create the file with `mr config init`\n"
        ), run
    with pytest.raises(ConfigError, match="MR_CONFIG names"):
        load_config()
    # `mr config path` says where it would be, and `mr config init` creates it there.
    assert mr("config", "path").stdout.strip() == str(missing)
    assert mr("config", "init").exit_code == 0 and missing.exists()
    assert load_config().path == missing


def test_mr_serve_refuses_a_missing_mr_config_before_it_starts(tmp_path: Path) -> None:
    env = {**os.environ, "MR_CONFIG": str(tmp_path / "missing.toml")}
    here = ["--state-dir", str(tmp_path / "state"), "--socket", str(tmp_path / "mr.sock"), "--port", str(free_port())]
    r = subprocess.run([*MR, "serve", "--no-discover", *here], capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 1 and r.stderr.startswith(f"mr: MR_CONFIG names {tmp_path / 'missing.toml'}"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "state").exists()


def test_a_bad_toml_file_says_what_to_fix_not_to_overwrite_every_setting(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[server]\nport = 8484\nhost = 0.0.0.0\n")
    with pytest.raises(ConfigError) as info:
        load_config(config)
    message = str(info.value)
    assert "--force" not in message and "init" not in message, message
    assert message.startswith(f"config file {config} is not valid TOML at line 3, column 11 (expected newline"), message
    assert message.endswith("; fix that line (the other settings stay as they are)"), message


async def test_a_key_without_bearer_is_told_to_add_bearer(daemon: Daemon) -> None:
    """``Authorization: <key>`` was answered "missing API key", though the key was there."""
    key = await daemon.user("kim")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for path, header in (("/v1/chat/completions", key), ("/api/chat", key), ("/v1/chat/completions", f"Token {key}")):
        resp = await daemon.client.post(path, json=body, headers={"Authorization": header})
        text = await resp.text()
        assert resp.status == 401 and key not in text, text
        assert "put `Bearer ` before the key: `Authorization: Bearer <key>`" in text, text
        assert "missing API key" not in text
    resp = await daemon.client.post("/v1/chat/completions", json=body)
    assert "missing API key" in await resp.text()


async def test_the_root_page_points_a_browser_to_the_web_ui(daemon: Daemon) -> None:
    """Ollama clients still read "Ollama is running"; a person at the endpoint in a browser learns of /ui/."""
    plain = await daemon.client.get("/")
    assert (plain.status, await plain.text()) == (200, "Ollama is running")
    assert (await daemon.client.get("/", headers={"Accept": "*/*"})).content_type == "text/plain"
    browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    page = await daemon.client.get("/", headers={"Accept": browser})
    html = await page.text()
    assert page.status == 200 and page.content_type == "text/html", html
    assert "Ollama is running" in html and 'href="/ui/"' in html, html
    assert (await daemon.client.head("/", headers={"Accept": browser})).status == 200


def test_mr_serve_on_a_busy_port_says_so_before_it_creates_anything(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        state, sock = tmp_path / "state", tmp_path / "mr.sock"
        args = ["--port", str(port), "--state-dir", str(state), "--socket", str(sock), "--no-discover"]
        env = {**os.environ, "MR_CONFIG": ""}
        r = subprocess.run([*MR, "serve", *args], capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 1 and r.stderr == (
        f"mr: port {port} on 127.0.0.1 is already in use; stop the other server or pass --port\n"
    ), r.stderr
    assert not state.exists() and not sock.exists()


def test_mr_top_and_mr_decisions_say_why_a_request_reached_no_backend(fake: FakeDaemon) -> None:
    refused = decision("mr-0refused", selected_backend=None, backend=None, outcome="rejected", status=503)  # type: ignore[arg-type]
    timed_out = decision("mr-0waited", selected_backend=None, backend=None, outcome="timeout", status=504)  # type: ignore[arg-type]
    fake.decisions = [refused, timed_out]
    for args in (("top", "--once"), ("decisions",)):
        out = mr(*args, env={"COLUMNS": "120", "LINES": "60"}).stdout
        assert "None" not in out, (args, out)
        rows = {rid: next(line for line in out.splitlines() if rid in line) for rid in ("mr-0refused", "mr-0waited")}
        assert "refused" in rows["mr-0refused"] and "timed out" in rows["mr-0waited"], (args, out)
