"""The daemon's services as one typed bundle: ``create_app`` builds it once, every handler reads it.

A handler takes what it needs from ``request.app[SERVICES]`` (``.store``, ``.dispatcher``, ...), so
the types of the services are checked where they are used, and one place lists what the daemon is
made of. The services' classes are named here for the type checker only: at run time this module
imports none of them, so the request path does not drag in every layer with the bundle.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    import aiohttp

    from ...config import Config
    from ...scheduler import Scheduler
    from ...store import Store
    from ...store.worker import StoreWorker
    from ..pollers.gpus import GpuState
    from ..pollers.leader import Leadership
    from ..pollers.registry import Registry
    from ..request.decisions import DecisionLog
    from ..request.dispatcher import Dispatcher
    from ..request.lease import Lease
    from ..usage.quotas import Quotas
    from ..usage.stats import Stats
    from ..usage.writer import UsageWriter
    from .auth import Auth

__all__ = ["SERVICES", "Services"]


@dataclass(slots=True)
class Services:
    """Every service the daemon's handlers share."""

    config: Config
    store: Store
    scheduler: Scheduler
    dispatcher: Dispatcher
    registry: Registry
    auth: Auth
    quotas: Quotas
    stats: Stats
    usage: UsageWriter
    """The usage rows: ``usage.write()`` stores those not yet written."""
    decisions: DecisionLog
    gpus: GpuState
    session: aiohttp.ClientSession
    store_worker: StoreWorker
    """A Store on a thread of its own: reports, listings and retention, off the event loop."""
    handlers: dict[asyncio.Task[object], Lease] = field(default_factory=dict)
    """Inference handlers waiting or streaming, task -> lease, for the shutdown to end (``end_handlers``)."""
    leadership: Leadership | None = None
    """Only on a PostgreSQL store: whether this router leads its pool (process/roles.py)."""

    @property
    def leading(self) -> bool:
        """Whether this router may schedule and dispatch now: always on SQLite, on PostgreSQL while it leads."""
        return self.leadership is None or self.leadership.leading

    @property
    def epoch(self) -> int | None:
        """The leader epoch this router leads in, which fences its writes (PostgreSQL); None on SQLite."""
        return None if self.leadership is None else self.leadership.epoch

    @property
    def leader(self) -> str:
        """The leading router's address as this one last read it (PostgreSQL); "" if unknown."""
        return "" if self.leadership is None else self.leadership.leader

    @property
    def role(self) -> str:
        """``"leader"`` or ``"standby"`` (``mr status``; docs/scale.md)."""
        return "leader" if self.leading else "standby"


SERVICES = web.AppKey("services", Services)
