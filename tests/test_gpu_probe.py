"""The NVML probe against a fake NVML: readings, failures kept local, the once-only log."""

from __future__ import annotations

import logging
import os
import sys

import pytest

import mindrouter.gpu.probe as probe_mod
from mindrouter.gpu import GpuProbe, GpuProcess, GpuReading, read_gpus, readings_from_json

from .fake_nvml import (
    GIB,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_SUPPORTED,
    FakeGpu,
    FakeNvml,
    gpu,
)


@pytest.fixture(autouse=True)
def fresh_once_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_mod, "_explained", set())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_gpu_every_field() -> None:
    fake = FakeNvml(
        [
            FakeGpu(
                name="NVIDIA H100 80GB HBM3",
                uuid="GPU-abc",
                total=80 * GIB,
                used=20 * GIB,
                util_gpu=75,
                util_memory=40,
                temperature=61,
                power_mw=350_500,
                limit_mw=700_000,
                processes=[(4242, 18 * GIB), (4343, None)],
            )
        ]
    )
    names = {4242: "ollama"}
    with GpuProbe(fake, process_name=names.get) as probe:
        [r] = probe.read()
    assert r == GpuReading(
        index=0,
        name="NVIDIA H100 80GB HBM3",
        uuid="GPU-abc",
        memory_total=80 * GIB,
        memory_used=20 * GIB,
        memory_free=60 * GIB,
        utilization_gpu=75,
        utilization_memory=40,
        temperature_c=61,
        power_w=350.5,
        power_limit_w=700.0,
        processes=(GpuProcess(4242, 18 * GIB, "ollama"), GpuProcess(4343, None, None)),
    )
    assert probe.unavailable_reason is None
    assert fake.initialized == 0  # nvmlShutdown on close


def test_several_gpus_in_index_order() -> None:
    fake = FakeNvml([gpu(0), gpu(1, used=40 * GIB), gpu(2, name="NVIDIA RTX 4090", total=24 * GIB, used=1 * GIB)])
    readings = read_gpus(fake)
    assert [r.index for r in readings] == [0, 1, 2]
    assert len({r.uuid for r in readings}) == 3
    assert readings[1].memory_free == 8 * GIB
    assert readings[2].name == "NVIDIA RTX 4090"
    assert all(r.processes == () for r in readings)
    assert fake.calls["nvmlInit"] == fake.calls["nvmlShutdown"] == 1


def test_a_failing_field_is_none_and_hides_nothing_else() -> None:
    fake = FakeNvml(
        [
            gpu(
                0,
                fail={
                    "temperature": NVML_ERROR_NOT_SUPPORTED,
                    "power": NVML_ERROR_NO_PERMISSION,
                    "utilization": NVML_ERROR_NOT_SUPPORTED,
                    "processes": NVML_ERROR_NO_PERMISSION,
                },
            ),
            gpu(1),
        ]
    )
    a, b = read_gpus(fake)
    assert (a.temperature_c, a.power_w, a.utilization_gpu, a.utilization_memory, a.processes) == (None,) * 5
    assert (a.name, a.memory_free, a.power_limit_w) == ("NVIDIA RTX A6000", 40 * GIB, 300.0)
    assert b.temperature_c == 55 and b.power_w == 120.0 and b.processes == ()


def test_a_failing_gpu_is_a_bare_reading_between_good_ones() -> None:
    fake = FakeNvml([gpu(0), gpu(1, lost=True), gpu(2)])
    readings = read_gpus(fake)
    assert readings[1] == GpuReading(index=1)
    assert readings[0].memory_total == readings[2].memory_total == 48 * GIB


def test_an_unexpected_exception_in_a_field_is_contained() -> None:
    fake = FakeNvml([gpu(0)])

    def broken(handle: object) -> str:
        raise RuntimeError("ctypes went wrong")

    fake.nvmlDeviceGetName = broken  # type: ignore[method-assign]
    [r] = read_gpus(fake)
    assert r.name is None and r.uuid is not None


def test_names_as_bytes_are_decoded() -> None:
    [r] = read_gpus(FakeNvml([gpu(0, name="Tesla V100", name_as_bytes=True)]))
    assert r.name == "Tesla V100" and r.uuid.startswith("GPU-")


