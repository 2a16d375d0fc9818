"""The sans-I/O scheduling core: no asyncio, no sockets, no clock; time is passed in.

``Scheduler`` (``core.py``) is its one face: it owns the jobs' lives (where each
runs, queue deadlines, retries) and composes two parts that never import each
other: ``fairness/`` (``Turns``: whose job goes next, and what it is charged)
and ``routing/`` (``Router``: where it runs, and what answers teach). Both use
jobs (``jobs.py``), pools of contention (``pooling.py``) and the settings; the
core hands back decisions (``records.py``) and frozen snapshots (``views.py``).
"""

from .core import Scheduler, UnknownUser
from .fairness.fairshare import FairShare
from .fairness.pools import UserState
from .fairness.priority import PriorityTerms, apply_factor, heavy_factor, seed_priority
from .jobs import TOKEN_LIMIT, Expired, Job, Modality, Outcome, Rejection, Timings
from .prefix import Prefix, chain, message_chain
from .records import DecisionRecord, Dispatch
from .routing.backend import ALL_MODALITIES, Backend, BackendLoad
from .routing.constraints import REASONS
from .routing.estimate import Estimate
from .settings import DEFAULT_GROUP_WEIGHTS, SHARES, SchedulerSettings, ScoreWeights, check_weight
from .views import PoolShare, QueueStats, SeatShare, ShareSnapshot, UserShare

__all__ = [
    "ALL_MODALITIES",
    "DEFAULT_GROUP_WEIGHTS",
    "REASONS",
    "SHARES",
    "TOKEN_LIMIT",
    "Backend",
    "BackendLoad",
    "DecisionRecord",
    "Dispatch",
    "Estimate",
    "Expired",
    "FairShare",
    "Job",
    "Modality",
    "Outcome",
    "PoolShare",
    "Prefix",
    "PriorityTerms",
    "QueueStats",
    "Rejection",
    "Scheduler",
    "SchedulerSettings",
    "ScoreWeights",
    "SeatShare",
    "ShareSnapshot",
    "Timings",
    "UnknownUser",
    "UserShare",
    "UserState",
    "apply_factor",
    "chain",
    "check_weight",
    "heavy_factor",
    "message_chain",
    "seed_priority",
]
