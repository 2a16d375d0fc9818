"""Routing: where a job runs, and what answers teach about the backends."""

from .backend import ALL_MODALITIES, Backend, BackendLoad, ModelSpeed
from .constraints import REASONS
from .estimate import Estimate

__all__ = ["ALL_MODALITIES", "REASONS", "Backend", "BackendLoad", "Estimate", "ModelSpeed"]
