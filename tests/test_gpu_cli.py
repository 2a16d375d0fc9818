"""`mr gpu` with a fake NVML: table, JSON and the no-GPU sentence; and the shared renderables."""

from __future__ import annotations

import io
import json
import sys

import pytest
from rich.console import Console
from typer.testing import CliRunner

import mindrouter.gpu.probe as probe_mod
from mindrouter.cli import app
from mindrouter.gpu import GpuReading
from mindrouter.gpu.render import gpu_table, vram_bar

from .fake_nvml import GIB, NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED, FakeNvml, gpu

ENV = {"COLUMNS": "120", "NO_COLOR": "1"}


@pytest.fixture(autouse=True)
def fresh_once_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_mod, "_explained", set())


def use(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml) -> FakeNvml:
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_table(monkeypatch: pytest.MonkeyPatch) -> None:
    use(
        monkeypatch,
        FakeNvml(
            [
                gpu(
                    0,
                    name="NVIDIA H100 80GB HBM3",
                    total=80 * GIB,
                    used=40 * GIB,
                    util_gpu=97,
                    processes=[(11, GIB), (12, GIB)],
                ),
                gpu(1, fail={"temperature": NVML_ERROR_NOT_SUPPORTED}),
            ]
        ),
    )
    result = CliRunner().invoke(app, ["gpu"], env=ENV)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["GPU", "Name", "Memory", "Util", "Mem", "util", "Temp", "Power", "Procs"]
    assert "NVIDIA H100 80GB HBM3" in lines[1] and "█████░░░░░ 40.0/80.0 GiB" in lines[1]
    assert "97%" in lines[1] and "120/300 W" in lines[1] and lines[1].rstrip().endswith("2")
    assert "n/a" in lines[2]  # the temperature it could not read
    assert "\x1b[" not in result.output  # no colour codes when not a terminal


def test_json(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, FakeNvml([gpu(0), gpu(1, lost=True)]))
    result = CliRunner().invoke(app, ["gpu", "--json"], env=ENV)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert rows[0]["index"] == 0 and rows[0]["memory_free"] == 40 * GIB and rows[0]["processes"] == []
    assert rows[1] == {**dict.fromkeys(rows[0], None), "index": 1}
    assert all(key == key.lower() for key in rows[0])


def test_no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, FakeNvml(init_error=NVML_ERROR_LIBRARY_NOT_FOUND))
    result = CliRunner().invoke(app, ["gpu"], env=ENV)
    assert result.exit_code == 0
    assert result.output == (
        "No NVIDIA GPU found on this machine (NVML: NVML Shared Library Not Found); GPU columns will read n/a.\n"
    )
    result = CliRunner().invoke(app, ["gpu", "--json"], env=ENV)
    assert result.exit_code == 0 and json.loads(result.output) == []


def test_no_gpu_with_a_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, FakeNvml([]))
    result = CliRunner().invoke(app, ["gpu"], env=ENV)
    assert result.exit_code == 0
    assert result.output.startswith("No NVIDIA GPU found on this machine (NVML: the driver reports no GPU)")


def test_vram_bar() -> None:
    assert vram_bar(36 * GIB, 48 * GIB).plain == "████████░░ 36.0/48.0 GiB"
    assert vram_bar(24 * GIB, 48 * GIB).plain == "█████░░░░░ 24.0/48.0 GiB"
    assert vram_bar(48 * GIB, 48 * GIB, ascii=True).plain == "########## 48.0/48.0 GiB"
    assert vram_bar(None, 48 * GIB).plain == "n/a"
    assert vram_bar(1, 0).plain == "n/a"


def test_gpu_table_renders_unknowns_as_na() -> None:
    console = Console(width=100, file=io.StringIO(), record=True, color_system=None)
    console.print(gpu_table([GpuReading(index=3)], title="node-a"))
    text = console.export_text()
    assert text.splitlines()[0].rstrip() == "node-a"
    assert text.splitlines()[2].split() == ["3"] + ["n/a"] * 7
