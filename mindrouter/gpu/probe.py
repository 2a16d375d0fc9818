"""Read this machine's NVIDIA GPUs through NVML, without ever failing the caller.

Invariants:

- ``GpuProbe.read()`` never raises and never blocks for long: it is called
  from the daemon's thread executor every ``gpu_poll_interval`` and by
  ``mr agent``'s poller, never on the request path.
- Every field is read in its own ``try``; a field that cannot be read is
  ``None`` in that one reading, and a GPU whose handle cannot be had is a
  reading with only its ``index``. One failure never hides the others.
- No driver, no library or no GPU gives an empty list and ONE logged
  explanation per reason for the life of the process, not one per poll.
- The NVML module is injected (``nvml=``), so tests pass a fake and never
  touch a real GPU; by default ``pynvml`` (from nvidia-ml-py) is imported
  lazily, when the first read happens.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

from ..reported import BYTES_LIMIT, distrust, nbytes, number

__all__ = ["GpuProbe", "GpuProcess", "GpuReading", "read_gpus", "readings_from_json"]

log = logging.getLogger(__name__)

#: Explanations already logged in this process (the once-only log).
_explained: set[str] = set()

# Real pynvml values; read from the module when it has them.
_NVML_TEMPERATURE_GPU = 0
_NVML_ERROR_NOT_SUPPORTED = 3


class GpuProcess(NamedTuple):
    """One compute process on a GPU."""

    pid: int
    used_memory: int | None
    """Bytes of GPU memory it holds; None where NVML cannot say (WDDM, containers)."""
    name: str | None = None
    """Its command name from /proc, when that is readable here."""


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one moment. Any field but ``index`` is None when its read failed."""

    index: int | None
    name: str | None = None
    uuid: str | None = None
    memory_total: int | None = None
    """Bytes."""
    memory_used: int | None = None
    """Bytes, including what the driver reserves."""
    memory_free: int | None = None
    """Bytes a new model could use now."""
    utilization_gpu: int | None = None
    """Percent of the last sample period in which a kernel ran."""
    utilization_memory: int | None = None
    """Percent of that period in which memory was read or written (not occupancy)."""
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    """The enforced limit, in watts."""
    processes: tuple[GpuProcess, ...] | None = None
    """Compute processes; ``()`` when none run, None when they could not be listed."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of ``mr gpu --json``, ``GET /gpus`` and ``/admin/gpus``."""
        data = asdict(self)
        if self.processes is not None:
            data["processes"] = [p._asdict() for p in self.processes]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "") -> GpuReading:
        """Build a reading from JSON sent by another machine (``source``, named once in the log for each
        value dropped); a value of the wrong type or out of range reads as None.

        Raises:
            ValueError: ``data`` is not a JSON object.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"a GPU reading must be a JSON object, not {type(data).__name__}")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name == "processes":
                continue
            kind = _FIELD_TYPES[f.name]
            value = data.get(f.name)
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            value = value if isinstance(value, kind) and not isinstance(value, bool) else None
            if f.name in _RANGES and value is not None:  # another machine's numbers: NaN, negative, huge dropped
                low, high = _RANGES[f.name]
                checked = number(value, high, low=low, integral=kind is int)
                if checked is None:
                    distrust(source, f.name, value)
                value = checked
            values[f.name] = value
        procs = data.get("processes")
        if isinstance(procs, list):
            values["processes"] = tuple(
                _process_from(p) for p in procs if isinstance(p, Mapping) and _is_int(p.get("pid"))
            )
        else:
            values["processes"] = None
        return cls(**values)


_FIELD_TYPES: dict[str, type] = {
    "index": int,
    "name": str,
    "uuid": str,
    "memory_total": int,
    "memory_used": int,
    "memory_free": int,
    "utilization_gpu": int,
    "utilization_memory": int,
    "temperature_c": int,
    "power_w": float,
    "power_limit_w": float,
}


_RANGES: dict[str, tuple[float, float]] = {
    "memory_total": (0, BYTES_LIMIT),
    "memory_used": (0, BYTES_LIMIT),
    "memory_free": (0, BYTES_LIMIT),
    "utilization_gpu": (0, 100),
    "utilization_memory": (0, 100),
    "temperature_c": (-100, 300),
    "power_w": (0, 100_000),
    "power_limit_w": (0, 100_000),
}
"""What a reading from ``mr agent`` may say; anything else reads as unknown."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _process_from(data: Mapping[str, Any]) -> GpuProcess:
    used = data.get("used_memory")
    name = data.get("name")
    return GpuProcess(int(data["pid"]), nbytes(used), name if isinstance(name, str) else None)


