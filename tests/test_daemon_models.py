"""Models as clients see them: one name per model, what each can do, and the lists and facts about them."""

from __future__ import annotations

import hashlib
from typing import Any

import ollama
import openai
import pytest

from .conftest import until
from .fakes import FakeOllama, FakeOpenAI

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
IMAGE_MESSAGE: Any = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is this"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        ],
    }
]


async def probed(daemon: Any, n: int) -> None:
    """Wait until ``n`` backends have answered a probe (and Ollama's /api/show once)."""
    await until(lambda: sum(e.probe is not None and e.probe.healthy for e in daemon.registry.entries.values()) >= n)


async def off(daemon: Any, name: str) -> None:
    """Take a backend out of service (drain; it is idle, so it is disabled at once)."""
    await daemon.admin("POST", f"/admin/backends/{name}/drain", {"force": True})
    await until(lambda: daemon.registry.by_name(name).row.state == "disabled")


async def test_an_image_goes_to_a_backend_whose_model_sees_and_is_refused_only_where_none_does(daemon):
    caps = {"llava:7b": ["completion", "vision"], "llama3.2:latest": ["completion", "tools"]}
    async with (
        FakeOllama(models=["llava:7b", "llama3.2:latest"], capabilities=caps) as oll,
        FakeOpenAI(flavor="vllm", models=["qwen-vl"], vision=True) as vllm,
    ):
        await daemon.backend("o", oll.url, "ollama")
        await daemon.backend("v", vllm.url, "vllm")
        await probed(daemon, 2)
        key = await daemon.user("vis")
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
        reply = await client.chat.completions.create(model="llava:7b", messages=IMAGE_MESSAGE, max_tokens=2)
        assert reply.choices[0].message.content == "tok0 tok1"
        assert oll.received[-1].body["messages"][0]["images"] == [PNG]
        reply = await client.chat.completions.create(model="qwen-vl", messages=IMAGE_MESSAGE, max_tokens=2)
        assert reply.choices[0].message.content == "tok0 tok1", "vLLM does not say: unknown never refuses"
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="llama3.2", messages=IMAGE_MESSAGE, max_tokens=2)
        assert "supports vision" in refused.value.message
        ol = ollama.AsyncClient(host=daemon.url, headers={"Authorization": f"Bearer {key}"})
        out = await ol.chat(model="llava:7b", messages=[{"role": "user", "content": "see", "images": [PNG]}])
        assert out.message.content.startswith("tok0")


async def test_an_ollama_embedding_model_is_refused_chat_with_a_clear_400(daemon):
    async with FakeOllama(
        models=["nomic-embed-text:latest"], capabilities={"nomic-embed-text:latest": ["embedding"]}
    ) as oll:
        await daemon.backend("o", oll.url, "ollama")
        await probed(daemon, 1)
        key = await daemon.user("emb")
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="nomic-embed-text", messages=[{"role": "user", "content": "x"}])
        assert "supports chat" in refused.value.message
        out = await client.embeddings.create(model="nomic-embed-text", input="a b")
        assert out.usage.prompt_tokens == 2


async def test_llama_server_props_say_whether_it_sees(daemon):
    async with (
        FakeOpenAI(flavor="llamacpp", models=["blind"], vision=False) as blind,
        FakeOpenAI(flavor="llamacpp", models=["gemma"], vision=True) as seeing,
    ):
        await daemon.backend("b", blind.url, "llamacpp")
        await daemon.backend("s", seeing.url, "llamacpp")
        await probed(daemon, 2)
        key = await daemon.user("lc")
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
        reply = await client.chat.completions.create(model="gemma", messages=IMAGE_MESSAGE, max_tokens=1)
        assert reply.choices[0].message.content == "tok0"
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="blind", messages=IMAGE_MESSAGE, max_tokens=1)


async def test_name_and_name_latest_are_one_model_listed_once_in_the_backends_spelling(daemon):
    async with (
        FakeOllama(models=["llama3.2:latest", "qwen:7b"]) as oll,
        FakeOpenAI(flavor="vllm", models=["llama3.2"]) as vllm,
    ):
        await daemon.backend("o", oll.url, "ollama", priority=100)
        await daemon.backend("v", vllm.url, "vllm", max_concurrent=1)
        await probed(daemon, 2)
        key = await daemon.user("names")
        headers = {"Authorization": f"Bearer {key}"}
        tags = await (await daemon.client.get("/api/tags", headers=headers)).json()
        assert [m["name"] for m in tags["models"]] == ["llama3.2:latest", "qwen:7b"]
        listed = await (await daemon.client.get("/v1/models", headers=headers)).json()
        assert [m["id"] for m in listed["data"]] == ["llama3.2:latest", "qwen:7b"]
        models = await daemon.admin("GET", "/admin/models")
        assert [(m["model"], sorted(m["backends"])) for m in models] == [
            ("llama3.2:latest", ["o", "v"]),
            ("qwen:7b", ["o"]),
        ]
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
        await off(daemon, "o")
        for name in ("llama3.2", "llama3.2:latest"):  # only vLLM serves now: it gets its own spelling
            await client.chat.completions.create(model=name, messages=[{"role": "user", "content": "x"}], max_tokens=1)
            assert vllm.received[-1].body["model"] == "llama3.2"
        await daemon.admin("POST", "/admin/backends/o/enable")
        await off(daemon, "v")
        await client.chat.completions.create(
            model="llama3.2", messages=[{"role": "user", "content": "x"}], max_tokens=1
        )
        assert oll.received[-1].body["model"] in ("llama3.2", "llama3.2:latest")
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": "x"}])


