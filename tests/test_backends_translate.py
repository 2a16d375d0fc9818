"""Request shapes across dialects, by plain calls on translate.plan: what each engine is sent, or the 400."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mindrouter.backends import Call
from mindrouter.backends._shapes import OPENAI_USAGE, scan_usage
from mindrouter.backends.translate import plan
from mindrouter.errors import RequestError


def call(path: str, **body: object) -> Call:
    return Call.from_request(path, json.dumps(body).encode())


def sent(c: Call, engine: str) -> dict[str, Any]:
    return json.loads(plan(c, "m", engine).data)


OPTIONS = {"top_k": 20, "min_p": 0.05, "repeat_penalty": 1.1, "num_ctx": 8192, "keep_alive": "5m", "temperature": 0.3}


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ("vllm", {"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "temperature": 0.3}),
        ("llamacpp", {"top_k": 20, "min_p": 0.05, "repeat_penalty": 1.1, "temperature": 0.3}),
        ("openai", {"temperature": 0.3}),  # OpenAI refuses parameters it does not know
    ],
)
def test_ollama_sampling_options_reach_the_engines_that_take_them(engine: str, expected: dict[str, Any]) -> None:
    body = sent(call("/api/chat", model="m", options=OPTIONS, messages=[{"role": "user", "content": "x"}]), engine)
    assert {k: body[k] for k in body if k not in ("model", "messages", "stream", "stream_options")} == expected


def test_openai_clients_sampling_extras_reach_ollama_options() -> None:
    body = sent(
        call(
            "/v1/chat/completions",
            model="m",
            top_k=20,
            min_p=0.05,
            repetition_penalty=1.1,
            seed=7,
            stop=["a", "b"],
            messages=[{"role": "user", "content": "x"}],
        ),
        "ollama",
    )
    assert body["options"] == {"top_k": 20, "min_p": 0.05, "repeat_penalty": 1.1, "seed": 7, "stop": ["a", "b"]}


@pytest.mark.parametrize(
    "tool_calls",
    [[{"id": "x"}], [{"id": "x", "function": {}}], [{"function": {"name": 3}}], ["x"], "x"],
)
def test_a_tool_call_that_cannot_be_translated_is_the_clients_400(tool_calls: Any) -> None:
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": tool_calls}]
    with pytest.raises(RequestError) as refused:
        plan(call("/v1/chat/completions", model="m", messages=messages), "m", "ollama")
    assert refused.value.status == 400 and "tool_calls" in refused.value.message


def test_ollama_tool_calls_without_a_function_are_the_clients_400() -> None:
    messages = [{"role": "assistant", "content": "", "tool_calls": [{"name": "f"}]}]
    with pytest.raises(RequestError) as refused:
        plan(call("/api/chat", model="m", messages=messages), "m", "vllm")
    assert refused.value.status == 400 and "tool_calls" in refused.value.message


def test_tool_choice_none_sends_ollama_no_tools() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "x"}]
    assert "tools" not in sent(
        call("/v1/chat/completions", model="m", tools=tools, tool_choice="none", messages=messages), "ollama"
    )
    assert sent(call("/v1/chat/completions", model="m", tools=tools, messages=messages), "ollama")["tools"] == tools


def test_token_array_embeddings_go_to_openai_engines_and_are_a_400_naming_the_fix_for_ollama() -> None:
    c = call("/v1/embeddings", model="m", input=[[1, 2, 3], [4, 5]])
    assert sent(c, "vllm")["input"] == [[1, 2, 3], [4, 5]]
    with pytest.raises(RequestError) as refused:
        plan(c, "m", "ollama")
    assert "check_embedding_ctx_length=False" in refused.value.message


def test_a_raw_ollama_generate_with_only_images_is_sent_not_crashed() -> None:
    body = sent(call("/api/generate", model="m", raw=True, images=["iVBORx"]), "vllm")
    assert body["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")


def test_an_ollama_fill_in_the_middle_call_keeps_its_suffix_on_openai_engines() -> None:
    p = plan(call("/api/generate", model="m", prompt="def f(", suffix="    return x\n"), "m", "llamacpp")
    assert p.path == "/v1/completions"
    assert (json.loads(p.data)["prompt"], json.loads(p.data)["suffix"]) == ("def f(", "    return x\n")


@pytest.mark.parametrize(
    ("raw", "kept", "dropped"),
    [
        (b"12", 12, None),
        (b"0", 0, None),
        (b" 7 ", 7, None),  # whitespace around the value, as a pretty-printing engine writes it
        (b"012", None, "012"),  # not JSON: kept as text, not believed
        (b"3.0", None, 3.0),  # a count must be written as a whole number
        (b"2.5", None, 2.5),
        (b"-4", None, -4),
        (b'"9"', None, "9"),
        (b"null", None, None),
        (b"9" * 30, None, int("9" * 30)),  # past the core's token range
    ],
)
def test_scan_usage_reads_counts_as_json_does(raw: bytes, kept: int | None, dropped: Any) -> None:
    """A backend's count found by scanning reads as ``json.loads`` would read it, plain digits or not."""
    body = b'{"choices":[],"usage":{"prompt_tokens":' + raw + b',"completion_tokens":5}}'
    usage = scan_usage(body, OPENAI_USAGE)
    assert (usage.prompt_tokens, usage.completion_tokens) == (kept, 5)
    assert usage.dropped == ([] if dropped is None else [("prompt_tokens", dropped)])