def readings_from_json(data: Any, source: str = "") -> list[GpuReading]:
    """Parse a JSON array of readings (the agent's ``GET /gpus`` at ``source``).

    Raises:
        ValueError: ``data`` is not a list of objects.
    """
    if not isinstance(data, list):
        raise ValueError(f"expected a JSON array of GPU readings, not {type(data).__name__}")
    return [GpuReading.from_dict(item, source) for item in data]


def _explain_once(message: str, level: int = logging.WARNING) -> None:
    if message not in _explained:
        _explained.add(message)
        log.log(level, "%s", message)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def proc_comm(pid: int) -> str | None:
    """The command name of ``pid`` from /proc; None where there is no such process here."""
    try:
        with open(f"/proc/{int(pid)}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except (OSError, ValueError):
        return None


class GpuProbe:
    """A long-lived NVML session that the daemon and ``mr agent`` poll.

    ``nvmlInit`` runs once, at the first ``read()``; ``close()`` calls
    ``nvmlShutdown``. When NVML cannot start (no library, no driver), the
    probe answers ``[]`` at once and tries again only every
    ``retry_interval`` seconds, so a driver installed later is picked up
    without a restart while polls stay cheap.

    Args:
        nvml: the ``pynvml`` module or a test double. Defaults to importing
            ``pynvml`` at the first read.
        retry_interval: seconds between attempts to start NVML after a
            failure. Defaults to 60.
        clock: monotonic seconds, for the retry timer. Defaults to
            ``time.monotonic``.
        process_name: maps a pid to a name; defaults to reading
            ``/proc/PID/comm`` (cheap, and None for processes not visible here).
    """

    def __init__(
        self,
        nvml: Any = None,
        *,
        retry_interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        process_name: Callable[[int], str | None] | None = proc_comm,
    ) -> None:
        self._nvml = nvml
        self._retry_interval = retry_interval
        self._clock = clock
        self._process_name = process_name
        self._lock = threading.Lock()
        self._initialized = False
        self._next_try: float | None = None
        self.unavailable_reason: str | None = None
        """Why the last read found no GPU (NVML's own words), or None when it found some."""

    # -- lifecycle ---------------------------------------------------------

    def _start(self) -> bool:
        """Start NVML if it is not running; False (with the reason kept) when it cannot."""
        if self._initialized:
            return True
        now = self._clock()
        if self._next_try is not None and now < self._next_try:
            return False
        self._next_try = now + self._retry_interval
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError:
                return self._unavailable("nvidia-ml-py is not installed")
        try:
            self._nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ... or a broken library
            return self._unavailable(_text(exc) or type(exc).__name__)
        self._initialized = True
        if self.unavailable_reason is not None:
            log.info("NVML started after all; GPU readings are available now")
        return True

    def _unavailable(self, reason: str) -> bool:
        self.unavailable_reason = reason
        _explain_once(
            f"No NVIDIA GPU readings on this machine (NVML: {reason}); GPU readings stay empty, "
            "so memory fit and utilization read as unknown, until NVML can start."
        )
        return False

    def close(self) -> None:
        """Shut NVML down; safe to call twice, never raises."""
        with self._lock:
            if self._initialized:
                self._initialized = False
                try:
                    self._nvml.nvmlShutdown()
                except Exception as exc:
                    log.debug("nvmlShutdown failed: %s", exc)

    def __enter__(self) -> GpuProbe:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- reading -----------------------------------------------------------

    def read(self) -> list[GpuReading]:
        """Every GPU's reading now, or ``[]`` when NVML is unavailable. Never raises."""
        with self._lock:
            try:
                return self._read()
            except Exception as exc:  # pragma: no cover - _read guards each call; this is the last net
                _explain_once(f"reading GPUs failed unexpectedly: {exc!r}")
                return []

    def _read(self) -> list[GpuReading]:
        if not self._start():
            return []
        nvml = self._nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            # The driver went away under us (unloaded, upgraded): start over at the next retry.
            self._initialized = False
            self._next_try = self._clock() + self._retry_interval
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()
            self._unavailable(_text(exc))
            return []
        if count == 0:
            self.unavailable_reason = "the driver reports no GPU"
            _explain_once("NVML started but reports no GPU on this machine.")
            return []
        self.unavailable_reason = None
        return [self._read_one(i) for i in range(count)]

    def _read_one(self, index: int) -> GpuReading:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            self._field_failed(index, "handle", exc)
            return GpuReading(index=index)

        def get(field: str, fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except Exception as exc:
                self._field_failed(index, field, exc)
                return None

        name = get("name", lambda: _text(nvml.nvmlDeviceGetName(handle)))
        uuid = get("uuid", lambda: _text(nvml.nvmlDeviceGetUUID(handle)))
        mem = get("memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        util = get("utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", _NVML_TEMPERATURE_GPU)
        temp = get("temperature", lambda: int(nvml.nvmlDeviceGetTemperature(handle, sensor)))
        power = get("power", lambda: int(nvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0)
        limit = get("power_limit", lambda: int(nvml.nvmlDeviceGetEnforcedPowerLimit(handle)) / 1000.0)
        procs = get("processes", lambda: self._processes(nvml.nvmlDeviceGetComputeRunningProcesses(handle)))
        return GpuReading(
            index=index,
            name=name,
            uuid=uuid,
            memory_total=_attr_int(mem, "total"),
            memory_used=_attr_int(mem, "used"),
            memory_free=_attr_int(mem, "free"),
            utilization_gpu=_attr_int(util, "gpu"),
            utilization_memory=_attr_int(util, "memory"),
            temperature_c=temp,
            power_w=power,
            power_limit_w=limit,
            processes=procs,
        )

    def _processes(self, infos: Sequence[Any]) -> tuple[GpuProcess, ...]:
        out = []
        for info in infos:
            pid = int(info.pid)
            used = getattr(info, "usedGpuMemory", None)
            name = None
            if self._process_name is not None:
                try:
                    name = self._process_name(pid)
                except Exception:
                    name = None
            out.append(GpuProcess(pid, int(used) if used is not None else None, name))
        return tuple(out)

    def _field_failed(self, index: int, field: str, exc: Exception) -> None:
        # "Not supported" is normal (power on some boards, processes in some
        # containers); anything else is worth one line at debug level.
        code = getattr(exc, "value", None)
        not_supported = getattr(self._nvml, "NVML_ERROR_NOT_SUPPORTED", _NVML_ERROR_NOT_SUPPORTED)
        if code != not_supported:
            _explain_once(f"GPU {index}: cannot read {field} ({_text(exc) or type(exc).__name__})", logging.DEBUG)


def _attr_int(obj: Any, name: str) -> int | None:
    if obj is None:
        return None
    try:
        return int(getattr(obj, name))
    except (AttributeError, TypeError, ValueError):
        return None


def read_gpus(nvml: Any = None) -> list[GpuReading]:
    """Read every GPU once (init, read, shutdown): for one-shot callers such as ``mr gpu``.

    Args:
        nvml: the ``pynvml`` module or a test double. Defaults to ``pynvml``.

    Returns:
        One reading per GPU; ``[]`` when there is no driver or GPU, with the
        reason logged once per process.
    """
    with GpuProbe(nvml) as probe:
        return probe.read()
