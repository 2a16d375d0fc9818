"""A client's inference request, parsed and checked once: the dialects, the routes, :class:`Call`.

Only what would make every backend refuse the request, or break translation,
is checked here, and every number is held to a range a backend can use
(``numbers.py``); values within it that a backend judges itself pass.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from ..errors import RequestError
from ..scheduler.prefix import Prefix, message_chain
from . import responses_api
from ._shapes import Dialect, Kind, dumps
from .numbers import check_numbers, loads

__all__ = ["INFERENCE_PATHS", "Call", "inspect_body"]

_ROUTES: dict[str, tuple[Dialect, Kind]] = {
    "/v1/chat/completions": ("openai", "chat"),
    "/v1/completions": ("openai", "completion"),
    "/v1/embeddings": ("openai", "embeddings"),
    "/v1/responses": ("openai", "chat"),
    "/api/chat": ("ollama", "chat"),
    "/api/generate": ("ollama", "completion"),
    "/api/embed": ("ollama", "embeddings"),
    "/api/embeddings": ("ollama", "embeddings"),
}
INFERENCE_PATHS = frozenset(_ROUTES)
"""The paths :meth:`Call.from_request` accepts; everything else needs no GPU."""


def _fail(message: str) -> RequestError:
    return RequestError(message, status=400, type="invalid_request_error")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional(body: dict[str, Any], key: str, types: type | tuple[type, ...], what: str) -> Any:
    value = body.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
        raise _fail(f'"{key}" must be {what}.')
    return value


def _text_of(content: Any, where: str) -> tuple[int, bool]:
    """Characters of text and whether there is an image, for message content of either dialect."""
    if content is None:
        return 0, False
    if isinstance(content, str):
        return len(content), False
    if not isinstance(content, list):
        raise _fail(f"{where} content must be a string or a list of parts.")
    chars, image = 0, False
    for part in content:
        if not isinstance(part, dict):
            raise _fail(f'{where} content parts must be objects with a "type".')
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise _fail(f'{where} text parts need a string "text".')
            chars += len(text)
        elif kind in ("image_url", "input_image"):
            image = True
    return chars, image


def _messages(body: dict[str, Any], required: bool) -> tuple[int, bool]:
    messages = body.get("messages")
    if messages is None and not required:
        return 0, False
    if not isinstance(messages, list) or (required and not messages):
        raise _fail('"messages" must be a non-empty list of {"role", "content"} objects.')
    chars, image = 0, False
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _fail(f'messages[{i}] must be an object with a string "role".')
        n, has = _text_of(message.get("content"), f"messages[{i}]")
        images = message.get("images")
        if images is not None and not (isinstance(images, list) and all(isinstance(x, str) for x in images)):
            raise _fail(f"messages[{i}].images must be a list of base64 strings.")
        chars += n
        image = image or has or bool(images)
    return chars, image


def _strings(value: Any, key: str, *, tokens_ok: bool) -> int:
    """Characters in a string or list of strings (OpenAI also allows token arrays)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list) and value:
        if all(isinstance(x, str) for x in value):
            return sum(len(x) for x in value)
        if tokens_ok and all(_is_int(x) or isinstance(x, list) for x in value):
            return 4 * sum(len(x) if isinstance(x, list) else 1 for x in value)
    raise _fail(f'"{key}" must be a string or a non-empty list of strings.')


_ZERO_DURATION = re.compile(r"0+(\.0*)?(ns|us|µs|ms|s|m|h)?")


def _unloads(keep_alive: Any) -> bool:
    """Whether an Ollama ``keep_alive`` asks the model unloaded once idle: 0, or a zero duration ("0", "0s", "0m")."""
    if isinstance(keep_alive, (int, float)) and not isinstance(keep_alive, bool):
        return keep_alive == 0
    return isinstance(keep_alive, str) and _ZERO_DURATION.fullmatch(keep_alive.strip()) is not None


