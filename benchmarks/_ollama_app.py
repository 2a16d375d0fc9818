"""The HTTP face of a fake Ollama workstation (``_workstation.py``): Ollama's wire format, and an ``mr agent``.

    python benchmarks/_ollama_app.py COMPRESSION PORT [PORT ...]

serves the lab pool of ``_lab.py`` (one workstation per port, in order) on
127.0.0.1 until stopped. Routes, as Ollama answers them: ``GET /``,
``/api/version``, ``/api/tags``, ``/api/ps`` (``size_vram``, ``expires_at``),
``POST /api/show`` (``capabilities``), ``/api/chat``, ``/api/generate`` and
``/api/embed`` (NDJSON streams whose last line has ``eval_count``,
``eval_duration``, ``prompt_eval_count``, ``prompt_eval_duration``,
``load_duration`` and ``total_duration`` in nanoseconds), and the
OpenAI-compatible ``/v1/chat/completions``, ``/v1/embeddings`` and
``/v1/models``. ``GET /gpus`` answers as ``mr agent`` does (its one GPU's
VRAM as the loaded runners use it), so ``mr serve`` can read it as a node.
``GET /bench/stats`` gives the loads, load seconds (lab), evictions and
expiries; ``GET /bench/trace`` where each answered request's time went (waiting
for its runner, its load, a slot, prefill, decode). Each chunk carries as many "tok " words as tokens were produced
since the last one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import UTC, datetime, timedelta
from typing import Any

from _workstation import GB, Runner, ServerBusy, Stream, Workstation, WorkstationSpec
from aiohttp import web

WORKSTATION = web.AppKey("workstation", Workstation)
VERSION = "0.11.4"
"""The Ollama version the fake claims."""


def _stamp(offset_s: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=offset_s)).isoformat().replace("+00:00", "Z")


def _words(text: Any) -> int:
    return text.count(" ") + 1 if isinstance(text, str) and text else 0


def prompt_tokens(body: dict[str, Any]) -> int:
    """Whitespace-separated words of the prompt, messages or embedding input: the fake's tokenizer."""
    if isinstance(body.get("messages"), list):
        return sum(_words(m.get("content")) for m in body["messages"] if isinstance(m, dict))
    text = body.get("input", body.get("prompt"))
    return sum(map(_words, text)) if isinstance(text, list) else _words(text)


def keep_alive_seconds(value: Any) -> float | None:
    """Ollama's ``keep_alive``: seconds as a number, or a duration such as "5m" or "300s"; negative is forever."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
        unit = next((u for u in ("ms", "s", "m", "h") if value.endswith(u)), "")
        try:
            value = float(value.removesuffix(unit)) * units.get(unit, 1.0)
        except ValueError:
            return None
    seconds = float(value)
    return float("inf") if seconds < 0 else seconds


def _model(request: web.Request, body: dict[str, Any]) -> str:
    name = str(body.get("model") or "")
    ws = request.app[WORKSTATION]
    return name if name in ws.models else f"{name}:latest" if f"{name}:latest" in ws.models else name


def _error(request: web.Request, status: int, message: str) -> web.Response:
    if request.path.startswith("/v1/"):
        kind = "not_found_error" if status == 404 else "api_error"
        return web.json_response({"error": {"message": message, "type": kind, "code": None}}, status=status)
    return web.json_response({"error": message}, status=status)


async def _generate(request: web.Request) -> web.StreamResponse:
    """``/api/chat``, ``/api/generate``, ``/api/embed``, ``/v1/chat/completions``, ``/v1/embeddings``."""
    t0 = time.monotonic()
    ws = request.app[WORKSTATION]
    body = await request.json()
    openai, embed = request.path.startswith("/v1/"), request.path.endswith(("/embed", "/embeddings"))
    model = _model(request, body)
    options = body.get("options") if isinstance(body.get("options"), dict) else {}
    out = (
        0
        if embed
        else int(body.get("max_tokens") or body.get("max_completion_tokens") or options.get("num_predict") or 128)
    )
    try:
        runner, waited, load_wait = await ws.acquire(model, keep_alive_seconds(body.get("keep_alive")))
    except KeyError:
        return _error(request, 404, f"model '{model}' not found")
    except ServerBusy as exc:
        return _error(request, 503, str(exc))
    stream = Stream(prompt_tokens(body), out)
    try:
        reply = _Reply(request, ws, model, openai, embed, stream, t0, waited)
        async with aclosing(ws.run(runner, stream)) as chunks:
            if embed or not body.get("stream", not openai):
                async for _ in chunks:
                    pass
                return web.json_response(reply.whole())
            return await reply.stream(chunks, bool((body.get("stream_options") or {}).get("include_usage")))
    except ConnectionResetError:  # the client left (a router cancelled, or the benchmark ended)
        return web.Response(status=499)
    finally:
        ws.release(runner)
        ws.trace.append(_trace(ws, model, stream, waited, load_wait))


def _trace(ws: Workstation, model: str, stream: Stream, waited: float, load_wait: float) -> dict[str, Any]:
    """Where one request's time went on this workstation (lab seconds), for ``GET /bench/trace``."""
    return {
        "model": model,
        "prompt": stream.prompt,
        "out": stream.out,
        "runner_wait": waited - load_wait,
        "load_wait": load_wait,
        "slot_wait": stream.started_at - stream.queued_at,
        "prefill": stream.prefill_s,
        "to_first": None if stream.first_at is None else stream.first_at - stream.started_at,
        "decode": stream.decode_s,
        "end": ws.now(),
    }


