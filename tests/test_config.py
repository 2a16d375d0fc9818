"""Settings: the example file is complete and correct, layers override in order."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mindrouter.cli.config_cmd import render_config
from mindrouter.config import BackendSettings, Config, ServerSettings, load_config
from mindrouter.errors import ConfigError
from mindrouter.scheduler.settings import SchedulerSettings, ScoreWeights

EXAMPLE = Path(__file__).parent.parent / "config.example.toml"


def test_example_is_written_from_the_settings_own_docs():
    assert EXAMPLE.read_text() == render_config(here=False), (
        "config.example.toml is out of date; run: python -m mindrouter.cli.config_cmd > config.example.toml"
    )


def test_example_names_every_setting_with_its_default():
    text = EXAMPLE.read_text()
    for cls in (ServerSettings, SchedulerSettings, ScoreWeights, BackendSettings):
        for f in dataclasses.fields(cls):
            if f.name in ("scores", "group_weights"):
                continue
            assert f"{f.name} =" in text, f"config.example.toml lacks {cls.__name__}.{f.name}"
    loaded = load_config(EXAMPLE, environ={})
    assert loaded.server == ServerSettings()
    assert loaded.scheduler == SchedulerSettings()
    assert loaded.backends == BackendSettings()


def test_layers_defaults_file_environment_flags(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        "[server]\nport = 9000\nhost = '0.0.0.0'\n[scheduler]\nfairness_window = 60\n[scheduler.scores]\nlatency = 7\n"
    )
    env = {"SCHEDULER_FAIRNESS_WINDOW": "120", "SCHEDULER_SCORE_MODEL_LOADED": "5", "SCHEDULER_WEIGHT_FACULTY": "4"}
    c = load_config(cfg, environ=env, overrides={"port": 9100, "host": None})
    assert c.server.port == 9100 and c.server.host == "0.0.0.0"
    assert c.scheduler.fairness_window == 120
    assert c.scheduler.scores.latency == 7 and c.scheduler.scores.model_loaded == 5
    assert c.scheduler.group_weights["faculty"] == 4 and c.scheduler.group_weights["student"] == 1


@pytest.mark.parametrize(
    "text, words",
    [
        ("[server]\nprot = 1\n", "unknown setting [server] prot"),
        ("[server]\nport = 'x'\n", "[server] port must be a whole number"),
        ("[scheduler]\nqueue_timeout = -1\n", "[scheduler] queue_timeout must be a finite number"),
        (
            "[scheduler]\nprompt_token_cost = 0\n",
            "[scheduler] prompt_token_cost must be a finite number greater than 0",
        ),
        (
            "[scheduler]\ncompletion_token_cost = 0\n",
            "[scheduler] completion_token_cost must be a finite number greater",
        ),
        ("[nope]\n", "unknown section [nope]"),
        ("[server\n", "not valid TOML"),
    ],
)
def test_bad_files_are_refused_with_the_key_named(tmp_path, text, words):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=None) as info:
        load_config(cfg, environ={})
    assert words in str(info.value)


def test_bad_environment_weight_is_refused():
    with pytest.raises(ConfigError, match="SCHEDULER_WEIGHT_STAFF"):
        load_config("/nonexistent/c.toml", environ={"SCHEDULER_WEIGHT_STAFF": "0"})


def test_missing_file_gives_defaults():
    assert load_config("/nonexistent/c.toml", environ={}).server == Config().server


@pytest.mark.parametrize(
    "text, words",
    [
        ("[scheduler]\nthink_ema_alpha = 0\n", "[scheduler] think_ema_alpha must be a number greater than 0 and at"),
        ("[scheduler]\ntypical_ema_alpha = 1.5\n", "[scheduler] typical_ema_alpha must be a number greater than 0"),
        ("[scheduler]\ntypical_clip = 0.5\n", "[scheduler] typical_clip must be a finite number of at least 1"),
        ("[scheduler]\nhold_price = -1\n", "[scheduler] hold_price must be a finite number of at least 0"),
    ],
)
def test_tuning_settings_out_of_range_are_refused(tmp_path, text, words):
    """Issue 29: the constants that became settings are checked like the others."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(cfg, environ={})
    assert words in str(info.value)