def inspect_body(dialect: Dialect, kind: Kind, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """Check ``body`` and return the remaining :class:`~mindrouter.backends.base.Call` fields.

    Raises:
        RequestError: 400, naming the field that is wrong.
    """
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise _fail('"model" is required and must be a non-empty string.')
    default_stream = dialect == "ollama" and kind != "embeddings"
    stream = body.get("stream", default_stream)
    if stream is None:
        stream = default_stream
    if not isinstance(stream, bool):
        raise _fail('"stream" must be true or false.')
    if kind == "embeddings":
        stream = False
    check_numbers(dialect, body)
    hints: dict[str, Any] = {"model": model, "stream": stream}

    if dialect == "openai":
        options = body
        max_tokens = _optional(body, "max_completion_tokens", int, "a positive integer")
        if max_tokens is None:
            max_tokens = _optional(body, "max_tokens", int, "a positive integer")
        stream_options = _optional(body, "stream_options", dict, "an object")
        hints["wants_usage"] = bool(stream and stream_options and stream_options.get("include_usage") is True)
        fmt = _optional(body, "response_format", dict, 'an object such as {"type": "json_object"}')
        hints["json_mode"] = bool(fmt) and fmt.get("type") in ("json_object", "json_schema")
    else:
        options = _optional(body, "options", dict, "an object") or {}
        max_tokens = _optional(options, "num_predict", int, "an integer")
        if max_tokens is not None and max_tokens < 0:  # -1: unlimited, -2: fill the context
            max_tokens = None
        context = _optional(options, "num_ctx", int, "a positive integer")
        hints["context_tokens"] = context
        fmt = body.get("format")
        if fmt is not None and not isinstance(fmt, (str, dict)):
            raise _fail('"format" must be "json" or a JSON schema object.')
        hints["json_mode"] = bool(fmt)
        hints["unload_after"] = _unloads(body.get("keep_alive"))
    hints["max_tokens"] = max_tokens
    for key in ("temperature", "top_p"):
        _optional(options, key, (int, float), "a number")
    _optional(options, "seed", int, "an integer")
    stop = options.get("stop")
    if (
        stop is not None
        and not isinstance(stop, str)
        and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise _fail('"stop" must be a string or a list of strings.')

    chars, image = 0, False
    if kind == "chat":
        chars, image = _messages(body, required=dialect == "openai")
        hints["prefix"] = message_chain(body.get("messages") or [])
    elif kind == "completion":
        prompt = body.get("prompt")
        if dialect == "openai":
            chars = _strings(prompt, "prompt", tokens_ok=True)
        else:
            if prompt is not None and not isinstance(prompt, str):
                raise _fail('"prompt" must be a string.')
            chars = len(prompt or "") + len(_optional(body, "system", str, "a string") or "")
            images = body.get("images")
            if images is not None and not (isinstance(images, list) and all(isinstance(x, str) for x in images)):
                raise _fail('"images" must be a list of base64 strings.')
            image = bool(images)
    elif path == "/api/embeddings":
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise _fail('"prompt" must be a string.')
        chars = len(prompt)
    else:
        chars = _strings(body.get("input"), "input", tokens_ok=dialect == "openai")
    hints["has_images"] = image
    hints["prompt_tokens"] = (chars + 3) // 4
    return hints


@dataclass(frozen=True, slots=True)
class Call:
    """One inference request as a client sent it, checked once by the daemon.

    Only the bytes are kept, not the parsed body: a request may wait in the
    queue for minutes among thousands, and its parsed JSON takes several times
    its bytes (which aiohttp keeps anyway). The hint fields (``has_images`` to
    ``prompt_tokens``, ``n``, ``user``) are what admission and the scheduler's
    Job need; :attr:`body` parses the bytes again for a translation.
    """

    dialect: Dialect
    kind: Kind
    path: str
    raw: bytes
    """The body as received (or as translated into chat completions), forwarded unchanged when it can be."""
    stream: bool
    model: str
    wants_usage: bool = False
    """An OpenAI streaming client set ``stream_options.include_usage``."""
    has_images: bool = False
    json_mode: bool = False
    """JSON mode or a JSON schema was asked for (``response_format`` / ``format``)."""
    max_tokens: int | None = None
    context_tokens: int | None = None
    """Ollama ``options.num_ctx``, for the VRAM estimate."""
    prompt_tokens: int = 0
    """Estimate: characters of prompt text / 4."""
    unload_after: bool = False
    """Ollama's ``keep_alive`` 0: the model is unloaded once this request ends (and nothing else runs on it)."""
    prefix: Prefix = ()
    """A chat's messages hashed in a chain, for routing it where its history is cached (``scheduler/prefix.py``)."""
    responses: bool = False
    """The client called the Responses API: ``body`` is its chat completions equivalent."""
    native: bytes | None = None
    """A Responses API body as the client sent it, for engines that serve /v1/responses themselves."""
    n: Any = None
    """The body's ``"n"`` (answers asked for) as sent."""
    user: Any = None
    """The body's ``"user"`` as sent: the person behind a proxy, checked by ``auth.on_behalf``."""

    @property
    def body(self) -> dict[str, Any]:
        """The body, parsed again from :attr:`raw` on each use (read it once per translation).

        It was checked when the call was made, so it parses as it did then.
        """
        body = loads(self.raw)
        assert isinstance(body, dict)
        return body

    def capped(self, tokens: int) -> Call:
        """This call with its answer held to ``tokens``, as its dialect says it (a quota's share, where the
        client named no limit)."""
        body = self.body
        if self.dialect == "ollama":
            body["options"] = {**(body.get("options") or {}), "num_predict": tokens}
        else:
            body["max_tokens"] = tokens
        native = self.native if self.native is None else dumps({**json.loads(self.native), "max_output_tokens": tokens})
        return replace(self, raw=dumps(body), max_tokens=tokens, native=native)

    def as_sent(self) -> Call:
        """This Responses API call as the client sent it (``path`` /v1/responses), to pass through."""
        assert self.native is not None
        return replace(self, path="/v1/responses", raw=self.native, native=None)

    @classmethod
    def from_request(cls, path: str, raw: bytes) -> Call:
        """Parse and check a client's body.

        Args:
            path (str): one of :data:`INFERENCE_PATHS`.
            raw (bytes): the request body.

        Raises:
            RequestError: 404 for another path; 400, with one sentence naming
                the field, for a body no backend could use.
        """
        route = _ROUTES.get(path)
        if route is None:
            raise RequestError(f"{path} is not an inference endpoint.", status=404, code="not_found")
        dialect, kind = route
        body = loads(raw)
        if not isinstance(body, dict):
            raise RequestError("The request body must be a JSON object.")
        api = path == "/v1/responses"
        native = raw if api else None
        if api:  # served as chat completions, answered in the Responses API's shapes
            check_numbers(dialect, body)  # before translation, so an error names the client's own field
            body = responses_api.to_chat(body)
            path, raw = "/v1/chat/completions", dumps(body)
        hints = inspect_body(dialect, kind, path, body)
        return cls(
            dialect=dialect,
            kind=kind,
            path=path,
            raw=raw,
            responses=api,
            native=native,
            n=body.get("n"),
            user=body.get("user"),
            **hints,
        )
