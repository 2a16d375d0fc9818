"""A fake Ollama: /api's tags, ps, version, show, chat, generate and embeddings, as Ollama answers them."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from .server import _FakeServer
from .wire import TOOL_ARGUMENTS, _compact, _pieces, _words, content_words, embedding, logprobs_of, tool_to_call


def _is_base64(value: Any) -> bool:
    try:
        base64.b64decode(value, validate=True)
    except (ValueError, TypeError):
        return False
    return isinstance(value, str)


class FakeOllama(_FakeServer):
    """Ollama's /api: tags, ps, version, show, chat, generate, embed and the older embeddings.

    Args:
        autoload: a request for a model that is not loaded loads it, as Ollama does. Defaults to True.
        load_seconds: how long that load takes, sending nothing. Defaults to 0.
        capabilities: /api/show ``capabilities`` per model. Defaults to ["completion", "tools"]. As
            real Ollama: chat to a model without "completion" and tools to one without "tools" are 400,
            images to one without "vision" a 500.
        version: what /api/version says.
    """

    def __init__(
        self,
        *,
        autoload: bool = True,
        capabilities: Mapping[str, list[str]] | None = None,
        version: str = "0.6.5",
        load_seconds: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.autoload = autoload
        self.load_seconds = load_seconds
        self.capabilities = dict(capabilities or {})
        self.version = version
        self.show_requests = 0

    def add_routes(self, router: web.UrlDispatcher) -> None:
        self.route(router, "GET", "/", self._root)
        self.route(router, "GET", "/api/tags", self._tags)
        self.route(router, "GET", "/api/ps", self._ps)
        self.route(router, "GET", "/api/version", self._version)
        self.route(router, "POST", "/api/show", self._show)
        self.route(router, "POST", "/api/chat", self._chat, inference=True)
        self.route(router, "POST", "/api/generate", self._generate, inference=True)
        self.route(router, "POST", "/api/embed", self._embed, inference=True)
        self.route(router, "POST", "/api/embeddings", self._embed, inference=True)

    async def _root(self, request: web.Request) -> web.Response:
        return web.Response(text="Ollama is running")

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.version})

    def error(self, status: int, message: str) -> web.Response:
        return web.Response(status=status, body=_compact({"error": message}), content_type="application/json")

    def known(self, model: str) -> str | None:
        for name in (model, model + ":latest"):
            if name in self.models:
                return name
        return None

    def _entry(self, name: str) -> dict[str, Any]:
        return {
            "name": name,
            "model": name,
            "modified_at": "2025-01-01T00:00:00.000000000Z",
            "size": self.models[name],
            "digest": hashlib.sha256(name.encode()).hexdigest(),
            "details": {
                "parent_model": "",
                "format": "gguf",
                "family": "llama",
                "families": ["llama"],
                "parameter_size": "3.2B",
                "quantization_level": "Q4_K_M",
            },
        }

    async def _tags(self, request: web.Request) -> web.Response:
        return web.json_response({"models": [self._entry(m) for m in self.models]})

    async def _ps(self, request: web.Request) -> web.Response:
        running = [
            dict(self._entry(m), expires_at="2030-01-01T00:00:00Z", size_vram=self.models[m])
            for m in self.models
            if m in self.loaded
        ]
        return web.json_response({"models": running})

    async def _show(self, request: web.Request) -> web.Response:
        self.show_requests += 1
        body = await request.json()
        name = self.known(body.get("model") or body.get("name") or "")
        if name is None:
            return self.error(404, f"model '{body.get('model')}' not found")
        entry = self._entry(name)
        return web.json_response(
            {
                "modelfile": f"FROM {name}",
                "parameters": "",
                "template": "{{ .Prompt }}",
                "details": entry["details"],
                "model_info": {"general.architecture": "llama"},
                "capabilities": self.caps(name),
            }
        )

    def caps(self, name: str) -> list[str]:
        return self.capabilities.get(name, ["completion", "tools"])

    def _refuse(self, name: str, body: dict[str, Any], images: list[Any]) -> web.Response | None:
        """What real Ollama answers to a request the model cannot take, or None."""
        caps = self.caps(name)
        if "completion" not in caps:
            return self.error(400, f'"{name}" does not support generate')
        if body.get("tools") and "tools" not in caps:
            return self.error(400, f"registry.ollama.ai/library/{name} does not support tools")
        if not all(_is_base64(i) for i in images):
            return self.error(400, "illegal base64 data at input byte 4")
        if images and "vision" not in caps:
            return self.error(500, "this model is missing data required for image input")
        return None

    def _now(self) -> str:
        return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def _resolve(self, body: dict[str, Any]) -> str | web.Response:
        name = self.known(str(body.get("model", "")))
        if name is None:
            return self.error(404, f'model "{body.get("model")}" not found, try pulling it first')
        if name not in self.loaded:
            if not self.autoload:
                return self.error(500, f'model "{name}" is not loaded')
            self.loaded.add(name)
        return name

    async def _chat(self, request: web.Request, body: dict[str, Any], drop_after: int | None) -> web.StreamResponse:
        messages = body.get("messages")
        if messages is not None and not isinstance(messages, list):
            return self.error(400, "messages must be a list")
        prompt = sum(content_words(m.get("content")) for m in messages or ())
        images = [i for m in messages or () if isinstance(m, dict) for i in m.get("images") or ()]
        return await self._answer(request, body, prompt, "message", drop_after, empty=not messages, images=images)

    async def _generate(self, request: web.Request, body: dict[str, Any], drop_after: int | None) -> web.StreamResponse:
        prompt = body.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            return self.error(400, "prompt must be a string")
        words = _words(prompt) + _words(body.get("system"))
        images = body.get("images") or []
        return await self._answer(
            request, body, words, "response", drop_after, empty=not prompt and not images, images=images
        )

    async def _answer(
        self,
        request: web.Request,
        body: dict[str, Any],
        prompt: int,
        key: str,
        drop_after: int | None,
        empty: bool,
        images: list[Any],
    ) -> web.StreamResponse:
        cold = self.known(str(body.get("model", ""))) not in self.loaded
        name = self._resolve(body)
        if isinstance(name, web.Response):
            return name
        if cold and self.load_seconds:
            await asyncio.sleep(self.load_seconds)
        if (refused := self._refuse(name, body, images)) is not None:
            return refused
        model = body["model"]
        stream = body.get("stream", True) is not False
        tool = tool_to_call(body) if key == "message" else None

        def part(text: str, call: bool = False) -> dict[str, Any]:
            if key == "response":
                return {"response": text}
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if call:
                message["tool_calls"] = [{"function": {"name": tool, "arguments": TOOL_ARGUMENTS}}]
            return {"message": message}

        if empty:  # Ollama's "load the model" call
            return web.Response(
                body=_compact(
                    {"model": model, "created_at": self._now(), **part(""), "done_reason": "load", "done": True}
                ),
                content_type="application/json",
            )
        gen = self.generation(prompt, (body.get("options") or {}).get("num_predict"))
        begun = time.monotonic_ns()
        prefill_ns = await self.prefill(gen)
        started = time.monotonic_ns()
        final = {
            "model": model, "created_at": "", **part(""), "done_reason": gen.finish, "done": True,
            "total_duration": 0, "load_duration": 1000, "prompt_eval_count": gen.prompt_tokens,
            "prompt_eval_duration": prefill_ns or 1000, "eval_count": gen.n, "eval_duration": 0,
        }  # fmt: skip
        if key == "response":
            final["context"] = [1, 2, 3]
        final.update(self.usage_lies)
        pieces = [] if tool else _pieces(gen, bool(body.get("format")))
        if body.get("format"):
            final["done_reason"] = "stop"  # a JSON answer is always a whole object
        if not stream:
            await self.pace(time.monotonic(), gen.n)
            if (logprobs := logprobs_of(body, pieces)) is not None:
                final["logprobs"] = logprobs
            final.update(
                part("".join(pieces), call=tool is not None),
                created_at=self._now(),
                total_duration=time.monotonic_ns() - begun,
                eval_duration=max(1, time.monotonic_ns() - started),
            )
            self.count(gen)
            return web.Response(body=_compact(final), content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)

        def lines() -> Iterable[bytes]:
            if tool:
                yield _compact({"model": model, "created_at": self._now(), **part("", True), "done": False}) + b"\n"
            for i, piece in enumerate(pieces):
                line = {"model": model, "created_at": self._now(), **part(piece), "done": False}
                if (logprobs := logprobs_of(body, [piece], i)) is not None:
                    line["logprobs"] = logprobs
                yield _compact(line) + b"\n"
            final.update(
                created_at=self._now(),
                total_duration=time.monotonic_ns() - begun,
                eval_duration=max(1, time.monotonic_ns() - started),
            )
            yield _compact(final) + b"\n"

        await self.write_chunks(request, resp, lines(), drop_after)
        self.count(gen)
        await resp.write_eof()
        return resp

    async def _embed(self, request: web.Request, body: dict[str, Any], drop_after: int | None) -> web.StreamResponse:
        name = self._resolve(body)
        if isinstance(name, web.Response):
            return name
        if request.path == "/api/embeddings":
            prompt = body.get("prompt", "")
            self.prompt_tokens_total += _words(prompt)
            return web.json_response({"embedding": embedding(prompt, self.embedding_dim)})
        inputs = body.get("input")
        inputs = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(inputs, list) or not all(isinstance(x, str) for x in inputs):
            return self.error(400, "input must be a string or a list of strings")
        if any(0xD800 <= ord(c) <= 0xDFFF for x in inputs for c in x):  # a lone UTF-16 surrogate, as Ollama fails it
            return self.error(500, "failed to encode response: json: invalid UTF-8 in string")
        words = sum(map(_words, inputs))
        self.prompt_tokens_total += words
        vectors = [embedding(x, self.embedding_dim) for x in inputs]
        answer = {
            "model": body["model"],
            "embeddings": vectors,
            "total_duration": 1000,
            "load_duration": 10,
            "prompt_eval_count": words,
            **self.usage_lies,
        }
        return web.Response(body=_compact(answer), content_type="application/json")
