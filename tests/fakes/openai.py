"""A fake OpenAI-compatible server, as OpenAI, vLLM or llama-server: models, chat, completions, embeddings,
and each engine's own routes (/health, /metrics, /version, /slots, /props)."""

from __future__ import annotations

import base64
import json
import struct
import time
from collections.abc import Iterable
from functools import partial
from typing import Any

from aiohttp import web

from . import responses
from .server import _FakeServer
from .wire import (
    TOOL_ARGUMENTS,
    _compact,
    _pieces,
    _words,
    argument_pieces,
    content_words,
    embedding,
    logprobs_of,
    tool_to_call,
)


class FakeOpenAI(_FakeServer):
    """An OpenAI-compatible server: /v1/models, chat, completions, embeddings and (not llamacpp) responses.

    Args:
        flavor: "openai" (no /health, no /metrics; ``"usage": null`` on every
            chunk of a usage stream, as OpenAI does), "vllm" (/health,
            /metrics, /version) or "llamacpp" (/health, /slots, /metrics, /props).
        slots: llama.cpp's slot count. Defaults to ``max_concurrent`` or 4.
        vision: the model takes images (llama.cpp: /props ``modalities.vision``, a multimodal projector is
            loaded). Without it, vLLM and llama-server refuse image parts (400 and 500). Defaults to False.

    As vLLM does, an assistant tool call without ``id``/``type``/``function.name`` and a tool message
    without ``tool_call_id`` are 400. Embeddings take token arrays as well as text. /v1/responses calls
    the first function tool offered (a ``function_call`` item, or vLLM's events for it) unless the input
    ends with its ``function_call_output``, and refuses a tool without a top-level ``name`` or a call or
    output without ``call_id`` (400), as vLLM does.
    """

    def __init__(
        self, *, flavor: str = "openai", slots: int | None = None, vision: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if flavor not in ("openai", "vllm", "llamacpp"):
            raise ValueError(f"unknown flavor {flavor!r}")
        self.flavor = flavor
        self.slots = slots or self.max_concurrent or 4
        self.vision = vision
        self.metrics_enabled = True
        self.slots_enabled = True
        self.legacy_metrics = False
        """vLLM: export vllm:gpu_cache_usage_perc instead of vllm:kv_cache_usage_perc."""
        self.usage_in_final_chunk = False
        """Put stream usage on the finish_reason chunk instead of a separate chunk (older servers)."""
        self.kv_cache_usage: float | None = None
        """Override the exported KV-cache usage (default: running / slots)."""
        self.embeddings_supported = True
        """llamacpp: False answers /v1/embeddings 501, as llama-server without --embeddings does."""
        self._ids = 0

    def add_routes(self, router: web.UrlDispatcher) -> None:
        self.route(router, "GET", "/v1/models", self._models)
        self.route(router, "POST", "/v1/chat/completions", self._chat, inference=True)
        self.route(router, "POST", "/v1/completions", self._completion, inference=True)
        self.route(router, "POST", "/v1/embeddings", self._embeddings, inference=True)
        if self.flavor != "llamacpp":
            self.route(router, "POST", "/v1/responses", partial(responses.answer, self), inference=True)
        if self.flavor != "openai":
            self.route(router, "GET", "/health", self._health)
            self.route(router, "GET", "/metrics", self._metrics)
        if self.flavor == "vllm":
            self.route(router, "GET", "/version", self._version)
        if self.flavor == "llamacpp":
            self.route(router, "GET", "/slots", self._slots)
            self.route(router, "GET", "/props", self._props)

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.9.1"})

    async def _props(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "total_slots": self.slots,
                "build_info": "b5000-fake",
                "model_path": "/models/fake.gguf",
                "modalities": {"vision": self.vision, "audio": False},
            }
        )

    def error(self, status: int, message: str) -> web.Response:
        kind = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "server_error")
        if self.flavor == "vllm":
            err: dict[str, Any] = {
                "message": message,
                "type": "BadRequestError" if status < 500 else "InternalServerError",
                "param": None,
                "code": status,
            }
        elif self.flavor == "llamacpp":
            err = {"code": status, "message": message, "type": kind}
        else:
            err = {"message": message, "type": kind, "param": None, "code": None}
        return web.Response(status=status, body=_compact({"error": err}), content_type="application/json")

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "created": 1700000000, "owned_by": self.flavor} for m in self.models]
        if self.flavor == "vllm":
            data = [dict(d, root=d["id"], parent=None, max_model_len=4096) for d in data]
        return web.json_response({"object": "list", "data": data})

    async def _health(self, request: web.Request) -> web.Response:
        if self.health_status != 200:
            if self.flavor == "llamacpp":
                return self.error(self.health_status, "Loading model")
            return web.Response(status=self.health_status)
        return web.json_response({"status": "ok"}) if self.flavor == "llamacpp" else web.Response()

    def _not_enabled(self, what: str) -> web.Response:
        err = {
            "code": 501,
            "message": f"This server does not support {what} endpoint. Start it with `--{what}`",
            "type": "not_supported_error",
        }
        return web.Response(status=501, body=_compact({"error": err}), content_type="application/json")

    async def _slots(self, request: web.Request) -> web.Response:
        if not self.slots_enabled:
            return self._not_enabled("slots")
        busy = min(self.running, self.slots)
        return web.json_response(
            [
                {
                    "id": i,
                    "id_task": i if i < busy else -1,
                    "n_ctx": 2048,
                    "speculative": False,
                    "is_processing": i < busy,
                    "params": {"n_predict": -1},
                }
                for i in range(self.slots)
            ]
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        if not self.metrics_enabled:
            return self._not_enabled("metrics") if self.flavor == "llamacpp" else web.Response(status=404)
        kv = self.kv_cache_usage if self.kv_cache_usage is not None else min(1.0, self.running / self.slots)
        if self.flavor == "llamacpp":
            rows = [
                ("prompt_tokens_total", "counter", self.prompt_tokens_total),
                ("tokens_predicted_total", "counter", self.completion_tokens_total),
                ("n_decode_total", "counter", self.completed),
                ("predicted_tokens_seconds", "gauge", self.tokens_per_second or 0),
                ("requests_processing", "gauge", self.running), ("requests_deferred", "gauge", self.waiting),
                ("n_busy_slots_per_decode", "gauge", float(self.running)),
            ]  # fmt: skip
            text = "".join(f"# HELP llamacpp:{n} {n}\n# TYPE llamacpp:{n} {t}\nllamacpp:{n} {v}\n" for n, t, v in rows)
        else:
            label = f'{{engine="0",model_name="{next(iter(self.models))}"}}'
            rows = [
                ("num_requests_running", "gauge", self.running), ("num_requests_waiting", "gauge", self.waiting),
                ("gpu_cache_usage_perc" if self.legacy_metrics else "kv_cache_usage_perc", "gauge", kv),
                ("prompt_tokens_total", "counter", self.prompt_tokens_total),
                ("generation_tokens_total", "counter", self.completion_tokens_total),
            ]  # fmt: skip
            text = "".join(
                f"# HELP vllm:{n} {n}\n# TYPE vllm:{n} {t}\nvllm:{n}{label} {float(v)}\n" for n, t, v in rows
            )
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    def _check(self, body: dict[str, Any]) -> web.Response | None:
        if not isinstance(body.get("model"), str) or body["model"] not in self.models:
            return self.error(404, f"The model `{body.get('model')}` does not exist.")
        if body.get("stream_options") is not None and not body.get("stream"):
            return self.error(400, "The 'stream_options' parameter is only allowed when 'stream' is enabled.")
        return None

    def _check_messages(self, messages: list[Any]) -> web.Response | None:
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                return self.error(400, "each message needs a role")
            for c in m.get("tool_calls") or ():
                fn = c.get("function") if isinstance(c, dict) else None
                if not (isinstance(fn, dict) and isinstance(fn.get("name"), str) and c.get("id") and c.get("type")):
                    return self.error(400, "1 validation error: tool_calls.0.id Field required")
            if m["role"] == "tool" and not m.get("tool_call_id"):
                return self.error(400, "1 validation error: tool_call_id Field required")
            content = m.get("content")
            parts = content if isinstance(content, list) else ()
            if any(isinstance(p, dict) and p.get("type") == "image_url" for p in parts) and not self.vision:
                if self.flavor == "llamacpp":
                    return self.error(500, "image input is not supported - hint: you may need to provide the mmproj")
                return self.error(400, "this model does not support image input")
        return None

    async def _chat(self, request: web.Request, body: dict[str, Any], drop_after: int | None) -> web.StreamResponse:
        if (bad := self._check(body)) is not None:
            return bad
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return self.error(400, "messages must be a non-empty list")
        if (bad := self._check_messages(messages)) is not None:
            return bad
        prompt = sum(content_words(m.get("content")) for m in messages if isinstance(m, dict))
        return await self._answer(request, body, prompt, True, drop_after)

    async def _completion(
        self, request: web.Request, body: dict[str, Any], drop_after: int | None
    ) -> web.StreamResponse:
        if (bad := self._check(body)) is not None:
            return bad
        prompt = body.get("prompt")
        words = sum(map(_words, prompt)) if isinstance(prompt, list) else _words(prompt)
        return await self._answer(request, body, words, False, drop_after)

    async def _answer(
        self, request: web.Request, body: dict[str, Any], prompt: int, chat: bool, drop_after: int | None
    ) -> web.StreamResponse:
        gen = self.generation(prompt, body.get("max_completion_tokens", body.get("max_tokens")))
        await self.prefill(gen)
        self._ids += 1
        head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-fake{self._ids}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": body["model"],
        }
        usage = {
            "prompt_tokens": gen.prompt_tokens,
            "completion_tokens": gen.n,
            "total_tokens": gen.prompt_tokens + gen.n,
            **self.usage_lies,
        }
        tool = tool_to_call(body) if chat else None
        call_id = f"chatcmpl-tool-{self._ids}"
        fmt = body.get("response_format")
        json_wanted = isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")
        pieces = [] if tool else _pieces(gen, json_wanted)
        finish = "tool_calls" if tool else "stop" if json_wanted else gen.finish  # JSON is always a whole object
        if not body.get("stream"):
            await self.pace(time.monotonic(), gen.n)
            if chat:
                message: dict[str, Any] = {"role": "assistant", "content": "".join(pieces) if not tool else None}
                if tool:
                    arguments = json.dumps(TOOL_ARGUMENTS)
                    message["tool_calls"] = [
                        {"id": call_id, "type": "function", "function": {"name": tool, "arguments": arguments}}
                    ]
                logprobs = logprobs_of(body, pieces)
                choice = {
                    "index": 0,
                    "message": message,
                    "logprobs": None if logprobs is None else {"content": logprobs},
                    "finish_reason": finish,
                }
            else:
                choice = {"text": "".join(pieces), "index": 0, "logprobs": None, "finish_reason": finish}
            self.count(gen)
            return web.Response(
                body=_compact(dict(head, choices=[choice], usage=usage)), content_type="application/json"
            )
        include = bool((body.get("stream_options") or {}).get("include_usage"))
        if chat:
            head["object"] = "chat.completion.chunk"
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)

        def event(choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> bytes:
            obj = dict(head, choices=choices)
            if include and self.flavor == "openai":
                obj["usage"] = None
            obj.update(extra or {})
            return b"data: " + _compact(obj) + b"\n\n"

        def make_choice(
            text: str | None, finish: str | None, first: bool = False, calls: list[Any] | None = None, i: int = 0
        ) -> dict[str, Any]:
            if not chat:
                return {"text": text or "", "index": 0, "logprobs": None, "finish_reason": finish}
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            if calls:
                delta["tool_calls"] = calls
            logprobs = logprobs_of(body, [text], i) if text else None
            return {
                "index": 0,
                "delta": delta,
                "logprobs": None if logprobs is None else {"content": logprobs},
                "finish_reason": finish,
            }

        def chunks() -> Iterable[bytes]:
            if tool:  # as vLLM streams a call: id and name first, then the arguments in fragments
                head_call = {"index": 0, "id": call_id, "type": "function", "function": {"name": tool, "arguments": ""}}
                yield event([make_choice(None, None, first=True, calls=[head_call])])
                for fragment in argument_pieces():
                    yield event([make_choice(None, None, calls=[{"index": 0, "function": {"arguments": fragment}}])])
            for i, piece in enumerate(pieces):
                yield event([make_choice(piece, None, first=i == 0, i=i)])
            last = {"usage": usage} if include and self.usage_in_final_chunk else None
            tail = event([make_choice(None, finish)], last)
            if include and not self.usage_in_final_chunk:
                tail += event([], {"usage": usage})
            yield tail + b"data: [DONE]\n\n"

        await self.write_chunks(request, resp, chunks(), drop_after)
        self.count(gen)
        await resp.write_eof()
        return resp

    async def _embeddings(
        self, request: web.Request, body: dict[str, Any], drop_after: int | None
    ) -> web.StreamResponse:
        if not self.embeddings_supported:  # llama-server's own words and shape
            err = {
                "code": 501,
                "message": "This server does not support embeddings. Start it with `--embeddings`",
                "type": "not_supported_error",
            }
            return web.Response(status=501, body=_compact({"error": err}), content_type="application/json")
        if (bad := self._check(body)) is not None:
            return bad
        inputs = body.get("input")
        if isinstance(inputs, str) or (isinstance(inputs, list) and inputs and all(isinstance(x, int) for x in inputs)):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs or not all(isinstance(x, (str, list)) for x in inputs):
            return self.error(400, "input must be a string, a list of strings or token arrays")
        inputs = [x if isinstance(x, str) else " ".join(f"t{t}" for t in x) for x in inputs]  # a token is a word
        words = sum(map(_words, inputs))
        self.prompt_tokens_total += words
        data = []
        for i, text in enumerate(inputs):
            vec: Any = embedding(text, self.embedding_dim)
            if body.get("encoding_format") == "base64":
                vec = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
            data.append({"object": "embedding", "index": i, "embedding": vec})
        answer = {
            "object": "list",
            "data": data,
            "model": body["model"],
            "usage": {"prompt_tokens": words, "total_tokens": words, **self.usage_lies},
        }
        return web.Response(body=_compact(answer), content_type="application/json")
