"""Routing by GPU memory and utilization, read through a fake NVML."""

from __future__ import annotations

import openai
import pytest

from mindrouter.daemon.edge.services import SERVICES

from .conftest import until
from .fake_nvml import GIB, FakeNvml, gpu
from .fakes import FakeOllama


@pytest.fixture
def nvml() -> FakeNvml:
    # GPU 0 is nearly full (1 GiB free), GPU 1 has 40 GiB free and is less busy.
    return FakeNvml(
        [gpu(0, total=48 * GIB, used=47 * GIB, util_gpu=90), gpu(1, total=48 * GIB, used=8 * GIB, util_gpu=10)]
    )


async def test_a_backend_whose_gpus_lack_the_vram_is_refused_and_a_loaded_model_is_preferred(daemon):
    size = 4 * GIB  # on disk; the estimate adds KV cache and runtime overhead
    async with (
        FakeOllama(models={"llama3": size}, loaded=[]) as full,
        FakeOllama(models={"llama3": size}, loaded=[]) as roomy,
    ):
        await daemon.backend("full", full.url, "ollama", gpus=[0])
        await daemon.backend("roomy", roomy.url, "ollama", gpus=[1])
        await until(lambda: all(b.vram_free is not None for b in daemon.scheduler.backends.values()))
        key = await daemon.user("g", "staff")
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key=key, max_retries=0)
        record = await daemon.admin("GET", f"/admin/decisions/{await ask_id(client)}")
        assert record["selected_backend"] == "roomy"
        full_id = str(next(b["id"] for b in await daemon.admin("GET", "/admin/backends") if b["name"] == "full"))
        assert record["rejected"][full_id] == ["model does not fit in free VRAM, even after evicting idle models"]
        assert roomy.completed == 1 and full.requests == 0

        # Once the model is resident on "full" (Ollama /api/ps), it fits there and wins on model_loaded.
        full.loaded = {"llama3"}
        roomy.loaded = set()  # the fake had loaded it to answer; Ollama would unload it after keep_alive
        roomy_id = str(next(b["id"] for b in await daemon.admin("GET", "/admin/backends") if b["name"] == "roomy"))
        await until(
            lambda: (
                "llama3" in daemon.scheduler.backend(int(full_id)).loaded_models
                and not daemon.scheduler.backend(int(roomy_id)).loaded_models
            )
        )
        record = await daemon.admin("GET", f"/admin/decisions/{await ask_id(client)}")
        assert record["selected_backend"] == "full"
        parts = record["score_components"]
        # The loaded model starts at once; the other must load first (its size over the load speed it showed).
        assert parts[full_id]["start"] == 0 and parts[roomy_id]["start"] > 1
        # Utilization from NVML (0.1 and 0.9) slows the idle GPUs' estimates by 1 + utilization.
        assert parts[full_id]["streams"] == parts[roomy_id]["streams"] == 0
        assert parts[full_id]["prefill"] * 1.9 == pytest.approx(parts[roomy_id]["prefill"] * 1.1, rel=0.01)


async def ask_id(client: openai.AsyncOpenAI) -> str:
    """Ask once; the request id the daemon answered with, which its decision record is filed under."""
    raw = await client.chat.completions.with_raw_response.create(
        model="llama3", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    return raw.headers["X-Request-Id"]


async def test_admin_gpus_lists_the_local_readings(daemon):
    await until(lambda: bool(daemon.app[SERVICES].gpus.local.readings))
    nodes = await daemon.admin("GET", "/admin/gpus")
    assert nodes[0]["node"] == "local" and not nodes[0]["stale"]
    assert [g["index"] for g in nodes[0]["gpus"]] == [0, 1]
    assert nodes[0]["gpus"][0]["memory_free"] == 1 * GIB
