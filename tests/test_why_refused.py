"""``mr why`` for refused requests (issue 21): a 404 or a 429 carries X-Request-Id, and its id explains it.

Each refusal where it happens: the core (an unknown model), the quotas (a spent daily quota), and the
per-minute request limit. Each leaves a decision record in DESIGN §7's shape, with no backend, the
outcome ``rejected`` and the sentence the client got as its reason.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from mindrouter.cli.why import why_view

from .inprocess import InProcess
from .test_cli_safe_names import rendered


async def _ask(daemon: Any, key: str, model: str, path: str = "/v1/chat/completions") -> tuple[int, str, str]:
    body = {"model": model, "messages": [{"role": "user", "content": "a b c"}], "max_tokens": 3, "stream": False}
    async with (
        aiohttp.ClientSession() as s,
        s.post(daemon.url + path, json=body, headers={"Authorization": f"Bearer {key}"}) as resp,
    ):
        error = (await resp.json()).get("error", "")
        return resp.status, resp.headers["X-Request-Id"], error["message"] if isinstance(error, dict) else error


def _explained(record: dict[str, Any], status: int, message: str) -> None:
    assert record["outcome"] == "rejected" and record["status"] == status and record["reason"] == message
    assert record["selected_backend_id"] is None and record["candidate_backends"] == [] and record["scores"] == {}
    out = rendered(why_view(record, {}), width=100)
    assert "rejected" in out and " ".join(message.split()[:4]) in " ".join(out.split()), out
    assert "priority terms" not in out  # no pick was made: no n/a terms


async def test_an_unknown_model_and_a_spent_quota_are_explained_by_their_request_id(daemon):
    fake = InProcess(models=("llama3",), completion_tokens=8)
    await daemon.backend("b1", fake)
    key = await daemon.user("rita", "student")
    status, rid, message = await _ask(daemon, key, "gpt-99")
    assert status == 404
    record = await daemon.admin("GET", f"/admin/decisions/{rid}")
    _explained(record, 404, message)
    assert record["user"] == "rita" and record["model"] == "gpt-99"
    status, rid, message = await _ask(daemon, key, "gpt-99", "/api/chat")  # the Ollama dialect too
    _explained(await daemon.admin("GET", f"/admin/decisions/{rid}"), 404, message)

    await daemon.admin("PUT", "/admin/users/rita/quota", {"tokens_per_day": 1})  # no answer fits
    status, rid, message = await _ask(daemon, key, "llama3")
    assert status == 429
    record = await daemon.admin("GET", f"/admin/decisions/{rid}")
    _explained(record, 429, message)
    assert record["user"] == "rita" and record["model"] == "llama3" and record["user_group"] == "student"

    await daemon.admin("PUT", "/admin/users/rita/quota", {"clear": True})
    await daemon.admin("PUT", "/admin/users/rita/quota", {"requests_per_minute": 1})
    assert (await _ask(daemon, key, "llama3"))[0] == 200
    status, rid, message = await _ask(daemon, key, "llama3")
    assert status == 429
    _explained(await daemon.admin("GET", f"/admin/decisions/{rid}"), 429, message)
