"""The sans-I/O scheduling core: no asyncio, no sockets, no clock; time is passed in."""

from .core import Scheduler, UnknownUser
from .fairness.fairshare import FairShare
from .fairness.pools import UserState
from .fairness.priority import PriorityTerms, apply_factor, heavy_factor, seed_priority
from .jobs import TOKEN_LIMIT, Expired, Job, Modality, Outcome, Rejection, Timings
from .records import DecisionRecord, Dispatch
from .routing.backend import ALL_MODALITIES, Backend, BackendLoad
from .routing.constraints import REASONS
from .routing.estimate import Estimate
from .settings import DEFAULT_GROUP_WEIGHTS, SHARES, SchedulerSettings, ScoreWeights, check_weight
from .views import PoolShare, QueueStats, SeatShare, ShareSnapshot, UserShare, normalized_shares

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
    "check_weight",
    "heavy_factor",
    "normalized_shares",
    "seed_priority",
]
