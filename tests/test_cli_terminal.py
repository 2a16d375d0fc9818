"""Issue 21's terminal defects, against the fake daemon: exit codes, TOML, drained backends."""

from __future__ import annotations

import pytest

from . import test_cli_fake
from .test_cli_fake import FakeDaemon, mr

fake = test_cli_fake.fake
fake_server = test_cli_fake.fake_server


@pytest.mark.parametrize("args", [("--since", "yesterday"), ("--until", "next week"), ("--since", "")])
def test_a_bad_since_or_until_is_exit_2_with_one_sentence_and_sends_nothing(
    fake: FakeDaemon, args: tuple[str, str]
) -> None:
    run = mr("usage", *args)
    assert run.exit_code == 2, run
    assert run.stderr.count("\n") == 1 and run.stderr.startswith(f"mr: {args[0]} "), run
    assert "such as 7d" in run.stderr
    assert not [r for r in fake.requests if r[1].startswith("/admin/usage")]


def test_good_since_and_until_reach_the_daemon_as_typed(fake: FakeDaemon) -> None:
    mr("usage", "--since", "2026-11-01", "--until", "12h")  # the fake has no usage route: only what was sent counts
    assert fake.requests[-1][1] == "/admin/usage?by=user&since=2026-11-01&until=12h"
