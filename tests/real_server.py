"""Real llama.cpp servers for the `real` tests, started and stopped with scripts/llama-server.sh.

The script does the work (model file, flags, /health wait, pid file); this
module picks free loopback ports, bounds every wait, and knows where the
script keeps its pid files so a test can SIGKILL one server and a teardown
can always stop them, even after a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "llama-server.sh"

GRAMMAR = "root ::= [a-z ]+"
"""With ``ignore_eos`` the tiny random model then writes lowercase text of exactly ``max_tokens`` tokens."""
EXACT = {"grammar": GRAMMAR, "ignore_eos": True}

# Two servers share this machine's cores with the daemon and the clients: one
# thread each. The tiny model's own context is 2048 tokens, so 4096 in all gives
# each of the 2 slots the whole 2048.
SERVER_ENV = {"MR_LLAMA_THREADS": "1", "MR_LLAMA_CTX": "4096", "MR_LLAMA_WAIT": "20"}


def binary() -> tuple[Path | None, str]:
    """The built llama-server, or None and why not."""
    try:
        out = subprocess.run([str(SCRIPT), "path"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"scripts/llama-server.sh path failed: {exc}"
    if out.returncode != 0:
        return (
            None,
            "llama-server is not built (`scripts/llama-server.sh path` failed); "
            "run `scripts/llama-server.sh build` and `scripts/llama-server.sh model tiny`",
        )
    return Path(out.stdout.strip()), ""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def get_text(url: str, timeout: float = 10.0) -> str:
    """GET without blocking the loop the in-process daemon runs on.

    llama-server answers /slots through its task queue, which can take seconds on a loaded 2-core machine.
    """
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
        session.get(url) as resp,
    ):
        resp.raise_for_status()
        return await resp.text()


class LlamaServer:
    """One llama-server on 127.0.0.1:``port`` serving the tiny model as ``tiny``."""

    def __init__(self, bin_path: Path, port: int, parallel: int = 2) -> None:
        self.port = port
        self.parallel = parallel
        self.url = f"http://127.0.0.1:{port}"
        # The script keeps everything under <cache>/llama-server/, the binary in build/bin/.
        self.pidfile = bin_path.parents[2] / "run" / f"{port}.pid"
        self.log = bin_path.parents[2] / "logs" / f"llama-server-{port}.log"
        self.pid: int | None = None

    def start(self) -> None:
        env = {**os.environ, **SERVER_ENV}
        out = subprocess.run(
            [str(SCRIPT), "start", str(self.port), "--model", "tiny", "--parallel", str(self.parallel)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=REPO,
        )
        if out.returncode != 0 or out.stdout.strip() != self.url:
            raise RuntimeError(
                f"llama-server.sh start {self.port} failed (rc {out.returncode}): {out.stdout}{out.stderr}"
            )
        self.pid = int(self.pidfile.read_text().strip())

    def kill(self) -> None:
        """SIGKILL, as a crash would: no goodbye to open connections."""
        assert self.pid is not None
        os.kill(self.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.02)

    def alive(self) -> bool:
        if self.pid is None:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        # A zombie still answers kill(0); /proc tells.
        with contextlib.suppress(OSError):
            if "State:\tZ" in Path(f"/proc/{self.pid}/status").read_text():
                return False
        return True

    def stop(self) -> None:
        """Stop it whatever state it is in; never raises."""
        with contextlib.suppress(Exception):
            subprocess.run([str(SCRIPT), "stop", str(self.port)], capture_output=True, timeout=20, cwd=REPO)
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)  # type: ignore[arg-type]
        with contextlib.suppress(FileNotFoundError):
            self.pidfile.unlink()

    async def slots(self) -> list[dict[str, Any]]:
        return json.loads(await get_text(self.url + "/slots"))

    async def busy_slots(self) -> int:
        return sum(bool(s.get("is_processing")) for s in await self.slots())

    async def metric(self, name: str) -> float:
        for line in (await get_text(self.url + "/metrics")).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)
