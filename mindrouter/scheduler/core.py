"""The scheduler: queues jobs, decides what runs where, and accounts for what ran.

Theory of operation. Jobs wait in FIFO queues per user and *job class* (model,
modality, JSON mode), so one user's job for a busy model never blocks their job
for an idle one. For every class there is a heap of queue heads keyed by

    key = reference + apply_factor(effective_deficit - reference, factor) - wait_rate * submitted_at

which orders heads exactly as the seed's priority (plus ``wait_rate * waited``)
does at any instant, yet never changes as time passes. A key changes only when
its user's deficit, in-flight charge, weight or factor changes, or (for the few
heavy users) when the reference moves; then the user's heads are pushed again
and stale entries are dropped lazily. A decision therefore costs O(log n) in
queued jobs, plus a constant per candidate backend.

``dispatch(now)`` repeatedly takes the highest-priority head whose class has an
eligible backend with free capacity and routes it to that class's best-scoring
backend, until nothing more can start. The caller performs the I/O and reports
back with ``complete``, ``fail`` or ``cancel``; every one of them frees the slot.

Invariants: a job is in exactly one of queued / running / finished; a backend's
in-flight count equals the running jobs routed to it and never exceeds its
``max_concurrent``; ``check()`` asserts these.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .backend import Backend, BackendLoad
from .fairshare import FairShare, UserState
from .jobs import Dispatch, Expired, Job, Rejection
from .records import DecisionRecord, PriorityTerms
from .scoring import REASONS, RETRY_PENALTY, BackendScorer, ClassKey, live_rejections, static_rejections
from .settings import SchedulerSettings

__all__ = ["Scheduler", "UnknownUser"]


class UnknownUser(KeyError):
    """A job names a user the scheduler was never told about (call ``set_user`` first)."""


@dataclass(slots=True)
class _Running:
    job: Job
    backend_id: Hashable
    estimate: float
    started: float


@dataclass(slots=True)
class _ClassInfo:
    candidates: list[Hashable]
    """Backends that pass the static constraints, in registration order."""
    static_rejected: dict[Hashable, tuple[str, ...]]
    model_known: bool
    open: dict[Hashable, None] = field(default_factory=dict)
    """Candidates that can take a job now (an ordered set)."""
    closed: dict[Hashable, tuple[str, ...]] = field(default_factory=dict)
    """Candidates that cannot, with the reasons why."""


@dataclass(slots=True)
class _Heads:
    heap: list[tuple[float, int, Hashable, int]] = field(default_factory=list)
    live: int = 0
    """Number of (user, class) queues that are non-empty: the valid entries."""


class Scheduler:
    """Sans-I/O fair-share scheduler and router. Every method that depends on time takes ``now``."""

    def __init__(self, settings: SchedulerSettings | None = None) -> None:
        self.settings = settings = settings or SchedulerSettings()
        self.fair = FairShare(settings)
        self.scorer = BackendScorer(settings)
        self._backends: dict[Hashable, Backend] = {}
        self._loads: dict[Hashable, BackendLoad] = {}
        self._classes: dict[ClassKey, _ClassInfo] = {}
        self._backend_classes: dict[Hashable, list[tuple[ClassKey, _ClassInfo]]] = {}
        self._queues: dict[Hashable, dict[ClassKey, deque[Job]]] = {}
        self._heads: dict[ClassKey, _Heads] = {}
        self._queued: dict[str, Job] = {}
        self._running: dict[str, _Running] = {}
        self._deadlines: list[tuple[float, int, str]] = []
        self._excluded: dict[str, set[Hashable]] = {}
        self._attempts: dict[str, int] = {}
        self._seq = 0
        self.records: deque[DecisionRecord] = deque(maxlen=settings.max_decision_records)
        self._records_by_id: dict[str, DecisionRecord] = {}
        self._wait_rate = settings.wait_bonus_per_second

    # -- users -------------------------------------------------------------

    def set_user(self, user_id: Hashable, weight: float, *, name: str | None = None, group: str | None = None) -> None:
        """Add a user or change its weight, name or group."""
        if not (weight > 0 and math.isfinite(weight)):
            raise ValueError(f"weight {weight!r} must be a finite number greater than 0")
        user = self.fair.set_user(user_id, weight, name, group)
        self._rekey(user)

    def remove_user(self, user_id: Hashable) -> None:
        """Forget a user that has nothing queued or running."""
        user = self.fair.users.get(user_id)
        if user is None:
            return
        if user.queued or user.running:
            raise ValueError(f"user {user.name!r} still has jobs queued or running")
        del self.fair.users[user_id]
        self._queues.pop(user_id, None)

    def user(self, user_id: Hashable) -> UserState | None:
        return self.fair.users.get(user_id)

    # -- backends ----------------------------------------------------------

    def set_backend(self, backend: Backend) -> None:
        """Add a backend or replace what is known about it (configuration and telemetry)."""
        old = self._backends.get(backend.id)
        self._backends[backend.id] = backend
        self._loads.setdefault(backend.id, BackendLoad())
        self.scorer.invalidate(backend.id)
        if old is None or (old.models, old.modalities, old.model_modalities, old.supports_json) != (
            backend.models,
            backend.modalities,
            backend.model_modalities,
            backend.supports_json,
        ):
            self._clear_classes()
        else:
            self._reopen(backend.id)

    def remove_backend(self, backend_id: Hashable) -> None:
        """Forget a backend; jobs running there still end through complete/fail/cancel."""
        if self._backends.pop(backend_id, None) is not None:
            self._clear_classes()
            self.scorer.invalidate(backend_id)
        self._loads.pop(backend_id, None)

    def backend(self, backend_id: Hashable) -> Backend | None:
        return self._backends.get(backend_id)

    def load(self, backend_id: Hashable) -> BackendLoad | None:
        return self._loads.get(backend_id)

    @property
    def backends(self) -> dict[Hashable, Backend]:
        return dict(self._backends)

    def _clear_classes(self) -> None:
        self._classes.clear()
        self._backend_classes.clear()

    def _class(self, key: ClassKey) -> _ClassInfo:
        info = self._classes.get(key)
        if info is None:
            candidates: list[Hashable] = []
            rejected: dict[Hashable, tuple[str, ...]] = {}
            known = False
            for bid, backend in self._backends.items():
                reasons = static_rejections(backend, key)
                if key[0] in backend.models:
                    known = True
                if reasons:
                    rejected[bid] = reasons
                else:
                    candidates.append(bid)
            info = self._classes[key] = _ClassInfo(candidates, rejected, known)
            for bid in candidates:
                self._backend_classes.setdefault(bid, []).append((key, info))
                self._place(info, bid, key[0])
        return info

    def _place(self, info: _ClassInfo, bid: Hashable, model: str) -> None:
        """Put candidate ``bid`` in its class's open or closed set, by the live constraints."""
        reasons = live_rejections(self._backends[bid], self._loads[bid], model)
        if reasons:
            info.open.pop(bid, None)
            info.closed[bid] = reasons
        else:
            info.closed.pop(bid, None)
            info.open[bid] = None

    def _reopen(self, bid: Hashable) -> None:
        """Re-evaluate ``bid``'s live constraints in every class it serves."""
        for key, info in self._backend_classes.get(bid, ()):
            self._place(info, bid, key[0])

    # -- submitting --------------------------------------------------------

    def submit(self, job: Job, now: float) -> Rejection | None:
        """Queue ``job``, or say why it cannot be queued (``Rejection`` with its HTTP status)."""
        user = self.fair.users.get(job.user_id)
        if user is None:
            raise UnknownUser(job.user_id)
        if job.id in self._queued or job.id in self._running:
            raise ValueError(f"job {job.id!r} is already queued or running")
        key: ClassKey = (job.model, job.modality, job.json_mode)
        info = self._class(key)
        if not info.candidates:
            if not info.model_known:
                return Rejection(
                    job,
                    404,
                    "model_not_found",
                    f"model {job.model!r} is not served by any backend; `mr models` lists the models you can use",
                )
            what = (
                "JSON mode"
                if job.json_mode
                and not any(
                    self._backends[b].supports_json for b in self._backends if job.model in self._backends[b].models
                )
                else f"{job.modality.value} requests"
            )
            return Rejection(job, 400, "unsupported", f"no backend serving {job.model!r} supports {what}")
        if not any(
            self._backends[b].healthy and self._backends[b].enabled and not self._backends[b].draining
            for b in info.candidates
        ):
            return Rejection(
                job,
                503,
                "no_backend",
                f"every backend serving {job.model!r} is unhealthy, draining or disabled; try again shortly",
                retry_after=5.0,
            )
        if user.queued >= self.settings.max_queued_per_user:
            return Rejection(
                job,
                429,
                "queue_full",
                f"you already have {user.queued} requests queued, the most allowed; wait for some to finish",
            )
        if not self._queued:
            self.fair.contention_started(now)
        returning = user.queued == 0
        if returning:
            self.fair.activate(user, now)
        self._enqueue(user, key, job, front=False)
        self._seq += 1
        heapq.heappush(self._deadlines, (job.submitted_at + self.settings.queue_timeout, self._seq, job.id))
        return None

    def _enqueue(self, user: UserState, key: ClassKey, job: Job, *, front: bool) -> None:
        queues = self._queues.setdefault(user.id, {})
        queue = queues.get(key)
        if queue is None:
            queue = queues[key] = deque()
        was_empty = not queue
        if front:
            queue.appendleft(job)
        else:
            queue.append(job)
        self._queued[job.id] = job
        user.queued += 1
        if was_empty:
            self._heads.setdefault(key, _Heads()).live += 1
        if was_empty or front or user.queued == 1:
            self.fair.touch(user)
            self._rekey(user)

    def _rekey(self, user: UserState) -> None:
        """Push ``user``'s current heads with its current priority (older entries go stale)."""
        queues = self._queues.get(user.id)
        if not queues:
            return
        ref = self.fair.reference() if user.factor != 1.0 else 0.0
        base = ref + self.fair.priority(user, ref)
        rate = self._wait_rate
        for key, queue in queues.items():
            self._seq += 1
            heads = self._heads[key]
            heapq.heappush(heads.heap, (rate * queue[0].submitted_at - base, self._seq, user.id, user.version))
            if len(heads.heap) > 64 and len(heads.heap) > 4 * heads.live:
                self._compact(key)

    def _compact(self, key: ClassKey) -> None:
        heads = self._heads[key]
        users = self.fair.users
        heads.heap = [e for e in heads.heap if self._valid(e, key, users)]
        heapq.heapify(heads.heap)

    def _valid(self, entry: tuple[float, int, Hashable, int], key: ClassKey, users: dict[Hashable, UserState]) -> bool:
        user = users.get(entry[2])
        if user is None or user.version != entry[3]:
            return False
        queue = self._queues.get(user.id, {}).get(key)
        return bool(queue)

    def _rebuild_heads(self) -> None:
        for heads in self._heads.values():
            heads.heap.clear()
        for user in self.fair.users.values():
            self._rekey(user)

    # -- dispatching -------------------------------------------------------

    def dispatch(self, now: float) -> list[Dispatch]:
        """Start every job that can start now, best first; return what to send where."""
        fair = self.fair
        for uid in fair.refresh(now):
            self._rekey(fair.users[uid])
        if fair.maybe_shift():
            self._rebuild_heads()
        out: list[Dispatch] = []
        if not self._queued:
            return out
        blocked: set[ClassKey] = set()
        users = fair.users
        while self._queued:
            best_entry = None
            best_key: ClassKey | None = None
            for key, heads in self._heads.items():
                if key in blocked or not heads.live or not self._class(key).open:
                    continue
                heap = heads.heap
                while heap and not self._valid(heap[0], key, users):
                    heapq.heappop(heap)
                if heap and (best_entry is None or heap[0] < best_entry):
                    best_entry, best_key = heap[0], key
            if best_entry is None or best_key is None:
                break
            user = users[best_entry[2]]
            job = self._queues[user.id][best_key][0]
            routed = self._route(best_key, job)
            if routed is None:
                blocked.add(best_key)
                continue
            out.append(self._start(user, best_key, job, routed, now))
        return out

    def _route(
        self, key: ClassKey, job: Job
    ) -> tuple[Hashable, tuple[tuple[Any, ...], ...], dict[Hashable, tuple[str, ...]]] | None:
        info = self._class(key)
        model = key[0]
        backends = self._backends
        loads = self._loads
        scorer = self.scorer
        queue_points = self.settings.scores.short_queue
        excluded = self._excluded.get(job.id)
        # A retry waits for another live backend rather than go straight back to one
        # that just failed it; only with no alternative left does it try that one again.
        avoid = bool(excluded) and any(bid not in excluded and self._live(bid, model) for bid in info.candidates)
        rows: list[tuple[Any, ...]] = []
        best_id = None
        best_total = -math.inf
        for bid in info.open:
            if avoid and bid in excluded:  # type: ignore[operator]
                continue
            backend = backends[bid]
            load = loads[bid]
            terms = scorer.static_terms(backend, load, model)
            queue = queue_points / (1 + load.in_flight + backend.backend_waiting)
            penalty = RETRY_PENALTY if excluded and bid in excluded else 0.0
            total = terms[0] + queue - penalty
            rows.append((bid, total, terms, queue, penalty, backend.priority))
            if total > best_total:
                best_total, best_id = total, bid
        if best_id is None:
            return None
        return best_id, tuple(rows), dict(info.closed)

    def _live(self, bid: Hashable, model: str) -> bool:
        """Could ``bid`` take a job for ``model`` once a slot frees (healthy, enabled, not draining, fits)?"""
        backend = self._backends[bid]
        reasons = live_rejections(backend, self._loads[bid], model)
        return all(r == REASONS["capacity"] for r in reasons)

    def _start(
        self,
        user: UserState,
        key: ClassKey,
        job: Job,
        routed: tuple[Hashable, tuple[tuple[Any, ...], ...], dict[Hashable, tuple[str, ...]]],
        now: float,
    ) -> Dispatch:
        fair = self.fair
        backend_id, rows, live = routed
        reference = fair.reference()
        wait_bonus = self._wait_rate * (now - job.submitted_at)
        burst = fair.current_burst(now)
        terms = PriorityTerms(
            deficit=user.deficit,
            inflight_charge=user.inflight_charge,
            burst_credits=burst * user.weight,
            weight=user.weight,
            factor=user.factor,
            usage_fraction=fair.usage_fraction(user),
            reference=reference,
            wait_bonus=wait_bonus,
            priority=fair.priority(user, reference) + wait_bonus,
        )
        record = DecisionRecord(
            request_id=job.id,
            time=now,
            model=job.model,
            user_id=user.id,
            user_name=user.name,
            user_group=user.group,
            user_recent_usage=user.recent,
            queue_wait=now - job.submitted_at,
            selected_backend_id=backend_id,
            candidates=rows,
            static_rejected=self._class(key).static_rejected,
            live_rejected=live,
            terms=terms,
            attempt=self._attempts.get(job.id, 0) + 1,
        )
        self._remember(record)
        # Dequeue.
        queues = self._queues[user.id]
        queue = queues[key]
        queue.popleft()
        if not queue:
            del queues[key]
            self._heads[key].live -= 1
        del self._queued[job.id]
        user.queued -= 1
        if not self._queued:
            fair.queue_became_empty(now)
        # Charge the estimate while it runs.
        old_reference = reference
        estimate = fair.estimate(user, job.prompt_tokens, job.max_tokens)
        fair.charge_start(user, estimate)
        self._rekey(user)
        self._running[job.id] = _Running(job, backend_id, estimate, now)
        self._loads[backend_id].in_flight += 1
        self._reopen_after_load(backend_id)
        if fair.heavy and fair.reference() != old_reference:
            for uid in fair.heavy:
                heavy = fair.users.get(uid)
                if heavy is not None and heavy.queued and heavy is not user:
                    fair.touch(heavy)
                    self._rekey(heavy)
        return Dispatch(job, backend_id, record)

    def _reopen_after_load(self, bid: Hashable) -> None:
        """A slot on ``bid`` was taken or freed: only capacity can have changed."""
        backend = self._backends.get(bid)
        if backend is None:
            return
        full = self._loads[bid].in_flight >= backend.max_concurrent
        for key, info in self._backend_classes.get(bid, ()):
            if full or bid in info.closed:
                self._place(info, bid, key[0])

    def _remember(self, record: DecisionRecord) -> None:
        records = self.records
        if len(records) == records.maxlen:
            old = records.popleft()
            if self._records_by_id.get(old.request_id) is old:
                del self._records_by_id[old.request_id]
        records.append(record)
        self._records_by_id[record.request_id] = record

    def record(self, request_id: str) -> DecisionRecord | None:
        """The latest decision made for ``request_id``, if still kept."""
        return self._records_by_id.get(request_id)

    # -- outcomes ----------------------------------------------------------

    def complete(
        self,
        job_id: str,
        now: float,
        *,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        latency: float | None = None,
        duration: float | None = None,
    ) -> bool:
        """A running job finished. Token counts are the backend's; None means it reported none.

        Args:
            latency: seconds to the first byte (streaming) or the whole answer, for the latency score.
            duration: seconds the generation took, for the throughput score.

        Returns False when the job was not running (already ended).
        """
        running = self._running.pop(job_id, None)
        if running is None:
            return False
        job = running.job
        estimated = prompt_tokens is None and completion_tokens is None
        prompt = job.prompt_tokens if prompt_tokens is None else prompt_tokens
        if completion_tokens is None:
            completion = running.estimate - self.settings.cost(prompt, 0) if estimated else 0
            completion = (
                max(0.0, completion / self.settings.completion_token_cost)
                if self.settings.completion_token_cost
                else 0.0
            )
        else:
            completion = completion_tokens
        self._end(running, now, prompt, completion, None if estimated else completion_tokens)
        load = self._loads.get(running.backend_id)
        if load is not None:
            load.completed += 1
            alpha = self.settings.latency_ema_alpha
            if latency is not None and latency >= 0:
                load.latency_ema = (
                    latency if load.latency_ema is None else load.latency_ema + alpha * (latency - load.latency_ema)
                )
            if duration and duration > 0 and completion_tokens:
                tps = completion_tokens / duration
                load.tokens_per_second = (
                    tps
                    if load.tokens_per_second is None
                    else load.tokens_per_second + alpha * (tps - load.tokens_per_second)
                )
            self.scorer.invalidate(running.backend_id)
        self._excluded.pop(job_id, None)
        self._attempts.pop(job_id, None)
        return True

    def fail(self, job_id: str, now: float, *, retry: bool, prompt_tokens: int = 0, completion_tokens: int = 0) -> bool:
        """A running job failed on its backend.

        With ``retry`` (the failure came before the first byte), the job goes back
        to the front of its queue, keeping its place in time; it then waits for
        another live backend rather than return to one that failed it, and goes
        back to a failed one only when no other is live. Tokens already
        delivered are charged.

        Returns True when the job was queued again.
        """
        running = self._running.pop(job_id, None)
        if running is None:
            return False
        self._end(running, now, prompt_tokens, completion_tokens, None)
        load = self._loads.get(running.backend_id)
        if load is not None:
            load.failed += 1
        job = running.job
        user = self.fair.users.get(job.user_id)
        if not retry or user is None:
            self._excluded.pop(job_id, None)
            self._attempts.pop(job_id, None)
            return False
        self._excluded.setdefault(job_id, set()).add(running.backend_id)
        self._attempts[job_id] = self._attempts.get(job_id, 0) + 1
        if not self._queued:
            self.fair.contention_started(now)
        self._enqueue(user, (job.model, job.modality, job.json_mode), job, front=True)
        return True

    def cancel(self, job_id: str, now: float, *, prompt_tokens: int | None = None, completion_tokens: int = 0) -> bool:
        """The client went away: drop a queued job, or end a running one (charging what it used).

        Returns False when the job was neither queued nor running.
        """
        job = self._queued.get(job_id)
        if job is not None:
            self._unqueue(job, now)
            self._excluded.pop(job_id, None)
            self._attempts.pop(job_id, None)
            return True
        running = self._running.pop(job_id, None)
        if running is None:
            return False
        prompt = running.job.prompt_tokens if prompt_tokens is None else prompt_tokens
        self._end(running, now, prompt, completion_tokens, None)
        self._excluded.pop(job_id, None)
        self._attempts.pop(job_id, None)
        return True

    def _end(
        self, running: _Running, now: float, prompt: float, completion: float, completion_tokens: float | None
    ) -> None:
        load = self._loads.get(running.backend_id)
        if load is not None:
            load.in_flight -= 1
            self._reopen_after_load(running.backend_id)
        user = self.fair.users.get(running.job.user_id)
        if user is not None:
            self.fair.charge_end(
                user,
                running.estimate,
                self.settings.cost(prompt, completion),
                now,
                prompt + completion,
                completion_tokens,
            )
            self._rekey(user)

    def _unqueue(self, job: Job, now: float) -> None:
        user = self.fair.users[job.user_id]
        key: ClassKey = (job.model, job.modality, job.json_mode)
        queues = self._queues[user.id]
        queue = queues[key]
        for index, queued in enumerate(queue):
            if queued is job:
                del queue[index]
                break
        if not queue:
            del queues[key]
            self._heads[key].live -= 1
        del self._queued[job.id]
        user.queued -= 1
        if not self._queued:
            self.fair.queue_became_empty(now)
        self.fair.touch(user)
        self._rekey(user)

    def expire(self, now: float) -> list[Expired]:
        """Remove and return the jobs that have waited past ``queue_timeout``."""
        out: list[Expired] = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, _, job_id = heapq.heappop(deadlines)
            job = self._queued.get(job_id)
            if job is not None:
                self._unqueue(job, now)
                self._excluded.pop(job_id, None)
                self._attempts.pop(job_id, None)
                out.append(Expired(job, now - job.submitted_at))
        return out

    def next_deadline(self) -> float | None:
        """When ``expire`` will next have something to do, if ever."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][2] not in self._queued:
            heapq.heappop(deadlines)
        return deadlines[0][0] if deadlines else None

    # -- reading -----------------------------------------------------------

    def is_queued(self, job_id: str) -> bool:
        return job_id in self._queued

    def is_running(self, job_id: str) -> bool:
        return job_id in self._running

    @property
    def queued_count(self) -> int:
        return len(self._queued)

    @property
    def running_count(self) -> int:
        return len(self._running)

    def queue_position(self, job_id: str) -> tuple[int, int] | None:
        """(1-based place among its user's jobs of the same kind, jobs queued in all), or None."""
        job = self._queued.get(job_id)
        if job is None:
            return None
        queue = self._queues[job.user_id][(job.model, job.modality, job.json_mode)]
        for index, queued in enumerate(queue):
            if queued is job:
                return index + 1, len(self._queued)
        return None  # pragma: no cover - a queued job is always in its queue

    def queued_jobs(self) -> Iterable[Job]:
        return self._queued.values()

    def running_jobs(self) -> Iterable[tuple[Job, Hashable]]:
        return ((r.job, r.backend_id) for r in self._running.values())

    def snapshot(self, now: float) -> dict[str, Any]:
        """Queue statistics in the seed's shape (``mr queue --json``)."""
        by_user: dict[str, int] = {}
        by_model: dict[str, int] = {}
        total_wait = 0.0
        for job in self._queued.values():
            by_user[str(job.user_id)] = by_user.get(str(job.user_id), 0) + 1
            by_model[job.model] = by_model.get(job.model, 0) + 1
            total_wait += now - job.submitted_at
        count = len(self._queued)
        fair = self.fair
        return {
            "queue": {
                "total": count,
                "by_user": by_user,
                "by_model": by_model,
                "average_wait_seconds": round(total_wait / count, 3) if count else 0.0,
                "running": len(self._running),
            },
            "fair_share": {
                "total_users": len(fair.users),
                "global_recent_tokens": fair.global_recent,
                "user_stats": self.user_stats(now),
            },
        }

    def user_stats(self, now: float) -> list[dict[str, Any]]:
        """Per-user fair-share state (``mr share``); deficits are shown relative to the reference."""
        fair = self.fair
        burst = fair.current_burst(now)
        total_weight = sum(u.weight for u in fair.users.values()) or 1.0
        return [
            {
                "user_id": u.id,
                "name": u.name,
                "group": u.group,
                "weight": u.weight,
                "normalized_share": u.weight / total_weight,
                "deficit": round(u.deficit, 3),
                "inflight_charge": round(u.inflight_charge, 3),
                "burst_credits": round(burst * u.weight, 3),
                "recent_tokens": u.recent,
                "usage_fraction": round(fair.usage_fraction(u), 4),
                "factor": u.factor,
                "queued": u.queued,
                "running": u.running,
            }
            for u in fair.users.values()
        ]

    def check(self) -> None:
        """Assert the invariants (for tests)."""
        self.fair.check()
        per_backend: dict[Hashable, int] = {}
        for job_id, running in self._running.items():
            assert job_id not in self._queued, job_id
            per_backend[running.backend_id] = per_backend.get(running.backend_id, 0) + 1
        for bid, load in self._loads.items():
            assert load.in_flight == per_backend.get(bid, 0), (bid, load.in_flight, per_backend.get(bid, 0))
            backend = self._backends.get(bid)
            if backend is not None:
                assert load.in_flight <= backend.max_concurrent or not backend.enabled, bid
        queued = sum(len(q) for qs in self._queues.values() for q in qs.values())
        assert queued == len(self._queued)
        for user in self.fair.users.values():
            assert user.queued == sum(len(q) for q in self._queues.get(user.id, {}).values())
