"""bench_pool runs the lab time-compressed: every daemon setting in seconds is divided alike.

A setting left at its wall-clock value is ``compression`` times longer in lab
time: at 10x a one-second ``wait_margin`` is ten lab seconds, and the daemon
then keeps jobs waiting for a busy backend the lab's own router would not.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from bench_pool import scaled_settings

from mindrouter.config import BackendSettings, ServerSettings
from mindrouter.scheduler import SchedulerSettings

SECONDS = {
    "server": (ServerSettings, ("gpu_poll_interval",)),
    "scheduler": (
        SchedulerSettings,
        (
            "fairness_window",
            "queue_timeout",
            "heavy_refresh_interval",
            "default_load_seconds",
            "wait_margin",
            "max_think_time",
            "placement_interval",
            "load_confirm_seconds",
            "min_load_sample_seconds",
        ),
    ),
    "backends": (BackendSettings, ("poll_interval", "first_byte_timeout", "load_timeout", "request_timeout")),
}
"""Settings whose unit is seconds of the lab (written here apart from bench_pool's own list)."""


@pytest.mark.parametrize(
    ("section", "name"), [(section, name) for section, (_, names) in SECONDS.items() for name in names]
)
def test_settings_in_seconds_are_divided_by_the_compression(section: str, name: str) -> None:
    default = getattr(SECONDS[section][0](), name)
    assert scaled_settings(10.0)[section][name] == pytest.approx(default / 10.0)


def test_rates_are_multiplied_and_counts_left_alone() -> None:
    scheduler = scaled_settings(10.0)["scheduler"]
    defaults = SchedulerSettings()
    assert scheduler["default_decode_rate"] == pytest.approx(defaults.default_decode_rate * 10.0)
    assert scheduler["credit_rate"] == pytest.approx(defaults.credit_rate * 10.0)
    for count in ("max_queued", "default_completion_tokens", "answers_ahead", "prefix_cache_tokens"):
        assert count not in scheduler