class _Reply:
    """One answer's shapes, in either dialect."""

    def __init__(
        self,
        request: web.Request,
        ws: Workstation,
        model: str,
        openai: bool,
        embed: bool,
        stream: Stream,
        t0: float,
        waited: float,
    ) -> None:
        self.request, self.ws, self.model, self.openai, self.embed = request, ws, model, openai, embed
        self.s, self.t0, self.waited = stream, t0, waited
        self.chat = request.path.endswith("/chat") or request.path.endswith("/chat/completions")

    def _ns(self, lab_seconds: float) -> int:
        return int(lab_seconds / self.ws.compression * 1e9)

    def _timings(self) -> dict[str, Any]:
        return {
            "total_duration": int((time.monotonic() - self.t0) * 1e9),
            "load_duration": self._ns(self.waited),
            "prompt_eval_count": self.s.prompt,
            "prompt_eval_duration": self._ns(self.s.prefill_s),
            "eval_count": self.s.out,
            "eval_duration": self._ns(self.s.decode_s),
        }

    def _usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.s.prompt,
            "completion_tokens": self.s.out,
            "total_tokens": self.s.prompt + self.s.out,
        }

    def _ollama(self, text: str, done: bool) -> dict[str, Any]:
        part: dict[str, Any] = {"message": {"role": "assistant", "content": text}} if self.chat else {"response": text}
        line = {"model": self.model, "created_at": _stamp(), **part, "done": done}
        return {**line, "done_reason": "length", **self._timings()} if done else line

    def _openai(self, text: str | None, finish: str | None) -> dict[str, Any]:
        delta = {"role": "assistant", "content": text} if text is not None else {}
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def whole(self) -> dict[str, Any]:
        vectors = [[0.1] * 8]
        if self.embed and self.openai:
            data = [{"object": "embedding", "index": 0, "embedding": vectors[0]}]
            return {"object": "list", "data": data, "model": self.model, "usage": self._usage()}
        if self.embed:
            return {"model": self.model, "embeddings": vectors, **self._timings()}
        text = "tok " * self.s.out
        if not self.openai:
            return self._ollama(text, True)
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
            "usage": self._usage(),
        }

    async def stream(self, chunks: AsyncIterator[int], include_usage: bool) -> web.StreamResponse:
        kind = "text/event-stream" if self.openai else "application/x-ndjson"
        resp = web.StreamResponse(headers={"Content-Type": kind})
        await resp.prepare(self.request)
        async for n in chunks:
            line = self._openai("tok " * n, None) if self.openai else self._ollama("tok " * n, False)
            await resp.write(self._frame(line))
        if self.openai:
            await resp.write(self._frame(self._openai(None, "length")))
            if include_usage:
                await resp.write(self._frame({**self._openai(None, None), "choices": [], "usage": self._usage()}))
            await resp.write(b"data: [DONE]\n\n")
        else:
            await resp.write(self._frame(self._ollama("", True)))
        await resp.write_eof()
        return resp

    def _frame(self, data: dict[str, Any]) -> bytes:
        text = json.dumps(data, separators=(",", ":"))
        return f"data: {text}\n\n".encode() if self.openai else f"{text}\n".encode()


def _details(ws: Workstation, name: str) -> dict[str, Any]:
    spec = ws.models[name]
    return {
        "parent_model": "",
        "format": "gguf",
        "family": spec.family,
        "families": [spec.family],
        "parameter_size": spec.parameter_size,
        "quantization_level": "F16" if spec.embedding else "Q4_K_M",
    }


def _entry(ws: Workstation, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "model": name,
        "modified_at": "2026-11-01T12:00:00Z",
        "size": int(ws.models[name].disk_gb * GB),
        "digest": f"{abs(hash(name)):064x}"[:64],
        "details": _details(ws, name),
    }


def _expires(ws: Workstation, runner: Runner) -> str:
    if runner.expires_at is not None:
        return _stamp((runner.expires_at - ws.now()) / ws.compression)
    if runner.session == float("inf"):
        return "2318-11-20T00:00:00Z"
    return _stamp(max(0.0, runner.session) / ws.compression)


