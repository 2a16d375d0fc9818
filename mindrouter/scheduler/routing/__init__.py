"""Routing: where a job runs, and what answers teach about the backends.

``Router`` is its one face (``router.py``); the rest are its parts: what is
known of each backend (``backend.py``), the hard constraints
(``constraints.py``), the per-class candidate cache (``classes.py``), the
finish-time estimate (``estimate.py``), what an answer teaches
(``learning.py``), the prefixes each backend holds (``prefixes.py``) and which
busy models are drained where, for models whose queues wait (``placement.py``).
Nothing here knows a person: a job comes with the answer
fairness expects of it.
"""

from .backend import ALL_MODALITIES, Backend, BackendLoad, ModelSpeed
from .constraints import REASONS
from .estimate import Estimate
from .router import Route, Router

__all__ = ["ALL_MODALITIES", "REASONS", "Backend", "BackendLoad", "Estimate", "ModelSpeed", "Route", "Router"]
