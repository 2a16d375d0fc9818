"""Typed application keys: every piece of state the daemon's handlers share."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from ...config import Config
from ...scheduler import Scheduler
from ...store import Store
from ...store.worker import StoreWorker
from ..edge.auth import Auth
from ..pollers.gpus import GpuState
from ..pollers.registry import Registry
from ..pollers.stats import Stats
from ..request.decisions import DecisionLog
from ..request.dispatcher import Dispatcher
from ..request.quotas import Quotas

__all__ = [
    "AUTH",
    "CONFIG",
    "DECISIONS",
    "DISPATCHER",
    "GPUS",
    "HANDLERS",
    "QUOTAS",
    "REGISTRY",
    "SCHEDULER",
    "SESSION",
    "STATS",
    "STORE",
    "STORE_WORKER",
]

CONFIG = web.AppKey("config", Config)
HANDLERS = web.AppKey("handlers", dict)
"""Inference handlers waiting or streaming, task -> lease, for the shutdown to end (``end_handlers``)."""
STORE = web.AppKey("store", Store)
STORE_WORKER = web.AppKey("store_worker", StoreWorker)
"""A Store on a thread of its own: reports, listings and retention, off the event loop."""
SCHEDULER = web.AppKey("scheduler", Scheduler)
DISPATCHER = web.AppKey("dispatcher", Dispatcher)
REGISTRY = web.AppKey("registry", Registry)
AUTH = web.AppKey("auth", Auth)
STATS = web.AppKey("stats", Stats)
DECISIONS = web.AppKey("decisions", DecisionLog)
GPUS = web.AppKey("gpus", GpuState)
QUOTAS = web.AppKey("quotas", Quotas)
SESSION = web.AppKey("session", aiohttp.ClientSession)
