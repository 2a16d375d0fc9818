"""benchmarks/bench_prefill_stall.py's arithmetic: what a writer lost while another's prompt was read."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from bench_prefill_stall import pace


def test_a_writer_stalled_for_the_whole_reading_lost_all_of_it():
    stamps = [i * 0.01 for i in range(51)]  # a token each 10 ms up to 0.5 s, when the prompt is sent
    stamps += [1.5 + i * 0.01 for i in range(50)]  # nothing until the prompt is read at 1.5 s
    gap, lost, longest = pace(stamps, 0.5, 1.505)
    assert gap == pytest.approx(0.01)
    assert lost == pytest.approx(1.005 - 0.01)  # one token in the window, at its usual pace
    assert longest == pytest.approx(1.0)


def test_a_writer_at_its_pace_lost_nothing():
    stamps = [i * 0.01 for i in range(200)]
    gap, lost, longest = pace(stamps, 0.5, 1.505)
    assert gap == pytest.approx(0.01)
    assert lost == pytest.approx(0.0, abs=0.011)
    assert longest == pytest.approx(0.01, abs=1e-9)
