"""A fake daemon for the CLI tests, and the tests of the admin client against it.

``FakeDaemon`` serves docs/admin-api.md from memory with aiohttp on a Unix
socket, on an event loop in a background thread, so the synchronous ``mr``
commands run by typer's ``CliRunner`` (or a subprocess, or tmux) can reach it
exactly as they reach ``mr serve``. It keeps every request it got, so a test
can check that refused input sent nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from typer.testing import CliRunner

from mindrouter.cli import app as mr_app
from mindrouter.cli._client import AdminClient
from mindrouter.errors import DaemonUnreachable, MindRouterError, RequestError

NOW = 1_767_000_000.0


def decision(
    request_id: str, user: str = "alice", group: str = "faculty", backend: int = 1, wall: float = NOW, **extra: Any
) -> dict[str, Any]:
    """A decision record in the daemon's shape (DESIGN §7 plus the added fields)."""
    record = {
        "request_id": request_id,
        "selected_backend_id": backend,
        "candidate_backends": [1, 2],
        "scores": {"1": -4.5, "2": -20.25},
        "user_deficit": -1000.0,
        "user_weight": 3.0,
        "user_group": group,
        "user_recent_usage": 30000,
        "user_recent_units": 52000,
        "user_id": 7,
        "user": user,
        "model": "llama3.2",
        "time": 12.5,
        "queue_wait": 1.25,
        "attempt": 1,
        "outcome": "ok",
        "reason": None,
        "status": 200,
        "priority": {
            "deficit": -1000.0,
            "inflight_charge": 200.0,
            "burst_credits": 30.0,
            "weight": 3.0,
            "factor": 0.8,
            "usage_fraction": 0.6,
            "reference": -100.0,
            "wait_bonus": 0.0625,
            "priority": -300.1,
        },
        "score_components": {
            "1": {
                "score": -4.5,
                "start": 0.0,
                "prefill": 0.5,
                "decode": 4.0,
                "finish": 4.5,
                "evicts": [],
                "eviction": 0.0,
                "decode_rate": 64.0,
                "streams": 1,
                "learned": True,
                "priority": 0.0,
                "penalty": 0.0,
            },
            "2": {
                "score": -20.25,
                "start": 12.5,
                "prefill": 0.75,
                "decode": 7.0,
                "finish": 20.25,
                "evicts": ["coder"],
                "eviction": 0.0,
                "decode_rate": 36.5,
                "streams": 0,
                "learned": False,
                "priority": 0.0,
                "penalty": 0.0,
            },
        },
        "rejected": {"3": ["model not available", "unhealthy"]},
        "wall_time": wall,
        "selected_backend": {1: "ws1", 2: "ws2"}.get(backend, f"b{backend}"),
    }
    record.update(extra)
    return record


def _backend_row(id_: int, name: str, url: str, engine: str, **kw: Any) -> dict[str, Any]:
    row = {
        "id": id_,
        "name": name,
        "url": url,
        "engine": engine,
        "status": "healthy",
        "healthy": True,
        "in_flight": 0,
        "max_concurrent": 4,
        "models": ["llama3.2", "mistral"],
        "loaded_models": ["llama3.2"],
        "latency_ema": 0.42,
        "tokens_per_second": 55.5,
        "priority": 0.0,
        "gpus": [],
        "node": None,
        "error": None,
        "utilization": 0.35,
        "vram_free": 8 << 30,
        "vram_total": 24 << 30,
        "waiting": 0,
    }
    row.update(kw)
    return row


