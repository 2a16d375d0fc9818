"""docs/systemd/mindrouter.service and its install steps, checked without a container (issue 10 item 5).

The steps in the unit's header are read as written, in order, and checked for
what made them fail before: a config folder the service user cannot read, a
config written by a user who cannot write there, paths that do not match the
unit's directories. The step that writes the config runs for real, into a
temporary folder, and the result is loaded as `mr serve` would.
"""

from __future__ import annotations

import configparser
import re
import shlex
import subprocess
from pathlib import Path

from mindrouter.config import load_config

UNIT = Path(__file__).parent.parent / "docs" / "systemd" / "mindrouter.service"


def steps() -> list[str]:
    """The install commands in the unit's header, continuation lines joined."""
    header = UNIT.read_text().split("[Unit]")[0].splitlines()
    start = next(i for i, line in enumerate(header) if line.startswith("# Install"))
    commands: list[str] = []
    pending = ""
    for line in header[start + 1 :]:
        if not line.startswith("#   ") or line.startswith("#   #"):
            if commands or pending:
                break
            continue
        text = pending + line[4:].split("   #")[0].strip()
        if text.endswith("\\"):
            pending = text[:-1] + " "
            continue
        pending = ""
        commands.append(text)
    return commands


def service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser["Service"]


def index(commands: list[str], pattern: str) -> int:
    found = [i for i, c in enumerate(commands) if re.search(pattern, c)]
    assert found, f"no install step matches {pattern!r}: {commands}"
    return found[0]


def test_every_step_runs_as_root_in_an_order_that_works():
    commands = steps()
    unit = service()
    user, group = unit["User"], unit["Group"]
    config_dir = "/etc/" + unit["ConfigurationDirectory"]
    assert not any(c.startswith("sudo -u") for c in commands), "a step as the service user cannot write /etc"
    make_user = index(commands, rf"^useradd .*\b{user}$")
    make_dir = index(commands, rf"^install -d .*{re.escape(config_dir)}$")
    args = shlex.split(commands[make_dir])
    assert args[args.index("-g") + 1] == group and args[args.index("-m") + 1] in ("0750", "0770")
    make_file = index(commands, rf"^install -m 0640 .*-g {group} /dev/null {re.escape(config_dir)}/config.toml$")
    write = index(commands, rf"> {re.escape(config_dir)}/config.toml$")
    copy = index(commands, r"^cp mindrouter.service /etc/systemd/system/")
    start = index(commands, r"^systemctl enable --now mindrouter$")
    assert make_user < make_dir < make_file < write < start and copy < start


def test_the_written_config_matches_the_units_directories(tmp_path):
    commands = steps()
    unit = service()
    config_dir = "/etc/" + unit["ConfigurationDirectory"]
    write = commands[index(commands, rf"> {re.escape(config_dir)}/config.toml$")]
    target = tmp_path / "config.toml"
    subprocess.run(["bash", "-c", write.replace(f"{config_dir}/config.toml", str(target))], check=True)
    config = load_config(target, environ={})
    assert config.server.socket_path.parent == Path("/run") / unit["RuntimeDirectory"]
    assert config.server.state_path == Path("/var/lib") / unit["StateDirectory"]
    assert config.server.socket_group == unit["Group"]
    assert unit["RuntimeDirectoryMode"] == "0750"  # the group may reach the 0660 socket
    assert unit["StateDirectoryMode"] == "0700"
    exec_start = shlex.split(unit["ExecStart"])
    assert exec_start[1:3] == ["serve", "--config"] and exec_start[3] == f"{config_dir}/config.toml"
    assert unit["Environment"] == f"MR_CONFIG={config_dir}/config.toml"
    assert float(unit["TimeoutStopSec"]) > config.server.shutdown_grace_seconds  # SIGTERM drains before SIGKILL
