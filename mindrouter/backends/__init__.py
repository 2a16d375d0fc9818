"""One adapter per inference engine: health, models, telemetry, translation and streaming.

See :mod:`mindrouter.backends.base` for the seam the daemon uses.
"""

from ._shapes import Dialect, Family, Fault, Kind, Usage, error_body
from .base import Adapter, BackendError
from .budget import Budget
from .call import INFERENCE_PATHS, Call
from .engines import ENGINES, make_adapter
from .llamacpp import LlamaCppAdapter
from .ollama import OllamaAdapter
from .openai import OpenAIAdapter
from .probe import Probe, model_key, set_aliases
from .upstream import Upstream
from .vllm import VllmAdapter

__all__ = [
    "ENGINES",
    "INFERENCE_PATHS",
    "Adapter",
    "BackendError",
    "Budget",
    "Call",
    "Dialect",
    "Family",
    "Fault",
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
    "model_key",
    "set_aliases",
]
