"""The daemon's process holds only what it serves with: no terminal stack, and Jinja2 only once ``/ui/`` is opened.

``mr serve`` execs into ``python -m mindrouter.daemon`` so that rich, typer and
click (about 6 MB) stay in the command line; a daemon module importing a CLI
helper brought them back once (the web UI's decision page used ``cli/why``), and
fixed memory counts in issue 20's target of 1.5x a plain aiohttp app. A fresh
interpreter is the only place ``sys.modules`` says what the daemon imports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import asyncio, json, sys

from aiohttp.test_utils import TestClient, TestServer

import mindrouter.daemon.__main__  # what `mr serve` execs into
from mindrouter.config import load_config
from mindrouter.daemon.process.app import create_app

WATCHED = ("rich", "typer", "click", "jinja2", "mindrouter.cli")


def loaded():
    return sorted(w for w in WATCHED if any(m == w or m.startswith(w + ".") for m in sys.modules))


async def main():
    app = await create_app(load_config(sys.argv[1], must_exist=True), discover=False)
    seen = {"created": loaded()}
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/health")).status == 200
        seen["serving"] = loaded()
        page = await client.get("/ui/login")
        assert page.status == 200 and "<form" in await page.text()
        seen["ui"] = loaded()
    print(json.dumps(seen))


asyncio.run(main())
"""


def test_the_daemon_imports_no_terminal_modules_and_jinja2_only_for_the_web_ui(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        f'[server]\nsocket = "{tmp_path / "mr.sock"}"\nstate_dir = "{tmp_path / "state"}"\ndiscover = false\n'
    )
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(config)], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen == {"created": [], "serving": [], "ui": ["jinja2"]}
