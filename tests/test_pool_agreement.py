"""Simulator against live (issue 17): bench_pool's lab through `mr serve` and through `mr simulate` agree.

The same requests (the simulator's own, ``--workload scenario``) go to the benchmark's fake
Ollama workstations behind a real `mr serve` and through the simulator; the figures come out of
one function (``benchmarks/_pool_report.compute``). Scaled down and time-compressed
(``--quick``: 120 + 90 lab s at 30x, about 15 s of `mr serve`), but it starts real servers and
reads their timing, so it runs with the soak tests (``-m soak``, in .ci/run).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.soak

REPO = Path(__file__).resolve().parent.parent


def test_the_simulator_and_the_live_pool_agree_on_tokens_per_second_and_tails(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_pool.py"), "--quick", "--workload", "scenario"]
    cmd += ["--only", "mr serve", "mr simulate", "--json", str(out)]
    subprocess.run(cmd, check=True, timeout=300, cwd=REPO, capture_output=True)
    figures = json.loads(out.read_text())
    live, sim = figures["mr serve"], figures["mr simulate"]
    assert live["requests"] == sim["requests"] > 300
    assert live["lost"] == sim["lost"] == 0
    rate = "tokens/s at saturation (burst)"
    assert sim[rate] == pytest.approx(live[rate], rel=0.10), (sim[rate], live[rate])
    assert sim["E2E p95"] == pytest.approx(live["E2E p95"], rel=0.30), (sim["E2E p95"], live["E2E p95"])
