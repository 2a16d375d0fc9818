"""The HTTP face of a fake workstation (``_workstation.py``): Ollama's wire format, and an ``mr agent``.

    python benchmarks/_ollama_app.py COMPRESSION SHARING POOL PORT [PORT ...]

serves the pool POOL of ``_pools.py`` (lab, replicas, six, two-popular or mixed; one server per port,
in order, its GPU shared by SHARING: time-share or concurrent) on 127.0.0.1 until stopped.
Routes, as Ollama answers them: ``GET /``,
``/api/version``, ``/api/tags``, ``/api/ps`` (``size_vram``, ``expires_at``,
``context_length``), ``POST /api/show`` (``capabilities``), ``/api/chat``,
``/api/generate`` and ``/api/embed`` (NDJSON streams whose last line has
``eval_count``, ``eval_duration``, ``prompt_eval_count``,
``prompt_eval_duration``, ``load_duration`` and ``total_duration`` in
nanoseconds), and the OpenAI-compatible ``/v1/chat/completions``,
``/v1/embeddings`` and ``/v1/models``. ``GET /gpus`` answers as ``mr agent``
does (its one GPU's VRAM as the loaded runners use it), so ``mr serve`` can
read it as a node. ``GET /bench/stats`` gives the loads, load seconds (lab),
evictions and expiries; ``GET /bench/trace`` where each answered request's
time went (waiting for its runner, its load, a slot, prefill, decode). Each
chunk carries as many "tok " words as tokens were produced since the last one.

What a prompt cache needs from the wire: the prompt, as segments
(``Prompt``): each message is one, keyed by its role and text, so a system
prompt or a history sent again is recognised; tokens are whitespace-separated
words. An answer is "tok " repeated, and is keyed as the assistant message a
client sends back. What is reported is what the engine reports: an Ollama's
``prompt_eval_count`` (and OpenAI ``prompt_tokens``) is the whole prompt, as
Ollama's llama-server runner counts it (``cache_n + prompt_n``), and
``prompt_eval_duration`` the time of the part computed; a vLLM or llama.cpp
engine adds ``prompt_tokens_details.cached_tokens`` to its OpenAI usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from datetime import UTC, datetime, timedelta
from typing import Any

from _workstation import LiveStation, ServerBusy, Waits
from aiohttp import web

from mindrouter.simulate.scenario import GB, BackendSpec, ModelSpec
from mindrouter.simulate.workstation import Options, Prompt, Runner, Segment, Stream

STATION = web.AppKey("station", LiveStation)
VERSION = "0.11.4"
"""The Ollama version the fake claims."""


def _stamp(offset_s: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=offset_s)).isoformat().replace("+00:00", "Z")


def words(text: Any) -> int:
    """The fake's tokenizer: whitespace-separated words."""
    return len(text.split()) if isinstance(text, str) else 0


def prompt_of(body: dict[str, Any]) -> Prompt:
    """The prompt as segments: each message (role and text), or the prompt, or each input to embed."""
    if isinstance(body.get("messages"), list):
        parts = [(m.get("role"), m.get("content")) for m in body["messages"] if isinstance(m, dict)]
    else:
        text = body.get("input", body.get("prompt"))
        parts = [("input", t) for t in (text if isinstance(text, list) else [text])]
    segments = tuple(Segment((role, text), words(text)) for role, text in parts if words(text))
    return Prompt(segments or (Segment(("empty",), 1),))


def answer_text(tokens: int) -> str:
    return "tok " * tokens


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
    ws = request.app[STATION]
    return name if name in ws.models else f"{name}:latest" if f"{name}:latest" in ws.models else name


def _error(request: web.Request, status: int, message: str) -> web.Response:
    if request.path.startswith("/v1/"):
        kind = "not_found_error" if status == 404 else "api_error"
        return web.json_response({"error": {"message": message, "type": kind, "code": None}}, status=status)
    return web.json_response({"error": message}, status=status)


