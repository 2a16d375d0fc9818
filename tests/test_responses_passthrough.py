"""POST /v1/responses: passed through to engines that serve the Responses API, translated for the others.

vLLM and OpenAI-compatible servers answer /v1/responses themselves, so the client's body and the
backend's answer travel unchanged and usage is the backend's ``input_tokens``/``output_tokens``;
Ollama and llama-server get chat completions (the answer is rendered back, see test_conformance).
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from .conftest import Daemon
from .fakes import FakeOllama, FakeOpenAI

pytestmark = pytest.mark.asyncio

BODY = {
    "model": "m",
    "instructions": "be brief",
    "input": [{"role": "user", "content": [{"type": "input_text", "text": "what is the weather"}]}],
    "max_output_tokens": 3,
    "store": False,
    "reasoning": {"effort": "low"},
    "metadata": {"run": "7"},
}


async def usage_rows(daemon: Daemon) -> dict[str, tuple[int, int, int]]:
    report = await daemon.admin("GET", "/admin/usage?by=model")
    return {r["model"]: (r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in report["rows"]}


@pytest.mark.parametrize("engine", ["vllm", "openai"])
async def test_responses_pass_through_unchanged_and_are_charged_the_backends_numbers(
    daemon: Daemon, engine: str
) -> None:
    async with FakeOpenAI(flavor=engine, models=["m:latest"]) as fake:
        await daemon.backend("b1", fake.url, engine)
        key = await daemon.user("alice")
        auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        raw = json.dumps(BODY).encode()

        resp = await daemon.client.post("/v1/responses", data=raw, headers=auth)
        answer = await resp.json()
        sent = fake.received[-1]
        assert (sent.path, sent.body) == ("/v1/responses", dict(BODY, model="m:latest"))  # the backend's spelling
        assert answer["id"] == "resp_fake1" and answer["model"] == "m:latest" and answer["status"] == "incomplete"
        assert answer["output"][0]["content"][0]["text"] == "tok0 tok1 tok2"
        assert answer["usage"]["input_tokens"] == 6 and answer["usage"]["output_tokens"] == 3  # the backend's
        assert await usage_rows(daemon) == {"m": (1, 6, 3)}

        same = dict(BODY, model="m:latest", stream=True)
        raw = json.dumps(same).encode()
        resp = await daemon.client.post("/v1/responses", data=raw, headers=auth)
        text = (await resp.read()).decode()
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert fake.received[-1].raw == raw  # same spelling: the client's bytes, untouched
        events = [block.split("\n") for block in text.strip().split("\n\n")]
        kinds = [lines[0].removeprefix("event: ") for lines in events]
        assert kinds == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            *["response.output_text.delta"] * 3,
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.incomplete",
        ]
        payloads: list[dict[str, Any]] = [json.loads(lines[1].removeprefix("data: ")) for lines in events]
        assert [p["sequence_number"] for p in payloads] == list(range(11)) and payloads[0]["response"][
            "id"
        ] == "resp_fake2"
        assert payloads[-1]["response"]["usage"]["output_tokens"] == 3
        assert await usage_rows(daemon) == {"m": (2, 12, 6)}

        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
        reply = await client.responses.create(model="m", input="hi there")
        assert reply.output_text == " ".join(f"tok{i}" for i in range(8)) and reply.usage is not None
        assert (reply.usage.input_tokens, reply.usage.output_tokens) == (2, 8)
        streamed = [e async for e in await client.responses.create(model="m", input="hi there", stream=True)]
        assert "".join(e.delta for e in streamed if e.type == "response.output_text.delta") == reply.output_text
        assert streamed[-1].type == "response.completed" and fake.received[-1].path == "/v1/responses"
        assert await usage_rows(daemon) == {"m": (4, 16, 22)}


@pytest.mark.parametrize("engine", ["ollama", "llamacpp"])
async def test_responses_are_translated_to_chat_for_engines_without_the_api(daemon: Daemon, engine: str) -> None:
    fake = FakeOllama(models=["m:latest"]) if engine == "ollama" else FakeOpenAI(flavor="llamacpp", models=["m"])
    async with fake:
        await daemon.backend("b1", fake.url, engine)
        key = await daemon.user("alice")
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
        reply = await client.responses.create(model="m", instructions="be brief", input="hi there", max_output_tokens=3)
        assert fake.received[-1].path == ("/api/chat" if engine == "ollama" else "/v1/chat/completions")
        assert reply.output_text == "tok0 tok1 tok2" and reply.status == "incomplete"
        assert await usage_rows(daemon) == {"m": (1, 4, 3)}


async def test_a_passed_through_stream_that_breaks_ends_with_a_responses_error_event(daemon: Daemon) -> None:
    async with FakeOpenAI(flavor="vllm", models=["m"]) as fake:
        await daemon.backend("b1", fake.url, "vllm")
        key = await daemon.user("alice")
        fake.drop_next(after_chunks=6)  # created, in_progress, item and part added, two deltas
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
        stream = await client.responses.create(model="m", input="hi there", stream=True)
        events = [e async for e in stream]
        assert [e.type for e in events[-3:]] == ["response.output_text.delta"] * 2 + ["error"]
        assert "backend" in events[-1].message  # as a translated stream ends (test_conformance)
        assert await usage_rows(daemon) == {"m": (1, 2, 2)}  # charged the two tokens it sent
