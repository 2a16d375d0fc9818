"""``mr top``: the pure frame at fixed sizes, ``--once``, and the live view under tmux."""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from mindrouter.cli._top_view import allocate, render_top

from . import test_cli_fake
from .test_cli_fake import FakeDaemon, mr

fake = test_cli_fake.fake
fake_server = test_cli_fake.fake_server  # the fixtures, shared with test_cli_fake

SECTIONS = ("Backends", "GPUs", "Queue", "Fair share", "Last decisions")


def frame(data: Any, width: int, height: int, **kw: Any) -> list[str]:
    """Render one frame on a recorded console of exactly ``width`` x ``height`` and return its lines."""
    console = Console(
        width=width, height=height, file=io.StringIO(), record=True, color_system=None, legacy_windows=False
    )
    console.print(render_top(data, width, height, **kw))
    return console.export_text().splitlines()


@pytest.fixture
def top_data(fake_server: FakeDaemon) -> dict[str, Any]:
    fake_server.reset()
    return fake_server.top()


def test_frame_has_every_section_at_120x40(top_data: dict[str, Any]) -> None:
    lines = frame(top_data, 120, 40, socket="/run/mr.sock", now=1_767_000_000.0)
    text = "\n".join(lines)
    assert len(lines) <= 40 and all(len(line) <= 120 for line in lines)
    assert lines[0].startswith("mindrouter 0.1.0  up 1h 02m · 2.5 req/s · 310 tok/s · queue 3 · running 2")
    assert lines[0].rstrip().endswith("q quits")
    for title in SECTIONS:
        assert any(line.startswith(title) for line in lines), title
    # backends: status, in-flight/max, GPU and VRAM bars, latency EMA, loaded models
    ws1 = next(line for line in lines if line.startswith("ws1"))
    assert "healthy" in ws1 and "2/4" in ws1 and "35%" in ws1 and "67%" in ws1 and "420ms" in ws1 and "llama3.2" in ws1
    assert "█" in ws1
    ws2 = next(line for line in lines if line.startswith("ws2"))
    assert "draining" in ws2 and "n/a" in ws2
    # the queue by user and model with the oldest wait, fair share, decisions newest first
    assert any(line.startswith("alice") and "llama3.2" in line and "4.8s" in line for line in lines)
    share = next(line for line in lines if line.startswith("alice") and "faculty" in line)
    assert all(v in share for v in ("3", "60.0%", "71.4%", "0.57", "-1,000"))
    for header in ("target", "actual", "deficit", "factor"):
        assert header in text
    assert text.index("req-2") < text.index("req-1")
    assert "61°C" in text and "NVIDIA RTX 4090" in text
    # the backend's throughput over time and one stream's rate are told apart (both read "tok/s" before)
    header = next(line for line in lines if line.startswith("backend"))
    assert "tok/s, last" in header and "stream tok/s" in header and header.count("tok/s") == 2 + ("by model" in header)


@pytest.mark.parametrize(("width", "height"), [(200, 60), (100, 30), (80, 24), (60, 16), (40, 10), (30, 6)])
def test_frame_fits_the_terminal(top_data: dict[str, Any], width: int, height: int) -> None:
    lines = frame(top_data, width, height, socket="/run/mr.sock", now=0.0)
    assert len(lines) <= height, "\n".join(lines)
    assert all(len(line) <= width for line in lines)
    assert lines[0].startswith("mindrouter" if width >= 80 else "mr")
    assert any(line.startswith("Backends") for line in lines)  # the most important section always stays


def test_short_terminal_drops_least_important_sections_first(top_data: dict[str, Any]) -> None:
    text = "\n".join(frame(top_data, 80, 12))
    assert "Backends" in text and "Fair share" in text
    assert "Last decisions" not in text and "GPUs" not in text


def test_narrow_terminal_drops_columns_not_rows(top_data: dict[str, Any]) -> None:
    lines = frame(top_data, 50, 40)
    header = next(line for line in lines if line.startswith("backend"))
    assert "status" in header and "load" in header
    assert "latency" not in header and "last" not in header and "loaded" not in header
    assert "stream tok/s" in header  # a number: it stays
    assert sum(line.startswith(("ws1", "ws2", "old")) for line in lines) == 3


def test_cut_sections_say_how_many_more(top_data: dict[str, Any]) -> None:
    top_data["backends"] = [dict(top_data["backends"][0], name=f"b{i:02d}") for i in range(30)]
    lines = frame(top_data, 100, 30)
    assert len(lines) <= 30
    more = [line for line in lines if line.startswith("… ")]
    assert more and more[0].split()[1].isdigit()


def test_daemon_away_banner_over_the_last_data(top_data: dict[str, Any]) -> None:
    lines = frame(top_data, 100, 30, socket="/run/mr.sock", error="daemon not reachable at /run/mr.sock — retrying")
    assert lines[1].strip() == "daemon not reachable at /run/mr.sock — retrying"
    assert any(line.startswith("Backends") for line in lines)
    lines = frame(None, 100, 30, error="daemon not reachable at /run/mr.sock — retrying")
    assert "daemon not reachable at /run/mr.sock — retrying" in lines[1] and "waiting for the daemon" in lines[2]


