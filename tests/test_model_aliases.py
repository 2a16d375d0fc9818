"""Model aliases (issue 31): a vLLM server's Hugging Face id and Ollama's tag named as one model, so both
servers form one pool and a client may ask for either name; each server is asked under the name it lists."""

from __future__ import annotations

import asyncio

import openai
import pytest

from mindrouter.backends import model_key, set_aliases
from mindrouter.store import InvalidValue, Store

from .conftest import until
from .fakes import FakeOllama, FakeOpenAI

HF, TAG = "meta-llama/Llama-3.1-8B-Instruct", "llama3.1:8b"


@pytest.fixture
def no_aliases_after():
    """The aliases are the process's (``model_key``): a test that fails midway leaves none to the next."""
    yield
    set_aliases({})


async def test_an_alias_pools_a_vllm_server_with_ollama_and_each_is_asked_under_its_own_name(daemon, no_aliases_after):
    async with FakeOllama(models=[TAG]) as oll, FakeOpenAI(flavor="vllm", models=[HF]) as vllm:
        await daemon.backend("o", oll.url, "ollama")
        await daemon.backend("v", vllm.url, "vllm")
        await until(lambda: sum(e.probe is not None and e.probe.healthy for e in daemon.registry.entries.values()) == 2)
        row = await daemon.admin("PUT", f"/admin/models/aliases/{HF}", {"target": TAG})
        assert row == {"name": HF, "target": TAG}
        models = {r["model"]: sorted(r["backends"]) for r in await daemon.admin("GET", "/admin/models")}
        assert models.get(TAG) == ["o", "v"] and HF not in models, models
        key = await daemon.user("al")
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
        for name in [HF, TAG] * 4:
            await asyncio.gather(
                *(
                    client.chat.completions.create(
                        model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
                    )
                    for _ in range(3)
                )
            )
        assert oll.received and vllm.received, (len(oll.received), len(vllm.received))
        assert {r.body["model"] for r in oll.received} == {TAG}
        assert {r.body["model"] for r in vllm.received} == {HF}
        assert await daemon.admin("GET", "/admin/models/aliases") == [{"name": HF, "target": TAG}]
        await daemon.admin("DELETE", f"/admin/models/aliases/{HF}")
        models = {r["model"]: r["backends"] for r in await daemon.admin("GET", "/admin/models")}
        assert models.get(TAG) == ["o"] and models.get(HF) == ["v"], models


def test_aliases_are_checked_exported_and_imported(tmp_path):
    store = Store(tmp_path / "a.db")
    assert store.set_alias(HF, TAG) == (HF, TAG)
    with pytest.raises(InvalidValue, match="alias of itself"):
        store.set_alias(TAG, TAG)
    with pytest.raises(InvalidValue, match="is itself an alias"):
        store.set_alias("other", HF)
    exported = store.export()
    assert exported["aliases"] == [{"name": HF, "target": TAG}]
    other = Store(tmp_path / "b.db")
    answer = other.import_(exported)
    assert answer["aliases"] == 1 and other.list_aliases() == {HF: TAG}
    assert [c["kind"] for c in answer["changes"]] == ["model alias"]


def test_model_key_follows_the_aliases_set():
    try:
        set_aliases({HF: TAG})
        assert (model_key(HF), model_key(TAG), model_key("llama3.1:8b")) == (TAG, TAG, TAG)
    finally:
        set_aliases({})
    assert model_key(HF) == HF
