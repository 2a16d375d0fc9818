"""GPUs: the NVML probe, VRAM estimates and memory fit, node readings, and ``mr agent``.

The agent's server and client (``mindrouter.gpu.agent``, ``mindrouter.gpu.client``)
import aiohttp and are not re-exported here, so ``mr gpu`` stays light.
"""

import logging

from .node import NodeReadings
from .probe import GpuProbe, GpuProcess, GpuReading, read_gpus, readings_from_json
from .vram import (
    DEFAULT_CONTEXT,
    RUNTIME_OVERHEAD_BYTES,
    UNKNOWN_KV_FRACTION,
    ModelShape,
    estimate_model_vram,
    fits,
    free_vram,
    parse_ollama_show,
    total_vram,
    utilization,
)

# A library logs; the application decides where it goes. Without this, Python's
# last-resort handler would print the once-only NVML warning under `mr gpu`'s own sentence.
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "DEFAULT_CONTEXT",
    "RUNTIME_OVERHEAD_BYTES",
    "UNKNOWN_KV_FRACTION",
    "GpuProbe",
    "GpuProcess",
    "GpuReading",
    "ModelShape",
    "NodeReadings",
    "estimate_model_vram",
    "fits",
    "free_vram",
    "parse_ollama_show",
    "read_gpus",
    "readings_from_json",
    "total_vram",
    "utilization",
]
