"""GET /metrics in Prometheus text format, read from live state at scrape time; GET /health.

A custom collector costs nothing per request; it never exposes prompts,
completions or keys, only counts and gauges.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..edge.services import SERVICES
from .auth import bearer_is

__all__ = ["setup_metrics"]


class _Collector(Collector):
    def __init__(self, app: web.Application, per_user: bool) -> None:
        self.app = app
        self.per_user = per_user

    def collect(self) -> Iterator[Any]:
        app = self.app
        stats, scheduler, registry = app[SERVICES].stats, app[SERVICES].scheduler, app[SERVICES].registry
        yield CounterMetricFamily("mindrouter_requests", "Requests answered by a backend.", value=stats.requests_total)
        tokens = CounterMetricFamily("mindrouter_tokens", "Tokens reported by backends.", labels=["kind"])
        tokens.add_metric(["prompt"], stats.prompt_tokens_total)
        tokens.add_metric(["completion"], stats.completion_tokens_total)
        yield tokens
        errors = CounterMetricFamily(
            "mindrouter_errors",
            'Error answers, by the status the client got ("stream": ended by an error after its first byte).',
            labels=["status"],
        )
        for status, count in sorted(stats.errors.items()):
            errors.add_metric([status], count)
        yield errors
        yield CounterMetricFamily("mindrouter_cancelled", "Requests whose client went away.", value=stats.cancelled)
        yield CounterMetricFamily(
            "mindrouter_queue_timeouts",
            "Requests that waited past the queue timeout.",
            value=app[SERVICES].dispatcher.expired_total,
        )
        yield GaugeMetricFamily(
            "mindrouter_queue_depth", "Requests waiting in the scheduler's queue.", value=scheduler.queued_count
        )
        yield GaugeMetricFamily("mindrouter_running", "Requests in flight at backends.", value=scheduler.running_count)
        in_flight = GaugeMetricFamily(
            "mindrouter_backend_in_flight", "Requests in flight per backend.", labels=["backend"]
        )
        healthy = GaugeMetricFamily("mindrouter_backend_healthy", "1 when the backend is healthy.", labels=["backend"])
        latency = GaugeMetricFamily(
            "mindrouter_backend_latency_seconds", "Moving average of response latency.", labels=["backend"]
        )
        for entry in registry.entries.values():
            name = entry.row.name
            load = scheduler.load(entry.row.id)
            in_flight.add_metric([name], load.in_flight if load else 0)
            healthy.add_metric([name], 1.0 if registry.healthy(entry) else 0.0)
            if load is not None and load.latency_ema is not None:
                latency.add_metric([name], load.latency_ema)
        yield in_flight
        yield healthy
        yield latency
        if not self.per_user:
            return
        recent = GaugeMetricFamily(
            "mindrouter_user_recent_tokens", "Tokens per user in the fairness window.", labels=["user", "group"]
        )
        for user in scheduler.share(self.app[SERVICES].dispatcher.clock(), active=True).users:
            recent.add_metric([user.name, user.group or ""], user.recent_tokens)
        yield recent


def setup_metrics(app: web.Application) -> None:
    """``GET /metrics``: counts for anyone who can reach the port; per-user series only to a trusted caller.

    Trusted: the admin socket, or a caller with ``[server] metrics_key`` or ``admin_key``. Listening
    on loopback is no trust: on a shared workstation every local account reaches 127.0.0.1, and who
    uses what is nobody else's business. A wrong key counts as a guess (``guesses.py``).
    """
    full, counts = CollectorRegistry(auto_describe=False), CollectorRegistry(auto_describe=False)
    full.register(_Collector(app, per_user=True))
    counts.register(_Collector(app, per_user=False))
    server = app[SERVICES].config.server

    def trusted(request: web.Request) -> bool:
        if isinstance(request.transport.get_extra_info("sockname") if request.transport else None, str):
            return True
        if "Authorization" not in request.headers:
            return False
        guesses = request.app[SERVICES].auth.guesses
        if guesses.wait(request.remote) > 0:  # a key that may be a guess is not checked: counts only
            return False
        if any(key and bearer_is(request, key) for key in (server.metrics_key, server.admin_key)):
            return True
        guesses.wrong(request.remote)
        return False

    async def handle(request: web.Request) -> web.Response:
        body = generate_latest(full if trusted(request) else counts)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def health(request: web.Request) -> web.Response:
        """For load balancers and systemd: 200 while serving (a standby: 503), and nothing about the pool."""
        if not request.app[SERVICES].leading:
            return web.Response(status=503, text="standby: another router leads this pool\n")
        return web.Response(text="ok\n")

    app.router.add_get("/metrics", handle)
    app.router.add_get("/health", health)