class FakeDaemon:
    """The admin API from memory (docs/admin-api.md), with the daemon's error shapes."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.requests: list[tuple[str, str, Any]] = []
        self.stream_records: list[dict[str, Any]] = []
        self.stream_hold = 0.0
        """Seconds the decision stream stays open after its records (then closes)."""
        self.reset()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.stopping = False

    # -- state ----------------------------------------------------------------------

    def reset(self) -> None:
        self.requests.clear()
        self.generation = getattr(self, "generation", 0) + 1  # ends streams held open by an earlier test
        self.stream_records = []
        self.stream_hold = 0.0
        self.groups = {"student": 1.0, "staff": 2.0, "faculty": 3.0, "admin": 10.0}
        self.users = {
            "alice": {"group": "faculty", "weight_override": None, "keys": 1},
            "bob": {"group": "student", "weight_override": 2.0, "keys": 0},
        }
        self.backends = {
            "ws1": _backend_row(1, "ws1", "http://ws1.lab:11434", "ollama", in_flight=2, gpus=[0]),
            "ws2": _backend_row(
                2,
                "ws2",
                "http://ws2.lab:8000",
                "vllm",
                status="draining",
                max_concurrent=8,
                loaded_models=[],
                utilization=None,
                vram_free=None,
                vram_total=None,
                latency_ema=None,
                tokens_per_second=None,
            ),
            "old": _backend_row(
                3,
                "old",
                "http://old.lab:8080",
                "llamacpp",
                status="unhealthy",
                healthy=False,
                error="connection refused",
                models=[],
                loaded_models=[],
                in_flight=0,
            ),
        }
        self.next_id = 4
        self.models = [
            {"model": "mistral", "backends": ["ws1", "ws2"], "loaded_on": []},
            {"model": "llama3.2", "backends": ["ws1", "ws2"], "loaded_on": ["ws1"]},
        ]
        self.usage: dict[str, Any] | None = None
        """``GET /admin/usage``'s answer, when a test sets one."""
        self.decisions = [
            decision("req-1", wall=NOW - 5),
            decision(
                "req-2",
                user="bob",
                group="student",
                backend=2,
                wall=NOW - 2,
                priority={"priority": 12.5},
                score_components={},
                rejected={},
            ),
        ]

    def user_row(self, name: str) -> dict[str, Any]:
        u = self.users[name]
        weight = u["weight_override"] if u["weight_override"] is not None else self.groups[u["group"]]
        return {
            "name": name,
            "group": u["group"],
            "weight_override": u["weight_override"],
            "weight": weight,
            "keys": u["keys"],
            **({"proxy_for": u["proxy_for"]} if u.get("proxy_for") else {}),
            "queued": 1 if name == "alice" else 0,
            "running": 1 if name == "bob" else 0,
            "recent_tokens": 30000 if name == "alice" else 12000,
        }

    def group_row(self, name: str) -> dict[str, Any]:
        return {
            "name": name,
            "scheduler_weight": self.groups[name],
            "users": sum(1 for u in self.users.values() if u["group"] == name),
        }

    def status(self) -> dict[str, Any]:
        return {
            "version": "0.1.0",
            "uptime_seconds": 3725.0,
            "backends": len(self.backends),
            "backends_healthy": sum(1 for b in self.backends.values() if b["status"] == "healthy"),
            "queue_total": 3,
            "running": 2,
            "users": len(self.users),
            "requests_total": 1234,
            "tokens_total": 456789,
            "requests_per_second": 2.5,
            "tokens_per_second": 310.0,
            "listen": "http://127.0.0.1:8484",
            "socket": self.socket_path,
        }

    def queue(self) -> dict[str, Any]:
        return {
            "queue": {
                "total": 3,
                "by_user": {"7": 2, "8": 1},
                "by_model": {"llama3.2": 2, "mistral": 1},
                "average_wait_seconds": 2.5,
                "running": 2,
                "by_user_name": {"alice": 2, "bob": 1},
                "oldest_wait_seconds": 4.75,
                "by_user_model": {"alice": {"llama3.2": 2}, "bob": {"mistral": 1}},
                "oldest_wait_by_user_model": {"alice": {"llama3.2": 4.75}, "bob": {"mistral": 0.5}},
            },
            "fair_share": {
                "total_users": 2,
                "global_recent_tokens": 42000,
                "user_stats": [
                    {
                        "user_id": 7,
                        "name": "alice",
                        "weight": 3.0,
                        "deficit": -1000.0,
                        "recent_tokens": 30000,
                        "group": "faculty",
                    },
                    {
                        "user_id": 8,
                        "name": "bob",
                        "weight": 2.0,
                        "deficit": 250.0,
                        "recent_tokens": 12000,
                        "group": "student",
                    },
                ],
            },
        }

    def share(self) -> dict[str, Any]:
        return {
            "window_seconds": 300.0,
            "global_recent_tokens": 42000,
            "global_recent_units": 70000,
            "groups": [
                {
                    "name": "faculty",
                    "weight": 3.0,
                    "target_share": 0.6,
                    "recent_tokens": 30000,
                    "actual_share": 0.7143,
                    "users": 1,
                },
                {
                    "name": "student",
                    "weight": 1.0,
                    "target_share": 0.4,
                    "recent_tokens": 12000,
                    "actual_share": 0.2857,
                    "users": 1,
                },
            ],
            "users": [
                {
                    "name": "alice",
                    "group": "faculty",
                    "weight": 3.0,
                    "target_share": 0.6,
                    "recent_tokens": 30000,
                    "actual_share": 0.7143,
                    "recent_units": 52000,
                    "unit_share": 0.7429,
                    "deficit": -1000.0,
                    "burst_credits": 30.0,
                    "factor": 0.57,
                    "queued": 2,
                    "running": 1,
                },
                {
                    "name": "bob",
                    "group": "student",
                    "weight": 2.0,
                    "target_share": 0.4,
                    "recent_tokens": 12000,
                    "actual_share": 0.2857,
                    "deficit": 250.0,
                    "burst_credits": 20.0,
                    "factor": 1.0,
                    "queued": 1,
                    "running": 1,
                },
            ],
        }

    def gpus(self) -> list[dict[str, Any]]:
        return [
            {
                "node": "local",
                "stale": False,
                "gpus": [
                    {
                        "index": 0,
                        "name": "NVIDIA RTX 4090",
                        "memory_total": 24 << 30,
                        "memory_used": 16 << 30,
                        "memory_free": 8 << 30,
                        "utilization_gpu": 35,
                        "utilization_memory": 20,
                        "temperature_c": 61,
                        "power_w": 220.0,
                        "power_limit_w": 450.0,
                        "processes": [],
                    }
                ],
            }
        ]

    def top(self) -> dict[str, Any]:
        return {
            "status": self.status(),
            "backends": list(self.backends.values()),
            "gpus": self.gpus(),
            "queue": self.queue(),
            "share": self.share(),
            "decisions": self.decisions[-10:],
            "usage_today": {
                "users": [
                    {"user": "alice", "requests": 120, "prompt_tokens": 90_000, "completion_tokens": 1_650_000},
                    {"user": "bob", "requests": 30, "prompt_tokens": 4_000, "completion_tokens": 20_000},
                ],
                "models": [
                    {"model": "llama3.2", "requests": 100, "prompt_tokens": 80_000, "completion_tokens": 1_500_000},
                    {"model": "mistral", "requests": 30, "prompt_tokens": 10_000, "completion_tokens": 90_000},
                    {"model": "llama3.2:latest", "requests": 20, "prompt_tokens": 4_000, "completion_tokens": 80_000},
                ],
                "total": {"requests": 150, "prompt_tokens": 94_000, "completion_tokens": 1_670_000},
            },
            "quota_warnings": [
                {
                    "subject": "user",
                    "name": "alice",
                    "kind": "tokens_per_day",
                    "limit": 2_000_000,
                    "used": 1_740_000,
                    "remaining": 260_000,
                    "resets": 1_767_052_800.0,
                    "resets_at": "2026-12-30T00:00:00+00:00",
                }
            ],
            "throughput": {
                "bucket_seconds": 10,
                "backends": {"ws1": [0, 0, 5, 20, 40, 55, 60, 58, 30, 10] * 3, "ws2": [0.0] * 30},
            },
        }

    # -- HTTP -------------------------------------------------------------------------

    @staticmethod
    def error(message: str, status: int) -> web.Response:
        code = {400: "bad_request", 404: "not_found", 409: "conflict"}.get(status, "error")
        return web.json_response(
            {"error": {"message": message, "type": "invalid_request_error", "code": code}}, status=status
        )

    def build(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = None
        if request.can_read_body:
            try:
                body = await request.json()
            except ValueError:
                return self.error("the request body is not valid JSON", 400)
        self.requests.append((request.method, request.path_qs, body))
        parts = [p for p in request.path.split("/") if p]
        if parts[:1] != ["admin"]:
            return self.error("not found", 404)
        route = parts[1:]
        try:
            return await self.route(request, request.method, route, body)
        except KeyError as exc:
            return self.error(f"{exc.args[0]}", 404)

    async def route(self, request: web.Request, method: str, route: list[str], body: Any) -> web.StreamResponse:
        j = web.json_response
        match method, route:
            case "GET", ["status"]:
                return j(self.status())
            case "GET", ["groups"]:
                return j([self.group_row(g) for g in self.groups])
            case "POST", ["groups"]:
                if body["name"] in self.groups:
                    return self.error(
                        f"group {body['name']!r} already exists; change its weight with `mr group set-weight`", 409
                    )
                self.groups[body["name"]] = float(body["weight"])
                return j(self.group_row(body["name"]), status=201)
            case "PUT", ["groups", name]:
                if name not in self.groups:
                    raise KeyError(f"group {name!r} does not exist; `mr group list` shows the groups")
                self.groups[name] = float(body["weight"])
                return j(self.group_row(name))
            case "DELETE", ["groups", name]:
                if name not in self.groups:
                    raise KeyError(f"group {name!r} does not exist; `mr group list` shows the groups")
                if any(u["group"] == name for u in self.users.values()):
                    return self.error(f"group {name!r} still has users; move or remove them first", 409)
                del self.groups[name]
                return j({"removed": name})
            case "GET", ["users"]:
                return j([self.user_row(u) for u in self.users])
            case "POST", ["users"]:
                if body.get("group") not in self.groups:
                    raise KeyError(
                        f"group {body.get('group')!r} does not exist; create it with `mr group add NAME --weight 1`"
                    )
                self.users[body["name"]] = {"group": body["group"], "weight_override": body.get("weight"), "keys": 0}
                if body.get("proxy"):
                    self.users[body["name"]]["proxy_for"] = body.get("proxy_group") or body["group"]
                return j(self.user_row(body["name"]), status=201)
            case "PUT", ["users", name]:
                if name not in self.users:
                    raise KeyError(f"user {name!r} does not exist; `mr user list` shows the users")
                if "weight" in body:
                    self.users[name]["weight_override"] = body["weight"]
                if "group" in body:
                    if body["group"] not in self.groups:
                        raise KeyError(
                            f"group {body['group']!r} does not exist; create it with `mr group add NAME --weight 1`"
                        )
                    self.users[name]["group"] = body["group"]
                if "proxy" in body:
                    proxy_for = (body.get("proxy_group") or self.users[name]["group"]) if body["proxy"] else None
                    self.users[name]["proxy_for"] = proxy_for
                return j(self.user_row(name))
            case "DELETE", ["users", name]:
                if name not in self.users:
                    raise KeyError(f"user {name!r} does not exist; `mr user list` shows the users")
                del self.users[name]
                return j({"removed": name})
            case "POST", ["users", name, "keys"]:
                if name not in self.users:
                    raise KeyError(f"user {name!r} does not exist; `mr user list` shows the users")
                self.users[name]["keys"] += 1
                return j({"user": name, "key": f"mr-{name}-secretkey{self.users[name]['keys']}"}, status=201)
            case "GET", ["backends"]:
                return j(list(self.backends.values()))
            case "POST", ["backends"]:
                row = _backend_row(
                    self.next_id,
                    body["name"],
                    body["url"],
                    body["engine"],
                    **{k: v for k, v in body.items() if k in ("max_concurrent", "gpus", "node", "priority")},
                )
                self.next_id += 1
                self.backends[body["name"]] = row
                return j(row, status=201)
            case "POST", ["backends", name, ("drain" | "enable") as verb]:
                if name not in self.backends:
                    raise KeyError(f"backend {name!r} does not exist; `mr backend list` shows the backends")
                self.backends[name]["status"] = "draining" if verb == "drain" else "healthy"
                return j(self.backends[name])
            case "DELETE", ["backends", name]:
                if name not in self.backends:
                    raise KeyError(f"backend {name!r} does not exist; `mr backend list` shows the backends")
                del self.backends[name]
                return j({"removed": name})
            case "GET", ["models"]:
                return j(self.models)
            case "GET", ["usage"] if self.usage is not None:
                return j(self.usage)
            case "GET", ["queue"]:
                return j(self.queue())
            case "GET", ["share"]:
                return j(self.share())
            case "GET", ["decisions"]:
                user = request.query.get("user")
                limit = int(request.query.get("limit", "50"))
                rows = [d for d in self.decisions if user is None or d["user"] == user]
                return j(rows[-limit:])
            case "GET", ["decisions", "stream"]:
                resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
                await resp.prepare(request)
                for record in self.stream_records:
                    await resp.write((json.dumps(record) + "\n").encode())
                generation, deadline = self.generation, asyncio.get_running_loop().time() + self.stream_hold
                while (
                    self.generation == generation and not self.stopping and asyncio.get_running_loop().time() < deadline
                ):
                    await asyncio.sleep(0.05)
                await resp.write_eof()
                return resp
            case "GET", ["decisions", request_id]:
                for record in self.decisions:
                    if record["request_id"] == request_id:
                        return j(record)
                raise KeyError(f"no decision record for request {request_id!r}; `mr decisions` lists recent ones")
            case "GET", ["gpus"]:
                return j(self.gpus())
            case "GET", ["top"]:
                return j(self.top())
            case "GET", ["export"]:
                return j(
                    {
                        "version": 1,
                        "groups": [{"name": g, "scheduler_weight": w} for g, w in self.groups.items()],
                        "users": [
                            {
                                "name": n,
                                "group": u["group"],
                                **({"weight_override": u["weight_override"]} if u["weight_override"] else {}),
                            }
                            for n, u in self.users.items()
                        ],
                        "backends": [
                            {
                                k: b[k]
                                for k in ("id", "name", "url", "engine", "max_concurrent", "gpus", "node", "priority")
                            }
                            | {"state": "enabled"}
                            for b in self.backends.values()
                        ],
                    }
                )
            case "POST", ["import"] | ["import", "dry-run"]:
                return j({k: len(body.get(k, [])) for k in ("groups", "users", "backends")})
            case "GET", ["boom"]:
                return web.Response(status=500, text="Internal Server Error")
        return self.error(f"no admin route {method} /admin/{'/'.join(route)}", 404)

    # -- the server thread ---------------------------------------------------------------

    def start(self) -> None:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._serve())
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-mr-daemon", daemon=True)
        self._thread.start()
        assert ready.wait(10), "the fake daemon did not start"

    async def _serve(self) -> None:
        self.stopping = False
        self._runner = web.AppRunner(self.build(), handle_signals=False)
        await self._runner.setup()
        await web.UnixSite(self._runner, self.socket_path).start()

    def stop(self) -> None:
        if self._loop is None:
            return
        loop = self._loop
        self.stopping = True
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(10)  # type: ignore[union-attr]
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)  # type: ignore[union-attr]
        self._loop = None
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)


