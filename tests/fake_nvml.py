"""A test double of exactly the pynvml functions mindrouter.gpu.probe calls.

``FakeNvml(gpus=[...])`` stands in for the ``pynvml`` module: pass it as
``GpuProbe(nvml=...)``, or put it in ``sys.modules["pynvml"]``. Error codes,
class names and messages are the real ones (a test checks them against
nvidia-ml-py), so the probe sees what it would see on a real machine.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar

GIB = 1024**3

NVML_TEMPERATURE_GPU = 0

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: ("Uninitialized", "Uninitialized"),
    NVML_ERROR_INVALID_ARGUMENT: ("InvalidArgument", "Invalid Argument"),
    NVML_ERROR_NOT_SUPPORTED: ("NotSupported", "Not Supported"),
    NVML_ERROR_NO_PERMISSION: ("NoPermission", "Insufficient Permissions"),
    NVML_ERROR_NOT_FOUND: ("NotFound", "Not Found"),
    NVML_ERROR_DRIVER_NOT_LOADED: ("DriverNotLoaded", "Driver Not Loaded"),
    NVML_ERROR_TIMEOUT: ("Timeout", "Timeout"),
    NVML_ERROR_LIBRARY_NOT_FOUND: ("LibraryNotFound", "NVML Shared Library Not Found"),
    NVML_ERROR_GPU_IS_LOST: ("GpuIsLost", "GPU is lost"),
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: ("LibRmVersionMismatch", "RM has detected an NVML/RM version mismatch."),
    NVML_ERROR_UNKNOWN: ("Unknown", "Unknown Error"),
}


class NVMLError(Exception):
    """Like pynvml's: ``NVMLError(code)`` builds the subclass for that code; ``.value`` is the code."""

    _by_code: ClassVar[dict[int, type[NVMLError]]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._by_code.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, ("", f"NVML Error with code {self.value}"))[1]


def _error_class(code: int, suffix: str) -> type[NVMLError]:
    def new(cls: type, *args: Any) -> NVMLError:
        return NVMLError.__new__(cls, code)

    return type(f"NVMLError_{suffix}", (NVMLError,), {"__new__": new})


for _code, (_suffix, _message) in _MESSAGES.items():
    NVMLError._by_code[_code] = globals()[f"NVMLError_{_suffix}"] = _error_class(_code, _suffix)

NVMLError_LibraryNotFound = NVMLError._by_code[NVML_ERROR_LIBRARY_NOT_FOUND]
NVMLError_DriverNotLoaded = NVMLError._by_code[NVML_ERROR_DRIVER_NOT_LOADED]
NVMLError_Uninitialized = NVMLError._by_code[NVML_ERROR_UNINITIALIZED]


@dataclass
class FakeGpu:
    """One GPU; ``fail`` maps a field (name, uuid, memory, utilization,
    temperature, power, power_limit, processes) to the NVML error code its read raises."""

    name: str = "NVIDIA RTX A6000"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    total: int = 48 * GIB
    used: int = 8 * GIB
    util_gpu: int = 30
    util_memory: int = 12
    temperature: int = 55
    power_mw: int = 120_000
    limit_mw: int = 300_000
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    fail: dict[str, int] = field(default_factory=dict)
    lost: bool = False
    """nvmlDeviceGetHandleByIndex raises GPU_IS_LOST for this one."""
    name_as_bytes: bool = False
    """Old pynvml returned bytes for names and UUIDs."""


def gpu(index: int, **kw: Any) -> FakeGpu:
    """A distinct GPU for index ``index``."""
    kw.setdefault("uuid", f"GPU-{index:08d}-aaaa-bbbb-cccc-000000000000")
    return FakeGpu(**kw)


class FakeNvml:
    """Stands in for the pynvml module.

    Args:
        gpus: the machine's GPUs; none means a driver with no device.
        init_error: an NVML code nvmlInit raises (12 = no library at all).
        count_error: an NVML code nvmlDeviceGetCount raises.
    """

    NVMLError = NVMLError
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_ERROR_UNINITIALIZED = NVML_ERROR_UNINITIALIZED
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_UNKNOWN = NVML_ERROR_UNKNOWN

    #: The pynvml functions this double provides, i.e. every one the probe may call.
    FUNCTIONS = (
        "nvmlInit",
        "nvmlShutdown",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetComputeRunningProcesses",
    )

    def __init__(
        self, gpus: list[FakeGpu] | None = None, *, init_error: int | None = None, count_error: int | None = None
    ) -> None:
        self.gpus = list(gpus or [])
        self.init_error = init_error
        self.count_error = count_error
        self.initialized = 0
        self.calls: Counter[str] = Counter()

    # -- helpers ------------------------------------------------------------

    def _call(self, name: str) -> None:
        self.calls[name] += 1
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: Any, fn: str, field_name: str) -> FakeGpu:
        self._call(fn)
        g = self.gpus[handle.index]
        if field_name in g.fail:
            raise NVMLError(g.fail[field_name])
        return g

    # -- the pynvml surface ---------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        self.initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        if self.count_error is not None:
            raise NVMLError(self.count_error)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._call("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(index=index)

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes:
        g = self._gpu(handle, "nvmlDeviceGetName", "name")
        return g.name.encode() if g.name_as_bytes else g.name

    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes:
        g = self._gpu(handle, "nvmlDeviceGetUUID", "uuid")
        return g.uuid.encode() if g.name_as_bytes else g.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        g = self._gpu(handle, "nvmlDeviceGetMemoryInfo", "memory")
        return SimpleNamespace(total=g.total, used=g.used, free=g.total - g.used)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        g = self._gpu(handle, "nvmlDeviceGetUtilizationRates", "utilization")
        return SimpleNamespace(gpu=g.util_gpu, memory=g.util_memory)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        g = self._gpu(handle, "nvmlDeviceGetTemperature", "temperature")
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return g.temperature

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage", "power").power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit", "power_limit").limit_mw

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        g = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses", "processes")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in g.processes]
