"""One model of an inference workstation, pure (time passed in), for ``mr simulate`` and the benchmarks.

The simulator drives it from its event heap (``simulate/engine.py``), and
``benchmarks/_workstation.py`` from asyncio's clock, time-compressed, behind
fake Ollama servers: both ask the same object what a workstation does, so
the simulator-against-live comparison tests routing, not two copies of one
assumption. Its parts:

- ``station.py``: the server (Ollama's ``server/sched.go``): its queue, loads,
  evictions, keep_alive, runners and their slots;
- ``ollama.py``: Ollama's rules for a runner (slots, context, VRAM, reloads);
- ``caches.py``: prompt caches (llama-server's slots, vLLM's prefix blocks);
- ``prompts.py``: prompts as segments of tokens, compared by prefix;
- ``gpu.py``: streams on one GPU and the law by which models share it;
- ``streams.py``: the state of a request and of a runner.

docs/simulate.md ("A pool of Ollama workstations", "Prompt caches") says
what each follows and where it simplifies.
"""

from .prompts import Prompt, Segment
from .station import ServerBusy, Workstation
from .streams import DECODE, DONE, PREFILL, WAITING, Options, Runner, Stream

__all__ = [
    "DECODE",
    "DONE",
    "PREFILL",
    "WAITING",
    "Options",
    "Prompt",
    "Runner",
    "Segment",
    "ServerBusy",
    "Stream",
    "Workstation",
]