@pytest.fixture(scope="module")
def fake_server() -> Iterator[FakeDaemon]:
    folder = tempfile.mkdtemp(prefix="mr-cli-")  # short: AF_UNIX paths are limited to ~107 bytes
    server = FakeDaemon(os.path.join(folder, "mr.sock"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def fake(fake_server: FakeDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeDaemon:
    """The fake daemon, reset, with $MR_CONFIG naming a config file that points at its socket."""
    fake_server.reset()
    config = tmp_path / "config.toml"
    config.write_text(f'[server]\nsocket = "{fake_server.socket_path}"\n')
    monkeypatch.setenv("MR_CONFIG", str(config))
    monkeypatch.delenv("NO_COLOR", raising=False)
    return fake_server


class Run:
    """What ``mr ARGS`` did: exit code, stdout, stderr, as ``main()`` would have reported them."""

    def __init__(self, exit_code: int, stdout: str, stderr: str) -> None:
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr

    def json(self) -> Any:
        return json.loads(self.stdout)

    def __repr__(self) -> str:
        return f"Run(exit_code={self.exit_code}, stdout={self.stdout[:2000]!r}, stderr={self.stderr[:2000]!r})"


def mr(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Run:
    """Run ``mr ARGS`` in-process; a MindRouterError becomes ``mr: MESSAGE`` and its exit code, as in ``main()``."""
    result = CliRunner().invoke(mr_app, list(args), input=input, env={"COLUMNS": "160", **(env or {})})
    stderr = result.stderr
    code = result.exit_code
    exc = result.exception
    if isinstance(exc, MindRouterError):
        stderr += f"mr: {exc}\n"
        code = exc.exit_code
    elif exc is not None and not isinstance(exc, SystemExit):
        raise exc
    return Run(code, result.stdout, stderr)


# -- the admin client -------------------------------------------------------------------------


def test_client_get_post_put_delete(fake: FakeDaemon) -> None:
    client = AdminClient(fake.socket_path)
    assert client.get("/admin/status")["version"] == "0.1.0"
    assert client.post("/admin/groups", {"name": "phd", "weight": 2})["scheduler_weight"] == 2
    assert client.put("/admin/groups/phd", {"weight": 4})["scheduler_weight"] == 4
    assert client.delete("/admin/groups/phd") == {"removed": "phd"}
    assert client.get("/admin/decisions", limit=1, user="alice") == [fake.decisions[0]]
    assert fake.requests[-1][1] == "/admin/decisions?limit=1&user=alice"


def test_client_maps_error_bodies_to_request_error(fake: FakeDaemon) -> None:
    client = AdminClient(fake.socket_path)
    with pytest.raises(RequestError) as info:
        client.put("/admin/groups/nope", {"weight": 1})
    assert info.value.status == 404 and info.value.code == "not_found" and info.value.exit_code == 1
    assert str(info.value) == "group 'nope' does not exist; `mr group list` shows the groups"
    with pytest.raises(RequestError, match=r"answered GET /admin/boom with HTTP 500: Internal Server Error"):
        client.get("/admin/boom")


def test_client_unreachable_is_exit_3(tmp_path: Path) -> None:
    missing = tmp_path / "nothing.sock"
    with pytest.raises(DaemonUnreachable) as info:
        AdminClient(missing).get("/admin/status")
    assert str(info.value) == (
        f"cannot reach the daemon at {missing}; is `mr serve` running? "
        "Point at another daemon with --config FILE or MR_CONFIG (its [server] socket)"
    )
    assert info.value.exit_code == 3
    # a socket file nobody listens on (a daemon that crashed) reads the same
    dead = socket.socket(socket.AF_UNIX)
    short = tempfile.mkdtemp(prefix="mr-dead-")
    path = os.path.join(short, "mr.sock")
    dead.bind(path)
    dead.close()
    try:
        with pytest.raises(DaemonUnreachable, match="cannot reach the daemon"):
            AdminClient(path).get("/admin/status")
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_client_stream_yields_ndjson_until_closed(fake: FakeDaemon) -> None:
    fake.stream_records = [decision("s-1"), decision("s-2")]
    got = [r["request_id"] for r in AdminClient(fake.socket_path).stream("/admin/decisions/stream", user="alice")]
    assert got == ["s-1", "s-2"]
    assert fake.requests[-1][1] == "/admin/decisions/stream?user=alice"


def test_ctrl_c_ends_a_stream_even_when_it_lands_in_a_finalizer(fake: FakeDaemon) -> None:
    """Raised inside a finalizer, KeyboardInterrupt is reported as ignored and the read would go on."""
    fake.stream_records = [decision("s-1")]
    fake.stream_hold = 30
    # Ctrl-C as a terminal delivers it: a run started in the background by a shell (`pytest &`) or by
    # a CI runner may ignore SIGINT, and then nothing would be raised at all.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:

        class Dropped:
            def __del__(self) -> None:
                signal.raise_signal(signal.SIGINT)

        stream = AdminClient(fake.socket_path).stream("/admin/decisions/stream")
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            for _record in stream:
                Dropped()  # freed at once: SIGINT arrives inside its __del__
        assert time.monotonic() - started < 20  # not after the daemon's 30 s hold
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the stream put it back
    finally:
        signal.signal(signal.SIGINT, previous)


def test_client_timeout_is_unreachable(tmp_path: Path) -> None:
    folder = tempfile.mkdtemp(prefix="mr-slow-")
    path = os.path.join(folder, "mr.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)  # accepts into the backlog, never answers
    try:
        with pytest.raises(DaemonUnreachable, match=r"did not answer within 0.2 s"):
            AdminClient(path, timeout=0.2).get("/admin/status")
    finally:
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_in_process_runner_reports_like_main(fake: FakeDaemon) -> None:
    run = mr("group", "set-weight", "nope", "2")
    assert run.exit_code == 1
    assert run.stderr == "mr: group 'nope' does not exist; `mr group list` shows the groups\n"
    assert run.stdout == ""
