"""Issue 32's smaller defects at the edges: settings files, `mr serve`'s port, the key header, the root page."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from mindrouter.config import load_config
from mindrouter.errors import ConfigError

from .test_cli_fake import mr
from .test_serve import MR, free_port


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