def test_no_driver_gives_empty_list_and_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml(init_error=NVML_ERROR_LIBRARY_NOT_FOUND)
    clock = Clock()
    probe = GpuProbe(fake, clock=clock, retry_interval=60)
    with caplog.at_level(logging.DEBUG, logger="mindrouter.gpu"):
        for _ in range(50):
            assert probe.read() == []
            clock.now += 5
        probe.close()
        assert read_gpus(FakeNvml(init_error=NVML_ERROR_LIBRARY_NOT_FOUND)) == []
    assert probe.unavailable_reason == "NVML Shared Library Not Found"
    records = [r for r in caplog.records if r.name.startswith("mindrouter.gpu")]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    assert "NVML Shared Library Not Found" in records[0].getMessage()
    # Retried every 60 s over 250 s, not at every poll.
    assert fake.calls["nvmlInit"] == 5
    assert fake.calls["nvmlShutdown"] == 0


def test_a_driver_that_appears_later_is_picked_up() -> None:
    fake = FakeNvml([gpu(0)], init_error=NVML_ERROR_DRIVER_NOT_LOADED)
    clock = Clock()
    probe = GpuProbe(fake, clock=clock, retry_interval=30)
    assert probe.read() == [] and probe.unavailable_reason == "Driver Not Loaded"
    fake.init_error = None
    clock.now += 10
    assert probe.read() == []  # not retried yet
    clock.now += 25
    assert [r.index for r in probe.read()] == [0]
    assert probe.unavailable_reason is None
    probe.close()


def test_no_gpu_with_a_driver(caplog: pytest.LogCaptureFixture) -> None:
    probe = GpuProbe(FakeNvml([]))
    with caplog.at_level(logging.INFO, logger="mindrouter.gpu"):
        assert probe.read() == [] and probe.read() == []
    assert probe.unavailable_reason == "the driver reports no GPU"
    assert len(caplog.records) == 1
    probe.close()


def test_count_failing_after_init_restarts_nvml_later() -> None:
    fake = FakeNvml([gpu(0)], count_error=NVML_ERROR_GPU_IS_LOST)
    clock = Clock()
    probe = GpuProbe(fake, clock=clock, retry_interval=10)
    assert probe.read() == []
    assert fake.initialized == 0  # shut down, to start afresh
    fake.count_error = None
    clock.now += 11
    assert len(probe.read()) == 1
    probe.close()
    assert fake.initialized == 0


def test_init_once_close_twice() -> None:
    fake = FakeNvml([gpu(0)])
    probe = GpuProbe(fake)
    for _ in range(5):
        probe.read()
    probe.close()
    probe.close()
    assert fake.calls["nvmlInit"] == 1 and fake.calls["nvmlShutdown"] == 1


def test_missing_pynvml_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    probe = GpuProbe()
    assert probe.read() == []
    assert probe.unavailable_reason == "nvidia-ml-py is not installed"


def test_default_module_is_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([gpu(0)]))
    assert len(read_gpus()) == 1


def test_json_round_trip_and_tolerance() -> None:
    with GpuProbe(FakeNvml([gpu(0, processes=[(7, GIB)])]), process_name=lambda pid: None) as probe:
        [r] = probe.read()
    data = r.to_dict()
    assert data["processes"] == [{"pid": 7, "used_memory": GIB, "name": None}]
    assert list(data) == [
        "index",
        "name",
        "uuid",
        "memory_total",
        "memory_used",
        "memory_free",
        "utilization_gpu",
        "utilization_memory",
        "temperature_c",
        "power_w",
        "power_limit_w",
        "processes",
    ]
    assert GpuReading.from_dict(data) == r
    odd = GpuReading.from_dict(
        {
            "index": 0,
            "memory_free": "lots",
            "power_w": 100,
            "temperature_c": True,
            "processes": [{"pid": "x"}, {"pid": 3}],
            "extra": 1,
        }
    )
    assert odd == GpuReading(index=0, power_w=100.0, processes=(GpuProcess(3, None, None),))
    assert readings_from_json([]) == []
    with pytest.raises(ValueError):
        readings_from_json({"gpus": []})
    with pytest.raises(ValueError):
        readings_from_json([1])


@pytest.mark.skipif(not os.path.exists("/proc/self/comm"), reason="needs Linux /proc")
def test_process_names_come_from_proc() -> None:
    assert probe_mod.proc_comm(os.getpid())
    assert probe_mod.proc_comm(2**31 - 1) is None


def test_fake_matches_real_pynvml() -> None:
    pynvml = pytest.importorskip("pynvml")
    from . import fake_nvml

    for name in dir(fake_nvml):
        if name.startswith("NVML_") or name.startswith("NVMLError_"):
            real = getattr(pynvml, name)
            fake = getattr(fake_nvml, name)
            if name.startswith("NVML_"):
                assert fake == real, name
            else:
                assert str(fake()) == str(real()) and fake().value == real().value, name
    for fn in FakeNvml.FUNCTIONS:
        assert callable(getattr(pynvml, fn)), fn
