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
from .fakes import TOOL_ARGUMENTS, FakeOllama, FakeOpenAI

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


# ---- function tools, passed through: vLLM and OpenAI call them in the Responses API's own items and events ----

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALLED = {
    "type": "function_call",
    "id": "fc_fake1",
    "call_id": "call_fake1",
    "name": "get_weather",
    "arguments": json.dumps(TOOL_ARGUMENTS),
    "status": "completed",
}
"""The call the fake makes for the first request of a test: the first tool offered, with TOOL_ARGUMENTS."""


@pytest.mark.parametrize("engine", ["vllm", "openai"])
async def test_passed_through_tool_calls_arrive_intact_and_are_charged_the_backends_numbers(
    daemon: Daemon, engine: str
) -> None:
    async with FakeOpenAI(flavor=engine, models=["m"]) as fake:
        await daemon.backend("b1", fake.url, engine)
        key = await daemon.user("alice")
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)

        reply = await client.responses.create(model="m", input="what is the weather", tools=[WEATHER])
        assert fake.received[-1].body["tools"] == [WEATHER]  # as the client sent them
        assert [item.model_dump(exclude_none=True) for item in reply.output] == [CALLED]
        assert reply.usage is not None and (reply.usage.input_tokens, reply.usage.output_tokens) == (4, 2)
        assert await usage_rows(daemon) == {"m": (1, 4, 2)}

        stream = await client.responses.create(model="m", input="what is the weather", tools=[WEATHER], stream=True)
        events = [e async for e in stream]
        assert [e.type for e in events] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            *["response.function_call_arguments.delta"] * 2,
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
        added, done, completed = events[2], events[-2], events[-1]
        streamed = dict(CALLED, id="fc_fake2", call_id="call_fake2")
        assert added.item.model_dump(exclude_none=True) == dict(streamed, arguments="", status="in_progress")
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        assert deltas == events[5].arguments == CALLED["arguments"]
        assert done.item.model_dump(exclude_none=True) == streamed
        assert [item.model_dump(exclude_none=True) for item in completed.response.output] == [streamed]
        assert completed.response.usage.output_tokens == 2
        assert await usage_rows(daemon) == {"m": (2, 8, 4)}

        follow_up: list[Any] = [
            {"role": "user", "content": "what is the weather"},
            CALLED,
            {"type": "function_call_output", "call_id": "call_fake1", "output": "sunny and mild"},
        ]
        answered = await client.responses.create(model="m", input=follow_up, tools=[WEATHER], max_output_tokens=3)
        assert fake.received[-1].body["input"] == follow_up  # the tool's answer reached the backend as sent
        assert answered.output_text == "tok0 tok1 tok2" and answered.usage is not None
        assert (answered.usage.input_tokens, answered.usage.output_tokens) == (7, 3)  # 4 words + "sunny and mild"
        assert await usage_rows(daemon) == {"m": (3, 15, 7)}
        assert (fake.prompt_tokens_total, fake.completion_tokens_total) == (15, 7)  # what the backend counted


async def test_a_tool_call_stream_that_breaks_is_charged_the_argument_deltas_it_sent(daemon: Daemon) -> None:
    async with FakeOpenAI(flavor="vllm", models=["m"]) as fake:
        await daemon.backend("b1", fake.url, "vllm")
        key = await daemon.user("alice")
        fake.drop_next(after_chunks=4)  # created, in_progress, the call's item added, its first arguments delta
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
        stream = await client.responses.create(model="m", input="what is the weather", tools=[WEATHER], stream=True)
        events = [e async for e in stream]
        assert [e.type for e in events[-2:]] == ["response.function_call_arguments.delta", "error"]
        # the prompt estimated (19 characters / 4, rounded up), one completion token per delta the client got
        assert await usage_rows(daemon) == {"m": (1, 5, 1)}


@pytest.mark.parametrize("engine", ["ollama", "llamacpp"])
async def test_translated_tool_calls_arrive_whole_and_are_charged_the_backends_numbers(
    daemon: Daemon, engine: str
) -> None:
    fake = FakeOllama(models=["m:latest"]) if engine == "ollama" else FakeOpenAI(flavor="llamacpp", models=["m"])
    async with fake:
        await daemon.backend("b1", fake.url, engine)
        key = await daemon.user("alice")
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)

        reply = await client.responses.create(model="m", input="what is the weather", tools=[WEATHER])
        sent = fake.received[-1].body
        assert sent["tools"] == [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}]
        [call] = reply.output
        assert (call.type, call.name, json.loads(call.arguments), call.status) == (
            "function_call",
            "get_weather",
            TOOL_ARGUMENTS,
            "completed",
        )

        stream = await client.responses.create(model="m", input="what is the weather", tools=[WEATHER], stream=True)
        events = [e async for e in stream]
        kinds = [e.type for e in events]
        assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
        assert kinds[-3:] == [
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
        done, item = events[-3], events[-2].item
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        assert deltas == done.arguments == item.arguments and json.loads(deltas) == TOOL_ARGUMENTS
        assert done.name == item.name == "get_weather"  # as OpenAI and vLLM name the call when its arguments end

        answered = await client.responses.create(
            model="m",
            input=[
                {"role": "user", "content": "what is the weather"},
                {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
                {"type": "function_call_output", "call_id": call.call_id, "output": "sunny and mild"},
            ],
            tools=[WEATHER],
            max_output_tokens=3,
        )
        tool_message = {"role": "tool", "content": "sunny and mild"}
        if engine == "llamacpp":
            tool_message["tool_call_id"] = call.call_id
        assert fake.received[-1].body["messages"][-1] == tool_message
        assert answered.output_text == "tok0 tok1 tok2"
        assert await usage_rows(daemon) == {"m": (3, 15, 19)}  # 4 + 4 + 7 words; the fake's 8 + 8 + 3 tokens
        assert (fake.prompt_tokens_total, fake.completion_tokens_total) == (15, 19)  # what the backend counted