def test_empty_pool(fake_server: FakeDaemon) -> None:
    data = {"status": {}, "backends": [], "gpus": [], "queue": {"queue": {}}, "share": {}, "decisions": []}
    text = "\n".join(frame(data, 100, 30))
    assert "no backends; add one with `mr backend add NAME URL --engine ollama`" in text
    assert "nothing queued" in text and "no decisions yet" in text and "GPUs" not in text


def test_allocate_gives_one_each_then_fills_by_importance() -> None:
    assert allocate([5, 5, 5], 6, [2, 0, 1]) == [1, 1, 4]
    assert allocate([1, 2, 3], 100) == [1, 2, 3]
    assert allocate([3, 3], 1) == [1, 0]
    assert sum(allocate([9, 9, 9], 7)) == 7


def test_top_once_and_json(fake: FakeDaemon) -> None:
    run = mr("top", "--once", env={"COLUMNS": "120", "LINES": "40"})
    assert run.exit_code == 0, run
    for title in SECTIONS:
        assert title in run.stdout
    assert mr("top", "--json").json()["status"]["version"] == "0.1.0"
    assert mr("top", "--interval", "0").exit_code == 2


# -- the live view under tmux -------------------------------------------------------------------------


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-S", sock, *args], check=True, capture_output=True, text=True, timeout=10).stdout