async def _tags(request: web.Request) -> web.Response:
    ws = request.app[WORKSTATION]
    return web.json_response({"models": [_entry(ws, n) for n in ws.models]})


async def _ps(request: web.Request) -> web.Response:
    ws = request.app[WORKSTATION]
    models = [
        {
            **_entry(ws, n),
            "size": int(r.spec.vram_gb * GB),
            "size_vram": int(r.spec.vram_gb * GB),
            "expires_at": _expires(ws, r),
            "context_length": 8192,
        }
        for n, r in ws.loaded.items()
    ]
    return web.json_response({"models": models})


async def _show(request: web.Request) -> web.Response:
    ws = request.app[WORKSTATION]
    name = _model(request, await request.json())
    if name not in ws.models:
        return _error(request, 404, f"model '{name}' not found")
    caps = ["embedding"] if ws.models[name].embedding else ["completion", "tools"]
    return web.json_response(
        {
            "modelfile": "",
            "parameters": "",
            "template": "",
            "details": _details(ws, name),
            "model_info": {},
            "capabilities": caps,
            "modified_at": "2026-11-01T12:00:00Z",
        }
    )


async def _models(request: web.Request) -> web.Response:
    ws = request.app[WORKSTATION]
    data = [{"id": n, "object": "model", "created": 0, "owned_by": "library"} for n in ws.models]
    return web.json_response({"object": "list", "data": data})


async def _gpus(request: web.Request) -> web.Response:
    """One reading in the shape of ``mr agent``'s ``GET /gpus``."""
    ws = request.app[WORKSTATION]
    total, used = int(ws.spec.vram_gb * GB), int(ws.used_vram_gb() * GB)
    reading = {
        "index": 0,
        "name": ws.spec.gpu,
        "uuid": f"GPU-fake-{ws.spec.name}",
        "memory_total": total,
        "memory_used": used,
        "memory_free": total - used,
        "utilization_gpu": 100 if ws.busy_streams() else 0,
        "utilization_memory": None,
        "temperature_c": None,
        "power_w": None,
        "power_limit_w": None,
        "processes": None,
    }
    return web.json_response([reading])


async def _stats(request: web.Request) -> web.Response:
    ws = request.app[WORKSTATION]
    s = ws.stats
    return web.json_response(
        {
            "loads": s.loads,
            "load_seconds": s.load_seconds,
            "evictions": s.evictions,
            "expiries": s.expiries,
            "busy": s.busy,
            "requests": s.requests,
            "tokens": s.tokens,
            "resident": sorted(ws.loaded),
        }
    )


async def _trace_route(request: web.Request) -> web.Response:
    return web.json_response(request.app[WORKSTATION].trace)


async def _text(_request: web.Request) -> web.Response:
    return web.Response(text="Ollama is running")


async def _version(_request: web.Request) -> web.Response:
    return web.json_response({"version": VERSION})


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "version": VERSION, "gpus": 1, "nvml": True, "reading_age_seconds": 0})


def create_app(spec: WorkstationSpec, models: Any, compression: float) -> web.Application:
    """The app of one fake workstation; its ``Workstation`` lives from startup to cleanup."""
    app = web.Application(client_max_size=64 * 1024 * 1024)

    async def workstation_ctx(app: web.Application) -> AsyncIterator[None]:
        app[WORKSTATION] = Workstation(spec, models, compression)
        yield
        await app[WORKSTATION].close()

    app.cleanup_ctx.append(workstation_ctx)
    for path in ("/api/chat", "/api/generate", "/api/embed", "/v1/chat/completions", "/v1/embeddings"):
        app.router.add_post(path, _generate)
    app.router.add_post("/api/show", _show)
    for path, handler in (
        ("/", _text),
        ("/api/version", _version),
        ("/api/tags", _tags),
        ("/api/ps", _ps),
        ("/v1/models", _models),
        ("/gpus", _gpus),
        ("/health", _health),
        ("/bench/stats", _stats),
        ("/bench/trace", _trace_route),
    ):
        app.router.add_get(path, handler)
    return app


async def serve(compression: float, ports: list[int]) -> None:
    """The lab pool of ``_lab.py`` on ``ports``, until cancelled."""
    from _lab import MODELS, POOL

    runners = []
    for spec, port in zip(POOL, ports, strict=False):
        runner = web.AppRunner(create_app(spec, MODELS, compression), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
        runners.append(runner)
    try:
        await asyncio.Event().wait()
    finally:
        for runner in runners:
            await runner.cleanup()


if __name__ == "__main__":
    try:
        import uvloop

        run: Any = uvloop.run
    except ImportError:
        run = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        run(serve(float(sys.argv[1]), [int(p) for p in sys.argv[2:]]))
