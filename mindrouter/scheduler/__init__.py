"""The sans-I/O scheduling core: no asyncio, no sockets, no clock; time is passed in."""

from .backend import ALL_MODALITIES, Backend, BackendLoad
from .core import Scheduler, UnknownUser
from .fairshare import FairShare, UserState, apply_factor, heavy_factor, seed_priority
from .jobs import Dispatch, Expired, Job, Modality, Outcome, Rejection
from .records import DecisionRecord, PriorityTerms
from .scoring import REASONS, ScoreRow
from .settings import DEFAULT_GROUP_WEIGHTS, SchedulerSettings, ScoreWeights, check_weight

__all__ = [
    "ALL_MODALITIES",
    "DEFAULT_GROUP_WEIGHTS",
    "REASONS",
    "Backend",
    "BackendLoad",
    "DecisionRecord",
    "Dispatch",
    "Expired",
    "FairShare",
    "Job",
    "Modality",
    "Outcome",
    "PriorityTerms",
    "Rejection",
    "Scheduler",
    "SchedulerSettings",
    "ScoreRow",
    "ScoreWeights",
    "UnknownUser",
    "UserState",
    "apply_factor",
    "check_weight",
    "heavy_factor",
    "seed_priority",
]