def _wait_for(sock: str, predicate: Any, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = _tmux(sock, "capture-pane", "-p", "-t", "t")
        if predicate(screen):
            return screen
        time.sleep(0.1)
    raise AssertionError(f"the pane never matched; it shows:\n{screen}")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_live_top_under_tmux_quits_on_q_and_restores_the_terminal(tmp_path: Path) -> None:
    folder = tempfile.mkdtemp(prefix="mr-tmux-")
    server = FakeDaemon(os.path.join(folder, "mr.sock"))
    server.start()
    tmux_sock = os.path.join(folder, "tmux")
    config = tmp_path / "config.toml"
    config.write_text(f'[server]\nsocket = "{server.socket_path}"\n')
    mr_cmd = f"{shlex.quote(sys.executable)} -c 'from mindrouter.cli import main; main()' top --interval 0.3"
    try:
        _tmux(
            tmux_sock,
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            "120",
            "-y",
            "40",
            f"env -i PATH={shlex.quote(os.environ.get('PATH', ''))} HOME={shlex.quote(str(tmp_path))} "
            f"TERM=xterm-256color MR_CONFIG={shlex.quote(str(config))} PS1='$ ' bash --norc --noprofile",
        )
        _tmux(
            tmux_sock,
            "send-keys",
            "-t",
            "t",
            f"cd {shlex.quote(str(tmp_path))}; stty -g > before.txt; {mr_cmd}; echo EXIT=$?",
            "Enter",
        )
        screen = _wait_for(tmux_sock, lambda s: "Last decisions" in s and "Fair share" in s)
        for title in SECTIONS:
            assert title in screen
        assert "ws1" in screen and "alice" in screen and "q quits" in screen

        # the daemon goes away: the view says so, then reconnects when it is back
        server.stop()
        _wait_for(tmux_sock, lambda s: f"daemon not reachable at {server.socket_path} — retrying" in s)
        server.reset()
        server.start()
        _wait_for(tmux_sock, lambda s: "retrying" not in s and "Backends" in s)

        _tmux(tmux_sock, "resize-window", "-t", "t", "-x", "70", "-y", "20")
        _wait_for(tmux_sock, lambda s: "Backends" in s and max(len(line) for line in s.splitlines()) <= 70)

        _tmux(tmux_sock, "send-keys", "-t", "t", "q")
        screen = _wait_for(tmux_sock, lambda s: "EXIT=0" in s)
        assert "Backends" not in screen  # the alternate screen is gone
        _tmux(tmux_sock, "send-keys", "-t", "t", 'stty -g > after.txt; echo SAV""ED', "Enter")
        _wait_for(tmux_sock, lambda s: "SAVED" in s.split("EXIT=0")[-1])
        assert (tmp_path / "before.txt").read_text() == (tmp_path / "after.txt").read_text()  # cbreak undone
    finally:
        subprocess.run(["tmux", "-S", tmux_sock, "kill-server"], capture_output=True, timeout=10)
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


# -- accounting panels and pictures ---------------------------------------------------------------


def test_pictures_quota_warnings_and_todays_usage(top_data: dict[str, Any]) -> None:
    lines = frame(top_data, 160, 45, now=1_767_000_000.0)
    text = "\n".join(lines)
    assert len(lines) <= 45 and all(len(line) <= 160 for line in lines)
    # a tokens/s sparkline per backend: ws1 rises and falls, ws2 is flat
    ws1 = next(line for line in lines if line.startswith("ws1"))
    assert "▁▁▁▃▆███▄▂" in ws1
    assert "▁" * 30 in next(line for line in lines if line.startswith("ws2"))
    # quota warnings: who, which quota, how full, when it resets
    warning = next(line for line in lines if line.startswith("alice tokens/day"))
    assert "1.7M of 2.0M" in warning and "87%" in warning and "2026-12-30 00:00" in warning
    # actual against target share: alice above her target (bar past the marker), bob below (marker after the bar)
    share_alice = next(line for line in lines if line.startswith("alice") and "faculty" in line)
    share_bob = next(line for line in lines if line.startswith("bob") and "student" in line)
    assert "┃" in share_alice and share_alice.index("┃") < share_alice.rindex("█")
    assert "│" in share_bob and share_bob.rindex("█") < share_bob.index("│")
    # today's top users and models; llama3.2 and llama3.2:latest are one model
    assert "Today  1.8M tokens" in text and "llama3.2:latest" not in text
    today = next(line for line in lines if line.startswith("alice") and "1.7M" in line and "llama3.2" in line)
    assert today.split()[-2:] == ["1.7M", "120"]


def test_columns_are_as_wide_as_their_content(top_data: dict[str, Any]) -> None:
    next(b for b in top_data["backends"] if b["name"] == "ws1")["loaded_models"] = [
        "llama3.2",
        "llama3.2:latest",
        "qwen",
    ]
    lines = frame(top_data, 200, 60)
    share = next(line for line in lines if line.startswith("alice") and "faculty" in line)
    assert share.index("faculty") < 10  # four- and five-letter names take a few cells, not fifty
    queue = next(line for line in lines if line.startswith("alice") and "4.8s" in line)
    assert len(queue.rstrip()) < 40
    ws1 = next(line for line in lines if line.startswith("ws1"))
    assert ws1.rstrip().endswith("llama3.2, qwen")
    assert "llama3.2:latest" not in ws1


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
@pytest.mark.parametrize(("width", "height"), [(80, 24), (160, 45)])
def test_top_as_a_person_sees_it_under_tmux(tmp_path: Path, width: int, height: int) -> None:
    folder = tempfile.mkdtemp(prefix="mr-tmux-")
    server = FakeDaemon(os.path.join(folder, "mr.sock"))
    server.start()
    tmux_sock = os.path.join(folder, "tmux")
    config = tmp_path / "config.toml"
    config.write_text(f'[server]\nsocket = "{server.socket_path}"\n')
    mr_cmd = f"{shlex.quote(sys.executable)} -c 'from mindrouter.cli import main; main()' top --interval 0.5"
    env = (
        f"env -i PATH={shlex.quote(os.environ.get('PATH', ''))} HOME={shlex.quote(str(tmp_path))} "
        f"TERM=xterm-256color MR_CONFIG={shlex.quote(str(config))} LANG=C.UTF-8 {mr_cmd}"
    )
    try:
        _tmux(tmux_sock, "-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height), env)
        screen = _wait_for(tmux_sock, lambda s: "Fair share" in s and "alice" in s)
        lines = screen.splitlines()
        assert len(lines) <= height and max(len(line) for line in lines) <= width, screen
        assert lines[0].startswith("mindrouter") and "Backends" in screen and "Quotas" in screen
        assert "█" in screen and ("┃" in screen or "│" in screen)  # GPU bars and share bars
        assert any(c in screen for c in "▃▆")  # the tokens/s sparkline
        if height >= 45:
            assert "Today" in screen and "Last decisions" in screen and "GPUs" in screen
        (Path(os.environ.get("MR_TOP_SCREENS", folder)) / f"top-{width}x{height}.txt").write_text(screen)
    finally:
        subprocess.run(["tmux", "-S", tmux_sock, "kill-server"], capture_output=True, timeout=10)
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_kv_cache_fill_is_labelled_so_where_no_gpu_is_named(top_data: dict[str, Any]) -> None:
    """A vLLM or llama-server backend without --gpus reports its KV cache's fill; it was shown as a bare gpu bar."""
    rows = {r["name"]: r for r in top_data["backends"]}
    assert any(r["engine"] in ("vllm", "llamacpp") for r in rows.values())
    text = "\n".join(frame(top_data, 160, 40))
    for name, row in rows.items():
        line = next(line for line in text.splitlines() if line.startswith(name + " "))
        cache = row["engine"] in ("vllm", "llamacpp") and not row["gpus"] and not row["node"]
        assert (" kv " in line) == cache, (name, line)


def test_fair_share_names_each_persons_pool_where_pools_differ(top_data: dict[str, Any]) -> None:
    users = top_data["share"]["users"]
    assert "pool" not in "\n".join(frame(top_data, 160, 40)).split("Fair share")[1].splitlines()[1]
    users[0]["pools"] = [{"backends": ["1"], "names": ["ws1"], "target_share": 1.0}]
    users[1]["pools"] = [{"backends": ["2", "3"], "names": ["ws2", "old"], "target_share": 0.4}]
    share = "\n".join(frame(top_data, 160, 40)).split("Fair share")[1].splitlines()
    assert " pool " in share[1]
    assert re.search(rf"^{users[0]['name']} .* ws1 ", share[2]) and "ws2, old" in share[3], share
