"""One adapter per inference engine: health, models, telemetry, translation and streaming.

See :mod:`mindrouter.backends.base` for the seam the daemon uses.
"""

from ._shapes import error_body
from ._types import Dialect, Family, Kind, Usage
from .base import INFERENCE_PATHS, Adapter, BackendError, Call, Probe, Upstream
from .engines import ENGINES, make_adapter
from .llamacpp import LlamaCppAdapter
from .ollama import OllamaAdapter
from .openai import OpenAIAdapter
from .vllm import VllmAdapter

__all__ = [
    "ENGINES",
    "INFERENCE_PATHS",
    "Adapter",
    "BackendError",
    "Call",
    "Dialect",
    "Family",
    "Kind",
    "LlamaCppAdapter",
    "OllamaAdapter",
    "OpenAIAdapter",
    "Probe",
    "Upstream",
    "Usage",
    "VllmAdapter",
    "error_body",
    "make_adapter",
]