async def test_the_ollama_and_openai_model_routes_carry_the_backends_real_facts(daemon):
    caps = {"llama3.2:latest": ["completion", "tools"]}
    async with (
        FakeOllama(models=["llama3.2:latest", "llava:7b"], loaded=["llama3.2:latest"], capabilities=caps) as oll,
        FakeOpenAI(flavor="vllm", models=["qwen"]) as vllm,
    ):
        await daemon.backend("o", oll.url, "ollama")
        await daemon.backend("v", vllm.url, "vllm")
        await probed(daemon, 2)
        key = await daemon.user("ol")
        ol = ollama.AsyncClient(host=daemon.url, headers={"Authorization": f"Bearer {key}"})
        listed = {m.model: m for m in (await ol.list()).models}
        assert sorted(listed) == ["llama3.2:latest", "llava:7b", "qwen:latest"], "Ollama's name:tag spelling"
        llama = listed["llama3.2:latest"]
        assert llama.digest == hashlib.sha256(b"llama3.2:latest").hexdigest()  # the fake's digest, passed on
        assert llama.modified_at.year == 2025 and llama.size == 2_000_000_000
        assert llama.details.family == "llama" and llama.details.quantization_level == "Q4_K_M"
        assert listed["qwen:latest"].modified_at.year == 2023  # vLLM's created, 1700000000
        running = {m.model: m for m in (await ol.ps()).models}
        assert sorted(running) == ["llama3.2:latest", "qwen:latest"]
        assert running["llama3.2:latest"].expires_at.year == 2030
        assert running["llama3.2:latest"].size_vram == 2_000_000_000
        assert running["qwen:latest"].expires_at.year > 2030
        shown = await ol.show("llama3.2")
        assert shown.capabilities == ["completion", "tools"] and shown.details.family == "llama"
        assert shown.modelinfo["general.architecture"] == "llama"
        shown = await ol.show("qwen")
        assert shown.modelinfo["unknown.context_length"] == 4096  # vLLM's max_model_len
        assert shown.parameters == "num_ctx 4096"
        with pytest.raises(ollama.ResponseError) as missing:
            await ol.show("nope")
        assert missing.value.status_code == 404 and "`GET /api/tags`" in missing.value.error
        with pytest.raises(ollama.ResponseError) as pulled:
            await ol.pull("llama3.2")
        assert pulled.value.status_code == 403 and "ollama pull NAME" in pulled.value.error

        oa = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
        model = await oa.models.retrieve("llama3.2")
        assert (model.id, model.created) == ("llama3.2:latest", 1735689600)
        with pytest.raises(openai.NotFoundError):
            await oa.models.retrieve("nope")


async def test_root_and_version_answer_as_ollama_and_a_wrong_key_is_refused_everywhere(daemon):
    key = await daemon.user("v")
    root = await daemon.client.get("/")
    assert (root.status, await root.text()) == (200, "Ollama is running")
    assert (await daemon.client.head("/")).status == 200
    version = await daemon.client.get("/api/version", headers={"Authorization": f"Bearer {key}"})
    body = await version.json()
    assert body["version"] == "0.12.0" and body["mindrouter"]
    for path in ("/api/version", "/api/tags", "/api/ps", "/v1/models", "/v1/models/x"):
        for headers in ({"Authorization": "Bearer wrong"}, {}):
            resp = await daemon.client.get(path, headers=headers)
            assert resp.status == 401, path
            err = (await resp.json())["error"]
            assert isinstance(err, str) if path.startswith("/api/") else err["type"] == "authentication_error"


async def test_the_new_routes_answer_a_wrong_method_or_path_in_their_dialect(daemon):
    key = await daemon.user("m")
    auth = {"Authorization": f"Bearer {key}"}
    for method, path, status in (
        ("GET", "/v1/responses", 405),
        ("GET", "/api/show", 405),
        ("POST", "/api/tags", 405),
        ("GET", "/v1/nope", 404),
        ("GET", "/api/nope", 404),
    ):
        resp = await daemon.client.request(method, path, headers=auth)
        body = await resp.json()
        assert resp.status == status, (method, path)
        if path.startswith("/api/"):
            assert isinstance(body["error"], str), (method, path)
        else:
            assert body["error"]["message"] and body["error"]["type"], (method, path)
