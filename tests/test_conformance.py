"""The conformance matrix: real clients, both dialects, every engine, every request shape.

client x dialect:  openai (OpenAI), langchain-openai (OpenAI), ollama (Ollama), raw aiohttp as curl (both)
engine:            ollama, vllm, llamacpp (fakes that answer as the real servers do)
shape:             chat, stream, tools (a call, then the tool's answer), vision (a data: URL image),
                   json, embeddings

Every cell passes; the refusals documented in docs/clients.md (an image by link or token-array
embeddings for an Ollama backend) are checked in their own tests below. One daemon and one set of
fakes serve the whole module, so the 90 cells run in a few seconds.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import ollama
import openai
import pytest
import pytest_asyncio
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI, OpenAIEmbeddings

from . import harness
from .fakes import TOOL_ARGUMENTS, FakeOllama, FakeOpenAI
from .harness import until

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = {"ollama": "o-chat", "vllm": "v-chat", "llamacpp": "l-chat"}
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(24)).decode()
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TEXT = "tok0 tok1 tok2"
"""Every fake answers with its first three tokens when asked for three."""
JSON_TEXT = {"answer": "tok0 tok1 tok2"}
"""What every fake answers in JSON mode."""


class Pool:
    """One daemon on 127.0.0.1 in front of an Ollama, a vLLM and a llama-server fake."""

    url: str
    key: str


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Pool]:
    caps = {"o-chat:latest": ["completion", "tools", "vision"]}
    async with (
        FakeOllama(models=["o-chat:latest"], capabilities=caps) as oll,
        FakeOpenAI(flavor="vllm", models=["v-chat"], vision=True) as vllm,
        FakeOpenAI(flavor="llamacpp", models=["l-chat"], vision=True) as llama,
        harness.daemon(Path(tmp_path_factory.mktemp("pool"))) as d,
    ):
        for name, fake, engine in (("o", oll, "ollama"), ("v", vllm, "vllm"), ("l", llama, "llamacpp")):
            await d.backend(name, fake.url, engine, max_concurrent=8)
        pool = Pool()
        pool.url, pool.key = d.url, await d.user("matrix")

        async def probed() -> bool:
            return len(await d.admin("GET", "/admin/models")) == 3

        await until(probed, "every backend should be probed, Ollama's /api/show included")
        yield pool


# ---- one driver per client: each returns what the client made of the answer -------------------------------


async def drive_openai(pool: Pool, model: str, shape: str) -> Any:
    client = openai.AsyncOpenAI(base_url=pool.url + "/v1", api_key=pool.key, max_retries=0)
    user = [{"role": "user", "content": "what is the weather"}]
    if shape == "chat":
        return (
            (await client.chat.completions.create(model=model, messages=user, max_tokens=3)).choices[0].message.content
        )
    if shape == "stream":
        stream = await client.chat.completions.create(model=model, messages=user, max_tokens=3, stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    if shape == "tools":
        reply = await client.chat.completions.create(model=model, messages=user, tools=[TOOL])
        call = reply.choices[0].message.tool_calls[0]
        assert reply.choices[0].finish_reason == "tool_calls"
        stream = await client.chat.completions.create(model=model, messages=user, tools=[TOOL], stream=True)
        name, args = "", ""
        async for chunk in stream:
            for delta in (chunk.choices[0].delta.tool_calls or ()) if chunk.choices else ():
                name += delta.function.name or ""
                args += delta.function.arguments or ""
        assert (name, json.loads(args)) == (call.function.name, json.loads(call.function.arguments))
        answered = [
            *user,
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
        ]
        final = await client.chat.completions.create(model=model, messages=answered, tools=[TOOL], max_tokens=3)
        return call.function.name, json.loads(call.function.arguments), final.choices[0].message.content
    if shape == "vision":
        image = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]
        content = [{"type": "text", "text": "what is this"}, *image]
        reply = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": content}], max_tokens=3
        )
        return reply.choices[0].message.content
    if shape == "json":
        reply = await client.chat.completions.create(
            model=model, messages=user, max_tokens=3, response_format={"type": "json_object"}
        )
        return json.loads(reply.choices[0].message.content)
    out = await client.embeddings.create(model=model, input=["one two", "three"])
    return [len(d.embedding) for d in out.data]


async def drive_langchain(pool: Pool, model: str, shape: str) -> Any:
    chat = ChatOpenAI(model=model, base_url=pool.url + "/v1", api_key=pool.key, max_retries=0, max_tokens=3)
    if shape == "chat":
        return (await chat.ainvoke("what is the weather")).content
    if shape == "stream":
        return "".join([str(c.content) async for c in chat.astream("what is the weather")])
    if shape == "tools":
        reply = await chat.bind_tools([TOOL]).ainvoke("what is the weather")
        call = reply.tool_calls[0]
        final = await chat.bind_tools([TOOL]).ainvoke(
            [HumanMessage("what is the weather"), reply, {"role": "tool", "tool_call_id": call["id"], "content": "ok"}]
        )
        return call["name"], call["args"], final.content
    if shape == "vision":
        image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
        return (await chat.ainvoke([HumanMessage(content=[{"type": "text", "text": "what is this"}, image])])).content
    if shape == "json":
        reply = await chat.bind(response_format={"type": "json_object"}).ainvoke("what is the weather")
        return json.loads(str(reply.content))
    embed = OpenAIEmbeddings(
        model=model, base_url=pool.url + "/v1", api_key=pool.key, max_retries=0, check_embedding_ctx_length=False
    )
    return [len(v) for v in await embed.aembed_documents(["one two", "three"])]


async def drive_ollama(pool: Pool, model: str, shape: str) -> Any:
    client = ollama.AsyncClient(host=pool.url, headers={"Authorization": f"Bearer {pool.key}"})
    user: list[Any] = [{"role": "user", "content": "what is the weather"}]
    three = {"num_predict": 3}
    if shape == "chat":
        return (await client.chat(model=model, messages=user, options=three)).message.content
    if shape == "stream":
        return "".join(
            [p.message.content or "" async for p in await client.chat(model, user, stream=True, options=three)]
        )
    if shape == "tools":
        reply = await client.chat(model=model, messages=user, tools=[TOOL])
        call = reply.message.tool_calls[0]
        streamed = [p async for p in await client.chat(model=model, messages=user, tools=[TOOL], stream=True)]
        calls = [c for p in streamed for c in p.message.tool_calls or ()]
        assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
            (call.function.name, dict(call.function.arguments))
        ]
        answered = [*user, reply.message, {"role": "tool", "content": "sunny", "tool_name": call.function.name}]
        final = await client.chat(model=model, messages=answered, tools=[TOOL], options=three)
        return call.function.name, dict(call.function.arguments), final.message.content
    if shape == "vision":
        seen = [{"role": "user", "content": "what is this", "images": [PNG]}]
        return (await client.chat(model=model, messages=seen, options=three)).message.content
    if shape == "json":
        return json.loads((await client.chat(model=model, messages=user, format="json", options=three)).message.content)
    return [len(v) for v in (await client.embed(model=model, input=["one two", "three"])).embeddings]


async def drive_raw(pool: Pool, model: str, shape: str, dialect: str) -> Any:
    """What curl does: a JSON body in, bytes out, parsed by hand."""
    headers = {"Authorization": f"Bearer {pool.key}"}
    user = [{"role": "user", "content": "what is the weather"}]
    openai_dialect = dialect == "openai"
    body: dict[str, Any] = {"model": model, "messages": user}
    body.update(
        {"max_tokens": 3, "stream": False} if openai_dialect else {"options": {"num_predict": 3}, "stream": False}
    )
    path = "/v1/chat/completions" if openai_dialect else "/api/chat"
    if shape == "embeddings":
        path = "/v1/embeddings" if openai_dialect else "/api/embed"
        body = {"model": model, "input": ["one two", "three"]}
    elif shape == "stream":
        body["stream"] = True
    elif shape == "tools":
        body["tools"] = [TOOL]
    elif shape == "vision":
        if openai_dialect:
            image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
            body["messages"] = [{"role": "user", "content": [{"type": "text", "text": "what is this"}, image]}]
        else:
            body["messages"] = [{"role": "user", "content": "what is this", "images": [PNG]}]
    elif shape == "json":
        body.update({"response_format": {"type": "json_object"}} if openai_dialect else {"format": "json"})
    async with aiohttp.ClientSession() as s, s.post(pool.url + path, json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["X-Request-Id"]
        raw = await resp.read()
    if shape == "stream":
        if openai_dialect:
            events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        lines = [json.loads(line) for line in raw.splitlines() if line.strip()]
        assert lines[-1]["done"] is True and lines[-1]["eval_count"] == 3
        return "".join(line["message"]["content"] for line in lines)
    data = json.loads(raw)
    if shape == "embeddings":
        vectors = [d["embedding"] for d in data["data"]] if openai_dialect else data["embeddings"]
        return [len(v) for v in vectors]
    message = data["choices"][0]["message"] if openai_dialect else data["message"]
    if shape == "tools":
        fn = message["tool_calls"][0]["function"]
        args = json.loads(fn["arguments"]) if openai_dialect else fn["arguments"]
        return fn["name"], args, None
    return json.loads(message["content"]) if shape == "json" else message["content"]


CLIENTS = {
    ("openai", "openai"): drive_openai,
    ("langchain-openai", "openai"): drive_langchain,
    ("ollama", "ollama"): drive_ollama,
    ("curl", "openai"): lambda p, m, s: drive_raw(p, m, s, "openai"),
    ("curl", "ollama"): lambda p, m, s: drive_raw(p, m, s, "ollama"),
}
EXPECTED = {
    "chat": TEXT,
    "stream": TEXT,
    "tools": ("get_weather", TOOL_ARGUMENTS, TEXT),
    "vision": TEXT,
    "json": JSON_TEXT,
    "embeddings": [4, 4],
}


@pytest.mark.parametrize("shape", list(EXPECTED))
@pytest.mark.parametrize("engine", list(MODEL))
@pytest.mark.parametrize(("client", "dialect"), list(CLIENTS), ids=[f"{c}-{d}" for c, d in CLIENTS])
async def test_cell(pool: Pool, client: str, dialect: str, engine: str, shape: str) -> None:
    got = await CLIENTS[client, dialect](pool, MODEL[engine], shape)
    expected = EXPECTED[shape]
    if shape == "tools" and client == "curl":
        expected = (*expected[:2], None)  # one round only
    assert got == expected


# ---- the documented refusals -------------------------------------------------------------------------------


async def test_an_image_by_link_is_a_400_for_an_ollama_backend_and_passes_to_the_others(pool: Pool) -> None:
    client = openai.AsyncOpenAI(base_url=pool.url + "/v1", api_key=pool.key, max_retries=0)
    content = [{"type": "image_url", "image_url": {"url": "https://example.org/cat.png"}}]
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model="o-chat", messages=[{"role": "user", "content": content}])
    assert "data: URL" in refused.value.message
    reply = await client.chat.completions.create(
        model="v-chat", messages=[{"role": "user", "content": content}], max_tokens=3
    )
    assert reply.choices[0].message.content == TEXT


async def test_token_array_embeddings_are_a_400_naming_the_fix_for_an_ollama_backend(pool: Pool) -> None:
    client = openai.AsyncOpenAI(base_url=pool.url + "/v1", api_key=pool.key, max_retries=0)
    for model in ("v-chat", "l-chat"):
        out = await client.embeddings.create(model=model, input=[[1, 2, 3], [4]])
        assert [len(d.embedding) for d in out.data] == [4, 4] and out.usage.prompt_tokens == 4
    with pytest.raises(openai.BadRequestError) as refused:
        await client.embeddings.create(model="o-chat", input=[[1, 2, 3]])
    assert "check_embedding_ctx_length=False" in refused.value.message


# ---- the Responses API, served as chat completions where the engine lacks it (vLLM: test_responses_passthrough) ---

RESPONSES_TOOL = {"type": "function", **TOOL["function"]}


@pytest.mark.parametrize("engine", ["ollama", "llamacpp"])
async def test_responses_api_text_stream_and_tools(pool: Pool, engine: str) -> None:
    client = openai.AsyncOpenAI(base_url=pool.url + "/v1", api_key=pool.key, max_retries=0)
    model = MODEL[engine]
    reply = await client.responses.create(
        model=model, instructions="be brief", input="what is the weather", max_output_tokens=3
    )
    assert reply.output_text == TEXT and reply.status == "incomplete"  # stopped at max_output_tokens
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (6, 3)  # "be brief" + 4 words; 3 tokens

    events = [e async for e in await client.responses.create(model=model, input="hi there", stream=True)]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == " ".join(
        f"tok{i}" for i in range(8)
    )
    assert events[-1].response.usage.output_tokens == 8

    called = await client.responses.create(model=model, input="what is the weather", tools=[RESPONSES_TOOL])
    call = next(item for item in called.output if item.type == "function_call")
    assert (call.name, json.loads(call.arguments)) == ("get_weather", TOOL_ARGUMENTS)
    streamed = [
        e
        async for e in await client.responses.create(
            model=model, input="what is the weather", tools=[RESPONSES_TOOL], stream=True
        )
    ]
    done = next(e for e in streamed if e.type == "response.function_call_arguments.done")
    assert json.loads(done.arguments) == TOOL_ARGUMENTS
    answered = await client.responses.create(
        model=model,
        input=[
            {"role": "user", "content": "what is the weather"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
        tools=[RESPONSES_TOOL],
        max_output_tokens=3,
    )
    assert answered.output_text == TEXT


async def test_responses_api_refuses_what_it_cannot_serve_with_a_400(pool: Pool) -> None:
    client = openai.AsyncOpenAI(base_url=pool.url + "/v1", api_key=pool.key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="v-chat", input="hi", previous_response_id="resp_1")
    assert "send the whole conversation" in refused.value.message
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="v-chat", input="hi", tools=[{"type": "web_search"}])
    assert "only function tools" in refused.value.message


# ---- logprobs, where the engine has them, across the dialects ----------------------------------------------


@pytest.mark.parametrize("engine", ["ollama", "vllm"])
async def test_chat_logprobs_reach_both_dialects(pool: Pool, engine: str) -> None:
    expected = [("tok0", -0.1), (" tok1", -0.2), (" tok2", -0.3)]
    client = openai.AsyncOpenAI(base_url=pool.url + "/v1", api_key=pool.key, max_retries=0)
    user = [{"role": "user", "content": "hi"}]
    reply = await client.chat.completions.create(
        model=MODEL[engine], messages=user, max_tokens=3, logprobs=True, top_logprobs=2
    )
    content = reply.choices[0].logprobs.content
    assert [(t.token, t.logprob) for t in content] == expected
    assert [len(t.top_logprobs) for t in content] == [2, 2, 2]
    stream = await client.chat.completions.create(
        model=MODEL[engine], messages=user, max_tokens=3, logprobs=True, stream=True
    )
    streamed = [t async for c in stream if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == expected

    ol = ollama.AsyncClient(host=pool.url, headers={"Authorization": f"Bearer {pool.key}"})
    out = await ol.chat(model=MODEL[engine], messages=user, options={"num_predict": 3}, logprobs=True, top_logprobs=2)
    assert [(t.token, t.logprob) for t in out.logprobs] == expected
    parts = [
        p async for p in await ol.chat(MODEL[engine], user, stream=True, options={"num_predict": 3}, logprobs=True)
    ]
    assert [(t.token, t.logprob) for p in parts for t in p.logprobs or ()] == expected
