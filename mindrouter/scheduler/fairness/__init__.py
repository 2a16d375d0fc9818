"""Fairness: whose job goes next, and what each person is charged for what runs."""

from .fairshare import FairShare
from .pools import Pool, Seat, UserState
from .priority import PriorityTerms, apply_factor, heavy_factor, seed_priority

__all__ = ["FairShare", "Pool", "PriorityTerms", "Seat", "UserState", "apply_factor", "heavy_factor", "seed_priority"]