async def _generate(request: web.Request) -> web.StreamResponse:
    """``/api/chat``, ``/api/generate``, ``/api/embed``, ``/v1/chat/completions``, ``/v1/embeddings``."""
    t0 = time.monotonic()
    ws = request.app[STATION]
    body = await request.json()
    openai, embed = request.path.startswith("/v1/"), request.path.endswith(("/embed", "/embeddings"))
    model = _model(request, body)
    options = body.get("options") if isinstance(body.get("options"), dict) else {}
    out = (
        0
        if embed
        else int(body.get("max_tokens") or body.get("max_completion_tokens") or options.get("num_predict") or 128)
    )
    num_ctx = options.get("num_ctx")
    wants = Options(keep_alive_seconds(body.get("keep_alive")), num_ctx if isinstance(num_ctx, int) else None)
    try:
        stream = ws.submit(model, prompt_of(body), out, Segment(("assistant", answer_text(out)), out), wants)
    except KeyError:
        return _error(request, 404, f"model '{model}' not found")
    except ServerBusy as exc:
        return _error(request, 503, str(exc))
    reply = _Reply(request, ws, model, openai, embed, stream, t0)
    try:
        async with aclosing(ws.tokens(stream)) as chunks:
            if embed or not body.get("stream", not openai):
                async for _ in chunks:
                    pass
                return web.json_response(reply.whole())
            return await reply.stream(chunks, bool((body.get("stream_options") or {}).get("include_usage")))
    except ConnectionResetError:  # the client left (a router cancelled, or the benchmark ended)
        return web.Response(status=499)
    finally:
        ws.leave(stream)


class _Reply:
    """One answer's shapes, in either dialect."""

    def __init__(
        self,
        request: web.Request,
        ws: LiveStation,
        model: str,
        openai: bool,
        embed: bool,
        stream: Stream[Waits],
        t0: float,
    ) -> None:
        self.request, self.ws, self.model, self.openai, self.embed = request, ws, model, openai, embed
        self.s, self.t0 = stream, t0
        self.chat = request.path.endswith("/chat") or request.path.endswith("/chat/completions")

    def _ns(self, lab_seconds: float) -> int:
        return int(self.ws.wall(lab_seconds) * 1e9)

    def _timings(self) -> dict[str, Any]:
        s = self.s
        return {
            "total_duration": int((time.monotonic() - self.t0) * 1e9),
            "load_duration": self._ns(s.load),
            "prompt_eval_count": s.prompt.tokens,
            "prompt_eval_duration": self._ns(s.prefill_end - s.began),
            "eval_count": s.completion,
            "eval_duration": self._ns(s.done - s.prefill_end),
        }

    def _usage(self) -> dict[str, Any]:
        s = self.s
        usage: dict[str, Any] = {
            "prompt_tokens": s.prompt.tokens,
            "completion_tokens": s.completion,
            "total_tokens": s.prompt.tokens + s.completion,
        }
        if self.ws.spec.engine in ("vllm", "llamacpp"):
            usage["prompt_tokens_details"] = {"cached_tokens": s.cached}
        return usage

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
        text = answer_text(self.s.completion)
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
            text = answer_text(n)
            await resp.write(self._frame(self._openai(text, None) if self.openai else self._ollama(text, False)))
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


def _details(ws: LiveStation, name: str, sizes: Mapping[str, str]) -> dict[str, Any]:
    spec = ws.models[name]
    return {
        "parent_model": "",
        "format": "gguf",
        "family": spec.family,
        "families": [spec.family],
        "parameter_size": sizes.get(name, "8B"),
        "quantization_level": "F16" if spec.kind == "embedding" else "Q4_K_M",
    }


