"""Fake inference servers for tests: real aiohttp servers on 127.0.0.1 that speak the real wire formats.

    async with FakeOllama(models=["llama3.2:latest"], loaded=["llama3.2:latest"]) as ollama:
        ...  # point a backend at ollama.url
        assert ollama.requests == 1 and ollama.cancelled == 0

    async with FakeOpenAI(flavor="vllm", models=["qwen"], max_concurrent=2) as vllm: ...

Every number is deterministic, so tests can assert exact values:

- A completion is the words ``tok0 tok1 ... tok{n-1}``, one token per word and
  one stream chunk per token. ``n`` is ``completion_tokens`` (default 8), or
  the client's ``max_tokens`` / ``max_completion_tokens`` / ``num_predict``
  when that is smaller, and then the finish reason is "length", else "stop".
- Prompt tokens are the whitespace-separated words of all the prompt text:
  every message's text, the prompt and system, or the embedding inputs.
- Usage is reported in the engine's real fields: OpenAI ``usage`` (for
  streams only with ``stream_options.include_usage``), Ollama
  ``prompt_eval_count`` / ``eval_count`` on the final line.

Load and faults, all settable while the server runs:

- ``tokens_per_second``: pace of generation (None: as fast as possible).
- ``prefill_tokens_per_second``: pace of prompt processing: a request spends prompt tokens / this
  before its first token, holding its ``max_concurrent`` slot, as vLLM and Ollama do (Ollama's
  ``prompt_eval_duration`` reports it). None (the default): prompts take no time.
- ``max_concurrent``: requests beyond it wait in the fake's own FIFO and count
  as ``waiting`` (vLLM ``num_requests_waiting``, llama.cpp ``requests_deferred``).
- ``fail_next(n, status)``: the next n inference requests get that status.
- ``drop_next(after_chunks, times)``: cut the connection after K chunks (0:
  before any response).
- ``first_byte_delay``: seconds before the answer starts.
- ``hang_after``: after that many chunks a stream falls silent, its connection open (a hung GPU).
- ``load_seconds`` (Ollama): a request for a model that is not loaded waits this long first, sending
  nothing, as Ollama does while it loads one.
- ``await go_down()`` / ``await come_up()``: stop listening (connections are
  refused) and listen again on the same port.

Lies, as a backend on someone's workstation may tell them:

- ``usage_lies``: fields merged into the usage the fake reports (Ollama's final
  line, OpenAI's ``usage``), e.g. ``{"eval_count": -1000000}``; a :class:`Raw`
  value is written as it is, so ``Raw("1e400")`` or ``Raw("NaN")`` reach the wire.
- ``ignore_limits``: generate ``completion_tokens`` whatever ``max_tokens`` says.
- ``endless_line``: after that many chunks, a stream sends one line that never
  ends (bytes, no newline); None (the default) for none.
- ``embeddings_supported`` (llamacpp): False answers embeddings 501, as
  llama-server started without ``--embeddings`` does.

Counters: ``requests`` (inference requests received), ``in_flight`` (open now,
waiting ones included), ``max_seen_in_flight``, ``running``, ``waiting``,
``completed``, ``cancelled`` (the client went away before the end: proof that
the upstream connection was closed), ``dropped``, ``failed``; ``received``
holds (path, parsed body) of every inference request.

Fixtures ``fake_ollama``, ``fake_openai``, ``fake_vllm`` and ``fake_llamacpp``
are defined here; import them into a test module, or list this module in
``pytest_plugins``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from .ollama import FakeOllama
from .openai import FakeOpenAI
from .wire import TOOL_ARGUMENTS, Raw, Received, content_words, embedding, token

__all__ = [
    "TOOL_ARGUMENTS",
    "FakeOllama",
    "FakeOpenAI",
    "Raw",
    "Received",
    "content_words",
    "embedding",
    "fake_llamacpp",
    "fake_ollama",
    "fake_openai",
    "fake_vllm",
    "token",
]


@pytest.fixture
async def fake_ollama() -> AsyncIterator[FakeOllama]:
    async with FakeOllama(models=["llama3.2:latest", "nomic-embed-text:latest"], loaded=["llama3.2:latest"]) as fake:
        yield fake


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(flavor="openai", models=["gpt-test", "embed-test"]) as fake:
        yield fake


@pytest.fixture
async def fake_vllm() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(flavor="vllm", models=["qwen"], max_concurrent=4) as fake:
        yield fake


@pytest.fixture
async def fake_llamacpp() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(flavor="llamacpp", models=["tiny"], max_concurrent=2) as fake:
        yield fake
