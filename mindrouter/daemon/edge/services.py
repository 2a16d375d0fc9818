"""Typed application keys: every piece of state the daemon's handlers share."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from ...config import Config
from ...scheduler import Scheduler
from ...store import Store
from ..edge.auth import Auth
from ..pollers.gpus import GpuState
from ..pollers.leader import Leadership
from ..pollers.registry import Registry
from ..request.decisions import DecisionLog
from ..request.dispatcher import Dispatcher
from ..usage.quotas import Quotas
from ..usage.stats import Stats

__all__ = [
    "AUTH",
    "CONFIG",
    "DECISIONS",
    "DISPATCHER",
    "GPUS",
    "HANDLERS",
    "LEADERSHIP",
    "QUOTAS",
    "REGISTRY",
    "SCHEDULER",
    "SESSION",
    "STATS",
    "STORE",
    "leading",
    "role",
]

CONFIG = web.AppKey("config", Config)
HANDLERS = web.AppKey("handlers", dict)
"""Inference handlers waiting or streaming, task -> lease, for the shutdown to end (``end_handlers``)."""
STORE = web.AppKey("store", Store)
SCHEDULER = web.AppKey("scheduler", Scheduler)
DISPATCHER = web.AppKey("dispatcher", Dispatcher)
REGISTRY = web.AppKey("registry", Registry)
AUTH = web.AppKey("auth", Auth)
STATS = web.AppKey("stats", Stats)
DECISIONS = web.AppKey("decisions", DecisionLog)
GPUS = web.AppKey("gpus", GpuState)
QUOTAS = web.AppKey("quotas", Quotas)
LEADERSHIP = web.AppKey("leadership", Leadership)
"""Only on a PostgreSQL store: whether this router leads its pool (process/roles.py)."""
SESSION = web.AppKey("session", aiohttp.ClientSession)


def leading(app: web.Application) -> bool:
    """Whether this router may schedule and dispatch now: always on SQLite, on PostgreSQL while it leads."""
    leadership = app.get(LEADERSHIP)
    return leadership is None or leadership.leading


def role(app: web.Application) -> str:
    """``"leader"`` or ``"standby"`` (``mr status``; docs/scale.md)."""
    return "leader" if leading(app) else "standby"
