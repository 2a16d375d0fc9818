"""Backends as the daemon runs them: adapters, probes, circuit breakers, drain, what each lacks.

Each backend has one poll task that probes it at once when added and then every
``poll_interval``; one that is down is probed again after ``reprobe_interval``
(about 0.5 s), doubling up to ``poll_interval``, so a backend that recovers is
back within about a second rather than a whole poll later. What a probe (and
the GPU readings for the backend's GPUs) says is folded into a fresh
``scheduler.Backend`` snapshot (``snapshot.py``) and handed to the core; the
core's own counters (in flight, latency, tokens/s) stay in the core. A backend
is taken out by ``probe_failures`` failed probes in a row, never by one. The
circuit breaker (``breaker.py``) counts only the backend's own faults. A
backend that answered "not supported" for a model and modality (llama-server
without ``--embeddings``) lacks it: its snapshot stops offering that modality,
so routing sends such requests to another backend with the model, until the
backend is seen down and back (a restart may have changed its flags).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import aiohttp

from ...backends import Adapter, Budget, Fault, Probe, make_adapter, model_key
from ...config import BackendSettings
from ...scheduler import Modality, Scheduler
from ...store import Store
from ...tasks import stop
from .breaker import Breaker
from .entry import Entry
from .snapshot import GpuReading, VramEstimate, backend_snapshot

__all__ = ["Registry"]

log = logging.getLogger(__name__)

#: Returns (free bytes, total bytes, utilization 0..1) for a backend's GPUs, or None when unknown.
GpuLookup = Callable[[Any], GpuReading | None]


AdapterFactory = Callable[[Any], Adapter]
"""A backend's adapter from its store row (``engine``, ``url``, ``name``...)."""


