"""Every admin table at 80 columns with the long names a real lab has: no value cut or split (issue 21).

A value is whole when it appears as one piece in the output; rich used to fold ``faculty`` into
``facul``/``ty``, a URL over five lines, and cut ``mr share``'s numbers to ``2…``.
"""

from __future__ import annotations

import re

import pytest

from . import test_cli_fake
from .test_cli_fake import NOW, FakeDaemon, _backend_row, decision, mr

fake = test_cli_fake.fake
fake_server = test_cli_fake.fake_server

PERSON = "alexandra.konstantinou"
GROUP = "computational-linguistics"
MODEL = "qwen2.5-coder:32b-instruct-q4_K_M"
URL = "http://gpu-node-17.cs.example.edu:11434"
ERROR = "Cannot connect to host gpu-node-18.cs.example.edu:8080 ssl:default [Connection refused]"


def lab(fake: FakeDaemon) -> None:
    """The fake daemon's state with long, real-looking names."""
    fake.groups = {GROUP: 3.0, "student": 1.0}
    fake.users = {
        PERSON: {"group": GROUP, "weight_override": 2.5, "keys": 2},
        "bob": {"group": "student", "weight_override": None, "keys": 1},
    }
    fake.backends = {
        "local-ollama": _backend_row(
            1, "local-ollama", URL, "ollama", models=[MODEL, "llama3.2:latest"], loaded_models=[MODEL], in_flight=3
        ),
        "gpu-node-18-llamacpp": _backend_row(
            2,
            "gpu-node-18-llamacpp",
            "http://gpu-node-18.cs.example.edu:8080",
            "llamacpp",
            status="unhealthy",
            healthy=False,
            error=ERROR,
            models=[],
            loaded_models=[],
        ),
        "ws2": _backend_row(3, "ws2", "http://ws2.lab:8000", "vllm", status="drained", loaded_models=[]),
    }
    fake.models = [{"model": MODEL, "backends": ["local-ollama", "ws2"], "loaded_on": ["local-ollama"]}]
    fake.decisions = [
        decision("mr-3fa9c2e1", user=PERSON, group=GROUP, model=MODEL, selected_backend="local-ollama", wall=NOW - 5)
    ]
    share = fake.share()
    share["groups"][0]["name"] = GROUP
    share["users"][0].update(name=PERSON, group=GROUP, deficit=-2_345_678.0, factor=0.13)
    fake.share = lambda: share  # type: ignore[method-assign]
    queue = fake.queue()
    queue["queue"]["by_user_model"] = {PERSON: {MODEL: 2}}
    queue["queue"]["oldest_wait_by_user_model"] = {PERSON: {MODEL: 4.75}}
    queue["fair_share"]["user_stats"][0].update(name=PERSON, group=GROUP, deficit=-2_345_678.0)
    fake.queue = lambda: queue  # type: ignore[method-assign]
    fake.usage = {
        "rows": [
            {"user": PERSON, "model": MODEL, "requests": 12_345, "prompt_tokens": 9.8e6, "completion_tokens": 4.2e6}
        ],
        "total": {"requests": 12_345, "prompt_tokens": 9.8e6, "completion_tokens": 4.2e6},
        "since_at": "2026-11-04T08:00:00+01:00",
        "until_at": "2026-12-04T08:00:00+01:00",
        "timezone": "CET, UTC+01:00",
        "quotas": [],
    }


#: Each command and the values it must show whole.
TABLES: dict[str, list[str]] = {
    "share": [GROUP, PERSON, "-2,345,678", "0.13", "60.0%", "71.4%"],
    "backend list": [
        "local-ollama",
        "gpu-node-18-llamacpp",
        "unhealthy",
        "drained",
        "3/4",
        MODEL,
        ERROR,
    ],
    "user list": [PERSON, GROUP, "2.5", "student"],
    "group list": [GROUP, "student"],
    "decisions": [PERSON, f"({GROUP})", MODEL, "local-ollama", "mr-3fa9c2e1"],
    "queue": [PERSON, MODEL, "4.8s", GROUP, "-2,345,678"],
    "models": [MODEL, "local-ollama", "ws2"],
    "usage --by user,model": [PERSON, MODEL, "12,345", "9.8M", "4.2M"],
    "status": ["http://127.0.0.1:8484", "1 healthy of 3"],
}


def whole(out: str, values: list[str], width: int) -> None:
    """Each value appears in one piece; a value of several words may wrap between them, never inside one."""
    assert "…" not in out, out
    assert all(len(line) <= width for line in out.splitlines()), out
    for value in values:
        pieces = value.split() if " " in value else [value]
        for piece in pieces:
            assert re.search(rf"(?<!\S){re.escape(piece)}(?!\S)", out), f"{piece!r} of {value!r} is cut in:\n{out}"


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("command", list(TABLES))
def test_every_admin_table_keeps_its_values_and_headers_whole(fake: FakeDaemon, command: str, width: int) -> None:
    lab(fake)
    run = mr(*command.split(), env={"COLUMNS": str(width)})
    assert run.exit_code == 0, run
    whole(run.stdout, TABLES[command], width)
    if command == "backend list":  # the probe error goes under the table, whole, not into the status column
        assert f"gpu-node-18-llamacpp is unhealthy: {ERROR}" in " ".join(run.stdout.split())
    if command == "share" and width == 120:  # headers were cut to d…, f… even at 120 columns
        header = " ".join(run.stdout.splitlines()[1:3])
        for word in ("weight", "target", "share", "recent", "tokens", "actual", "deficit", "factor"):
            assert re.search(rf"\b{word}\b", header), header


def test_a_narrow_terminal_names_the_columns_it_hides(fake: FakeDaemon) -> None:
    lab(fake)
    out = mr("backend", "list", env={"COLUMNS": "80"}).stdout
    assert "not shown at 80 columns:" in out and "--json shows them" in out
    wide = mr("backend", "list", env={"COLUMNS": "250"}).stdout
    assert "not shown" not in wide and "tok/s by model" in wide and URL in wide


def test_a_report_rounded_to_the_day_names_the_setting_that_did_it(fake: FakeDaemon) -> None:
    """rich read "[server]" in the footnote as markup and printed "( usage_retention_days)"."""
    lab(fake)
    assert fake.usage is not None
    fake.usage["day_resolution_before_at"] = "2026-11-20T00:00:00+01:00"
    fake.usage["day_resolution_before"] = 1_763_593_200.0
    out = " ".join(mr("usage", env={"COLUMNS": "80"}).stdout.split())
    assert "before 2026-11-20 00:00 only daily totals are kept ([server] usage_retention_days)" in out, out


def test_the_gpu_table_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from mindrouter.cli import app

    from .fake_nvml import FakeNvml
    from .test_gpu_cli import GIB, gpu, use

    use(monkeypatch, FakeNvml([gpu(0, name="NVIDIA H100 80GB HBM3", total=80 * GIB, used=40 * GIB)]))
    out = CliRunner().invoke(app, ["gpu"], env={"COLUMNS": "80", "NO_COLOR": "1"}).stdout
    whole(out, ["NVIDIA H100 80GB HBM3", "40.0/80.0 GiB", "120/300 W"], 80)