def _entry(ws: LiveStation, name: str, sizes: Mapping[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "model": name,
        "modified_at": "2026-11-01T12:00:00Z",
        "size": int(ws.models[name].size * GB),
        "digest": f"{abs(hash(name)):064x}"[:64],
        "details": _details(ws, name, sizes),
    }


def _expires(ws: LiveStation, runner: Runner[Waits]) -> str:
    if runner.session == float("inf"):
        return "2318-11-20T00:00:00Z"
    since = runner.last_used if not runner.refs else ws.now()
    return _stamp(ws.wall(max(0.0, since + runner.session - ws.now())))


def create_app(
    spec: BackendSpec,
    models: Mapping[str, ModelSpec],
    compression: float,
    gpu: str = "Fake GPU",
    sizes: Mapping[str, str] | None = None,
) -> web.Application:
    """The app of one fake workstation; its ``LiveStation`` lives from startup to cleanup.

    Args:
        gpu: the GPU's name, as ``/gpus`` reports it.
        sizes: each model's parameter size, as ``/api/tags`` reports it ("8.0B").
    """
    app = web.Application(client_max_size=64 * 1024 * 1024)
    params = sizes or {}

    async def station_ctx(app: web.Application) -> AsyncIterator[None]:
        app[STATION] = LiveStation(spec, models, compression)
        yield
        app[STATION].close()

    async def tags(request: web.Request) -> web.Response:
        ws = request.app[STATION]
        return web.json_response({"models": [_entry(ws, n, params) for n in ws.models]})

    async def ps(request: web.Request) -> web.Response:
        ws = request.app[STATION]
        ws.advance()
        rows = [
            {
                **_entry(ws, n, params),
                "size": int(r.vram * GB),
                "size_vram": int(r.vram * GB),
                "expires_at": _expires(ws, r),
                "context_length": r.context.tokens,
            }
            for n, r in ws.runners.items()
        ]
        return web.json_response({"models": rows})

    async def show(request: web.Request) -> web.Response:
        ws = request.app[STATION]
        name = _model(request, await request.json())
        if name not in ws.models:
            return _error(request, 404, f"model '{name}' not found")
        caps = ["embedding"] if ws.models[name].kind == "embedding" else ["completion", "tools"]
        info = {"modelfile": "", "parameters": "", "template": "", "model_info": {}, "capabilities": caps}
        return web.json_response({**info, "details": _details(ws, name, params), "modified_at": "2026-11-01T12:00:00Z"})

    async def gpus(request: web.Request) -> web.Response:
        """One reading in the shape of ``mr agent``'s ``GET /gpus``."""
        ws = request.app[STATION]
        ws.advance()
        total, used = int((spec.vram or 0.0) * GB), int(ws.station.used_vram() * GB)
        reading = {
            "index": 0,
            "name": gpu,
            "uuid": f"GPU-fake-{spec.name}",
            "memory_total": total,
            "memory_used": used,
            "memory_free": total - used,
            "utilization_gpu": 100 if ws.station.active else 0,
            "utilization_memory": None,
            "temperature_c": None,
            "power_w": None,
            "power_limit_w": None,
            "processes": None,
        }
        return web.json_response([reading])

    async def stats(request: web.Request) -> web.Response:
        ws = request.app[STATION]
        st, s = ws.station, ws.stats
        counts = {"loads": st.loads, "load_seconds": st.load_seconds, "evictions": st.evictions}
        counts |= {"expiries": st.expirations, "busy": s.busy, "requests": s.requests, "tokens": s.tokens}
        counts |= {"prompt_tokens": s.prompt_tokens, "computed_tokens": s.computed_tokens}
        return web.json_response({**counts, "resident": sorted(ws.runners)})

    async def trace(request: web.Request) -> web.Response:
        return web.json_response(request.app[STATION].trace)

    async def text(_request: web.Request) -> web.Response:
        return web.Response(text="Ollama is running")

    async def version(_request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    async def models_route(request: web.Request) -> web.Response:
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "library"} for n in request.app[STATION].models]
        return web.json_response({"object": "list", "data": data})

    async def health(_request: web.Request) -> web.Response:
        return web.json_response(
            {"status": "ok", "version": VERSION, "gpus": 1, "nvml": True, "reading_age_seconds": 0}
        )

    app.cleanup_ctx.append(station_ctx)
    for path in ("/api/chat", "/api/generate", "/api/embed", "/v1/chat/completions", "/v1/embeddings"):
        app.router.add_post(path, _generate)
    app.router.add_post("/api/show", show)
    for path, handler in (
        ("/", text),
        ("/api/version", version),
        ("/api/tags", tags),
        ("/api/ps", ps),
        ("/v1/models", models_route),
        ("/gpus", gpus),
        ("/health", health),
        ("/bench/stats", stats),
        ("/bench/trace", trace),
    ):
        app.router.add_get(path, handler)
    return app


async def serve(compression: float, sharing: str, name: str, ports: list[int]) -> None:
    """The pool ``name`` of ``_pools.py`` on ``ports``, until cancelled."""
    from _pools import GPUS, MODELS, PARAMETERS, pool, served

    runners = []
    for spec, port in zip(pool(sharing, name), ports, strict=False):
        app = create_app(served(spec), MODELS, compression, GPUS.get(spec.name, "NVIDIA A100 80GB PCIe"), PARAMETERS)
        runner = web.AppRunner(app, access_log=None)
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
        run(serve(float(sys.argv[1]), sys.argv[2], sys.argv[3], [int(p) for p in sys.argv[4:]]))