class Registry:
    def __init__(
        self,
        scheduler: Scheduler,
        store: Store,
        session: aiohttp.ClientSession,
        settings: BackendSettings,
        *,
        on_change: Callable[[], None],
        gpu_lookup: GpuLookup | None = None,
        vram_estimate: VramEstimate | None = None,
        clock: Callable[[], float] = time.monotonic,
        adapters: AdapterFactory | None = None,
    ) -> None:
        """``adapters`` builds a backend's adapter from its row (default: the engine's, over ``session``);
        tests pass one that answers in-process."""
        self.scheduler = scheduler
        self.store = store
        self.session = session
        self.settings = settings
        self.budget = Budget(settings.max_held_answer_bytes)
        """The bytes all whole answers may hold at once, shared by every backend's adapter."""
        self.on_change = on_change
        self.gpu_lookup = gpu_lookup
        self.vram_estimate = vram_estimate
        self.clock = clock
        self.adapters = adapters or self._engine_adapter
        self.entries: dict[int, Entry] = {}
        self.probing = True
        """False on a standby router (process/roles.py): its entries mirror the store, and nothing is probed,
        drained or disabled until ``probe_all``."""

    # -- lifecycle ---------------------------------------------------------

    async def start(self, first_probe_timeout: float = 5.0) -> None:
        for row in self.store.list_backends():
            self.add(row)
        await self.first_probes(first_probe_timeout)

    async def first_probes(self, timeout: float) -> None:
        """Wait, ``timeout`` seconds at most, until every backend has been probed once (none while not probing)."""
        if self.entries and self.probing:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(e.probed.wait() for e in self.entries.values())), timeout)

    async def stop(self) -> None:
        for entry in self.entries.values():
            if entry.task is not None:
                await stop(entry.task)

    def _engine_adapter(self, row: Any) -> Adapter:
        return make_adapter(row.engine, row.url, self.session, self.settings, budget=self.budget)

    def add(self, row: Any) -> Entry:
        """Start tracking (and probing) a backend; one already tracked only takes the new row."""
        if row.id in self.entries:
            self.update_row(row)
            return self.entries[row.id]
        adapter = self.adapters(row)
        entry = Entry(row, adapter, Breaker(self.settings), lambda: self.clock())
        self.entries[row.id] = entry
        self._publish(entry)
        if self.probing:
            entry.task = asyncio.create_task(self._poll(entry), name=f"probe-{row.name}")
        return entry

    async def sync(self, rows: Iterable[Any]) -> None:
        """Follow the store's backends: drop the removed, add the new, and give the others their new rows
        (another server or another engine gets a client of its own)."""
        latest = {row.id: row for row in rows}
        for backend_id in set(self.entries) - set(latest):
            await self.remove(backend_id)
        for row in latest.values():
            entry = self.entries.get(row.id)
            if entry is not None and (entry.row.url, entry.row.engine) != (row.url, row.engine):
                await self.remove(row.id)
            self.add(row)

    def inherit(self, open_streams: Mapping[int, int]) -> None:
        """A new leader: hold every slot busy until the backend's first probe. Then the gauges (vLLM,
        llama-server) say how many the old leader's generations still hold; without gauges (Ollama,
        plain OpenAI-compatible), the slots its open streams had there (``open_streams``, by backend
        id) stay busy for ``takeover_hold_seconds``, about one long generation."""
        for entry in self.entries.values():
            entry.inherited = entry.row.max_concurrent
            entry.inherited_streams = min(entry.inherited, open_streams.get(entry.row.id, 0))
            self._publish(entry)
        asyncio.get_running_loop().call_later(self.settings.takeover_hold_seconds, self._end_hold)

    def _end_hold(self) -> None:
        """One generation time after a takeover: the old leader's streams on backends without gauges are over."""
        for entry in self.entries.values():
            entry.inherited_streams = 0
            if entry.inherited and entry.probe is not None and entry.probe.running is None:
                entry.inherited = 0
                self._publish(entry)

    def _count_inherited(self, entry: Entry, probe: Probe) -> None:
        """What the engine runs beyond this router's own requests is the old leader's, and can only end."""
        if not entry.inherited or not probe.healthy:
            return
        if probe.running is None:  # no gauge: the old leader's streams, until the hold ends
            entry.inherited = min(entry.inherited, entry.inherited_streams)
            return
        load = self.scheduler.load(entry.row.id)
        others = probe.running - (load.in_flight if load else 0)
        entry.inherited = max(0, min(entry.inherited, others))

    def probe_all(self) -> None:
        """Start probing every backend (a standby that now leads)."""
        self.probing = True
        for entry in self.entries.values():
            if entry.task is None:
                entry.task = asyncio.create_task(self._poll(entry), name=f"probe-{entry.row.name}")

    async def remove(self, backend_id: int) -> None:
        entry = self.entries.pop(backend_id, None)
        if entry is None:
            return
        if entry.task is not None:
            await stop(entry.task)
        self.scheduler.remove_backend(backend_id)
        self.on_change()

    def update_row(self, row: Any) -> None:
        entry = self.entries.get(row.id)
        if entry is not None:
            entry.row = row
            self._publish(entry)

    def adapter(self, backend_id: int) -> Adapter | None:
        entry = self.entries.get(backend_id)
        return entry.adapter if entry is not None else None

    def by_name(self, name: str) -> Entry | None:
        return next((e for e in self.entries.values() if e.row.name == name), None)

    # -- probing -----------------------------------------------------------

    async def _poll(self, entry: Entry) -> None:
        backoff = self.settings.reprobe_interval
        while True:
            await self.probe(entry)
            if self.healthy(entry):
                backoff, delay = self.settings.reprobe_interval, self.settings.poll_interval
            else:  # down: look again soon, backing off, so a recovered backend is back within about a second
                delay = entry.breaker.next_probe(self.clock(), backoff)
                backoff = min(2 * backoff, self.settings.poll_interval)
            entry.wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(entry.wake.wait(), delay)
            gap = entry.probed_at + self.settings.reprobe_interval - self.clock()
            if gap > 0:  # woken by failing requests: at most one probe every reprobe_interval
                await asyncio.sleep(gap)

    async def probe(self, entry: Entry) -> None:
        try:
            probe = await entry.adapter.poll()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an adapter bug must not kill the poller
            log.exception("backend=%s probe crashed", entry.row.name)
            probe = Probe(healthy=False, error=f"probe failed: {exc}")
        was_healthy = self.healthy(entry)
        entry.probe = probe
        now = entry.probed_at = self.clock()
        if probe.healthy:
            if entry.known is None or entry.probe_streak >= self.settings.probe_failures:
                entry.said.clear()
                entry.lacks.clear()  # seen down and back (or new): it may have been restarted with other flags
            entry.known = probe
            entry.error = None
            entry.probe_streak = 0
            if entry.breaker.probe_passed(now):
                log.info("backend=%s circuit closed after a successful probe", entry.row.name)
        else:
            entry.error = probe.error or "probe failed"
            entry.probe_streak += 1
            if entry.breaker.probe_failed(now):
                self._opened(entry)
        if was_healthy != self.healthy(entry):
            if was_healthy:
                entry.wake.set()  # a probe from outside the poll loop found it down: start backing off now
            log.info(
                "backend=%s is now %s%s",
                entry.row.name,
                "healthy" if self.healthy(entry) else "unhealthy",
                "" if self.healthy(entry) else f" ({entry.error})",
            )
        self._count_inherited(entry, probe)
        self._disable_if_drained(entry)
        self._publish(entry)
        entry.probed.set()

    def _opened(self, entry: Entry) -> None:
        log.warning(
            "backend=%s circuit opened after %d failures within %.0f s (%s)",
            entry.row.name,
            entry.failures,
            self.settings.circuit_window,
            entry.error,
        )

    def request_failed(self, backend_id: Hashable, error: str, *, fault: Fault = Fault.DOWN, user: Any = None) -> None:
        """A request failed on this backend; ``breaker.py`` decides whether ``fault`` counts against it.

        Args:
            fault: whose fault: DOWN always counts, ERROR once more than one user met one, the rest never.
            user: whose request it was.
        """
        entry = self.entries.get(backend_id)  # type: ignore[call-overload]
        if entry is None or fault in (Fault.UNSUPPORTED, Fault.CUT):
            return
        entry.error = error
        if entry.breaker.record(fault, user, self.clock()):
            self._opened(entry)
        self._publish(entry)
        entry.wake.set()  # probe soon: is it failing for everyone, or for this one request?

    def request_succeeded(self, backend_id: Hashable) -> None:
        entry = self.entries.get(backend_id)  # type: ignore[call-overload]
        if entry is not None:
            entry.breaker.served()

    def lacks(self, backend_id: Hashable, model: str, modality: Modality, said: str) -> None:
        """The backend answered "not supported" (``said``) to ``modality`` on ``model``: route such requests
        elsewhere."""
        entry = self.entries.get(backend_id)  # type: ignore[call-overload]
        if entry is None:
            return
        key = model_key(model)
        entry.said[key, modality] = said
        had = entry.lacks.get(key, frozenset())
        if modality not in had:
            entry.lacks[key] = had | {modality}
            log.info(
                "backend=%s does not serve %s requests for %s; routing them elsewhere",
                entry.row.name,
                modality.value,
                key,
            )
            self._publish(entry)

    def lacking(self, model: str, modality: Modality) -> str:
        """What the backends serving ``model`` said when they lacked ``modality`` ("" if none did)."""
        key = model_key(model)
        return "; ".join(
            f"backend {entry.row.name!r} said: {entry.said[key, modality]}"
            for entry in self.entries.values()
            if (key, modality) in entry.said
        )

    def serves(self, model: str, modality: Modality, *, besides: Any = ()) -> bool:
        """Another backend (not in ``besides``) offers ``modality`` for ``model``, as far as is known."""
        key = model_key(model)
        for bid, entry in self.entries.items():
            if bid in besides or entry.row.state != "enabled" or not self.healthy(entry):
                continue
            core = self.scheduler.backend(bid)
            if core is not None and key in core.models and modality in core.model_modalities.get(key, core.modalities):
                return True
        return False

    def released(self, backend_id: int) -> None:
        """A slot on this backend was freed: a draining backend may now be idle."""
        entry = self.entries.get(backend_id)
        if entry is not None and entry.row.state == "draining" and self._disable_if_drained(entry):
            self._publish(entry)

    def _disable_if_drained(self, entry: Entry) -> bool:
        load = self.scheduler.load(entry.row.id)
        if self.probing and entry.row.state == "draining" and (load is None or load.in_flight == 0):
            entry.row = self.store.set_backend_state(entry.row.name, "disabled")
            log.info("backend=%s is drained: idle, and takes no new requests until `mr backend enable`", entry.row.name)
            return True
        return False

    # -- into the core -----------------------------------------------------

    def healthy(self, entry: Entry) -> bool:
        """Seen healthy, fewer than ``probe_failures`` failed probes since, and the circuit closed."""
        return entry.known is not None and entry.probe_streak < self.settings.probe_failures and not entry.circuit_open

    def _publish(self, entry: Entry) -> None:
        row = entry.row
        probe = entry.probe if entry.probe is None or entry.probe.healthy or entry.known is None else entry.known
        gpu = self.gpu_lookup(row) if self.gpu_lookup is not None else None
        self.scheduler.set_backend(
            backend_snapshot(
                row, probe, entry.lacks, gpu, self.vram_estimate, healthy=self.healthy(entry), inherited=entry.inherited
            )
        )
        self.on_change()

    def republish_all(self) -> None:
        """GPU readings changed: refresh every backend's snapshot."""
        for entry in self.entries.values():
            self._publish(entry)

    # -- reading -----------------------------------------------------------

    def status(self, entry: Entry) -> str:
        """What people see: a backend is only disabled by draining it, so the stored "disabled" reads "drained"."""
        state = entry.row.state
        if state == "disabled":
            return "drained"
        if state == "draining":
            return state
        return "healthy" if self.healthy(entry) else "unhealthy"

    def row_dict(self, entry: Entry) -> dict[str, Any]:
        row, probe = entry.row, entry.probe
        load = self.scheduler.load(row.id)
        core = self.scheduler.backend(row.id)
        return {
            "id": row.id,
            "name": row.name,
            "url": row.url,
            "engine": row.engine,
            "status": self.status(entry),
            "healthy": self.healthy(entry),
            "in_flight": load.in_flight if load else 0,
            "max_concurrent": row.max_concurrent,
            "models": sorted(probe.models) if probe else [],
            "loaded_models": sorted(probe.loaded_models) if probe else [],
            "latency_ema": load.latency_ema if load else None,
            "tokens_per_second": load.tokens_per_second if load else None,
            "model_speeds": {
                model: {"decode": speed.decode, "prefill": speed.prefill, "answers": speed.answers}
                for model, speed in sorted(load.speeds.items())
            }
            if load
            else {},
            "parallel": row.parallel,
            "max_loaded": row.max_loaded,
            "priority": row.priority,
            "gpus": list(row.gpus),
            "node": row.node or None,
            "error": entry.error,
            "utilization": core.utilization if core else None,
            "vram_free": core.vram_free if core else None,
            "vram_total": core.vram_total if core else None,
            "waiting": probe.waiting if probe else None,
            "completed": load.completed if load else 0,
            "failed": load.failed if load else 0,
        }
