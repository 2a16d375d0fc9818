"""Pure parts of the backends package, by plain calls: parsing, planning, relays."""

from __future__ import annotations

import json

import pytest

import mindrouter.backends as backends
from mindrouter.backends import Call
from mindrouter.backends import _shapes as shapes
from mindrouter.backends import relay as rl
from mindrouter.backends._shapes import StreamFailed
from mindrouter.backends.translate import plan
from mindrouter.errors import RequestError


def call(path: str, **body: object) -> Call:
    return Call.from_request(path, json.dumps(body).encode())


def test_exported_members() -> None:
    for name in backends.__all__:
        assert hasattr(backends, name), name
    assert set(backends.ENGINES) == {"ollama", "openai", "vllm", "llamacpp"}


def test_stream_defaults_differ_by_dialect() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    assert call("/v1/chat/completions", model="m", messages=msgs).stream is False
    assert call("/api/chat", model="m", messages=msgs).stream is True
    assert call("/api/generate", model="m", prompt="hi").stream is True
    assert call("/api/generate", model="m", prompt="hi", stream=False).stream is False
    assert call("/api/embed", model="m", input="x").stream is False


def test_hints_for_the_scheduler() -> None:
    c = call(
        "/v1/chat/completions",
        model="m",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "a" * 40},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            }
        ],
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
        response_format={"type": "json_object"},
    )
    assert (c.dialect, c.kind, c.model) == ("openai", "chat", "m")
    assert c.has_images and c.json_mode and c.wants_usage
    assert c.max_tokens == 7 and c.prompt_tokens == 10
    o = call(
        "/api/generate",
        model="m",
        prompt="b" * 8,
        format="json",
        options={"num_predict": -1, "num_ctx": 8192},
        images=["AAAA"],
    )
    assert o.has_images and o.json_mode and o.max_tokens is None and o.context_tokens == 8192 and o.prompt_tokens == 2
    assert not call(
        "/v1/chat/completions",
        model="m",
        messages=[{"role": "user", "content": "x"}],
        stream_options={"include_usage": True},
    ).wants_usage


@pytest.mark.parametrize(
    ("path", "raw", "fragment"),
    [
        ("/v1/chat/completions", b"{not json", "not valid JSON"),
        ("/v1/chat/completions", b"[1, 2]", "JSON object"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}]}', '"model"'),
        ("/v1/chat/completions", b'{"model": "", "messages": []}', '"model"'),
        ("/v1/chat/completions", b'{"model": "m", "messages": []}', '"messages"'),
        ("/v1/chat/completions", b'{"model": "m", "messages": [{"content": "x"}]}', "role"),
        ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', "content"),
        (
            "/v1/chat/completions",
            b'{"model": "m", "stream": "yes", "messages": [{"role": "user", "content": "x"}]}',
            '"stream"',
        ),
        (
            "/v1/chat/completions",
            b'{"model": "m", "max_tokens": "9", "messages": [{"role": "user", "content": "x"}]}',
            '"max_tokens"',
        ),
        (
            "/v1/chat/completions",
            b'{"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}',
            '"max_tokens"',
        ),
        (
            "/v1/chat/completions",
            b'{"model": "m", "temperature": "hot", "messages": [{"role": "user", "content": "x"}]}',
            '"temperature"',
        ),
        ("/v1/completions", b'{"model": "m"}', '"prompt"'),
        ("/v1/embeddings", b'{"model": "m", "input": []}', '"input"'),
        ("/api/chat", b'{"model": "m", "options": []}', '"options"'),
        ("/api/generate", b'{"model": "m", "prompt": 3}', '"prompt"'),
        ("/api/generate", b'{"model": "m", "prompt": "x", "format": 1}', '"format"'),
        ("/api/embeddings", b'{"model": "m"}', '"prompt"'),
    ],
)
def test_malformed_bodies_are_400_with_the_field_named(path: str, raw: bytes, fragment: str) -> None:
    with pytest.raises(RequestError) as info:
        Call.from_request(path, raw)
    assert info.value.status == 400
    assert fragment in info.value.message
    assert info.value.message.endswith(".")


def test_unknown_path_is_404() -> None:
    with pytest.raises(RequestError) as info:
        Call.from_request("/v1/images", b"{}")
    assert info.value.status == 404


def test_passthrough_sends_the_clients_bytes_unchanged() -> None:
    raw = b'{"model": "m",  "messages": [{"role": "user", "content": "hi"}], "stream": false}'
    c = Call.from_request("/v1/chat/completions", raw)
    p = plan(c, "m", "openai")
    assert p.data is raw and p.path == "/v1/chat/completions" and p.passthrough
    o = Call.from_request("/api/chat", raw)
    assert plan(o, "m", "ollama").data is raw


def test_a_whole_ollama_answer_passed_through_carries_its_durations() -> None:
    """Issue 17: without them the rate a backend is learned at fell back to the daemon's clock."""
    from mindrouter.backends.whole import convert_body

    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": false}'
    p = plan(Call.from_request("/api/chat", raw), "m", "ollama")
    assert p.passthrough
    answer = (
        b'{"model":"m","message":{"role":"assistant","content":"the eval_duration is \\"9\\""},"done":true,'
        b'"total_duration":2600000000,"load_duration":1500000000,"prompt_eval_count":12,'
        b'"prompt_eval_duration":100000000,"eval_count":20,"eval_duration":400000000}'
    )
    out, usage = convert_body(p, answer)
    assert out is answer
    assert (usage.prompt_tokens, usage.completion_tokens) == (12, 20)
    assert (usage.load_seconds, usage.prefill_seconds, usage.decode_seconds) == (1.5, 0.1, 0.4)
    _, bogus = convert_body(p, answer.replace(b'"eval_duration":400000000', b'"eval_duration":-4'))
    assert bogus.decode_seconds is None and bogus.completion_tokens == 20


def test_openai_stream_gets_usage_spliced_in_without_reencoding() -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true}\n'
    p = plan(Call.from_request("/v1/chat/completions", raw), "m", "openai")
    assert p.data == raw.rstrip()[:-1] + b',"stream_options":{"include_usage":true}}'
    assert json.loads(p.data)["stream_options"] == {"include_usage": True}
    assert not p.wants_usage
    explicit = Call.from_request(
        "/v1/chat/completions", raw.replace(b"true}", b'true, "stream_options": {"include_usage": false}}')
    )
    assert json.loads(plan(explicit, "m", "openai").data)["stream_options"] == {"include_usage": True}


def test_model_name_is_rewritten_when_the_backend_calls_it_otherwise() -> None:
    c = call("/api/chat", model="llama3.2", messages=[{"role": "user", "content": "hi"}])
    assert json.loads(plan(c, "llama3.2:latest", "ollama").data)["model"] == "llama3.2:latest"


def test_openai_to_ollama_request_mapping() -> None:
    c = call(
        "/v1/chat/completions",
        model="m",
        stream=True,
        max_tokens=5,
        temperature=0.2,
        top_p=0.9,
        seed=4,
        stop="END",
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        messages=[
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORxx"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
            },
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
        ],
    )
    p = plan(c, "m", "ollama")
    body = json.loads(p.data)
    assert p.path == "/api/chat" and body["stream"] is True
    assert body["options"] == {"num_predict": 5, "temperature": 0.2, "top_p": 0.9, "seed": 4, "stop": ["END"]}
    assert body["format"] == {"type": "object"}
    assert body["messages"][0] == {"role": "system", "content": "be brief"}
    assert body["messages"][1] == {"role": "user", "content": "what is", "images": ["iVBORxx"]}
    assert body["messages"][2]["tool_calls"] == [{"function": {"name": "f", "arguments": {"a": 1}}}]
    gen = json.loads(plan(call("/v1/completions", model="m", prompt=["once upon"]), "m", "ollama").data)
    assert gen["prompt"] == "once upon" and gen["raw"] is True and gen["stream"] is False
    with pytest.raises(RequestError, match="data: URLs"):
        plan(
            call(
                "/v1/chat/completions",
                model="m",
                messages=[
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}
                ],
            ),
            "m",
            "ollama",
        )
    with pytest.raises(RequestError, match="one prompt"):
        plan(call("/v1/completions", model="m", prompt=["a", "b"]), "m", "ollama")


def test_ollama_to_openai_request_mapping() -> None:
    c = call(
        "/api/chat",
        model="m",
        format="json",
        options={"num_predict": 6, "temperature": 0.5, "seed": 1, "stop": ["x"], "num_ctx": 4096},
        messages=[
            {"role": "user", "content": "look", "images": ["/9j/abc"]},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
            {"role": "tool", "content": "42", "tool_name": "f"},
        ],
    )
    p = plan(c, "m", "openai")
    body = json.loads(p.data)
    assert p.path == "/v1/chat/completions"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["temperature"], body["seed"], body["stop"]) == (6, 0.5, 1, ["x"])
    assert body["response_format"] == {"type": "json_object"}
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/abc"}},
    ]
    assert body["messages"][1]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    ]
    assert body["messages"][2]["tool_call_id"] == "call_1"
    templated = json.loads(
        plan(call("/api/generate", model="m", prompt="hi", system="sys", stream=False), "m", "openai").data
    )
    assert templated["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    raw = plan(call("/api/generate", model="m", prompt="hi", raw=True), "m", "openai")
    assert raw.path == "/v1/completions" and json.loads(raw.data)["prompt"] == "hi"
    legacy = plan(call("/api/embeddings", model="m", prompt="hi there"), "m", "openai")
    assert json.loads(legacy.data) == {"model": "m", "input": "hi there", "encoding_format": "float"}


def test_ollama_load_call_is_answered_without_an_openai_backend() -> None:
    p = plan(call("/api/chat", model="m", messages=[]), "m", "openai")
    assert p.synthetic is not None
    answer = json.loads(p.synthetic)
    assert answer["done"] is True and answer["done_reason"] == "load"


def openai_plan(wants_usage: bool) -> object:
    body: dict[str, object] = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    if wants_usage:
        body["stream_options"] = {"include_usage": True}
    return plan(call("/v1/chat/completions", **body), "m", "openai")


def test_sse_passthrough_hides_the_usage_chunk_unless_asked() -> None:
    content = b'{"id":"1","choices":[{"index":0,"delta":{"content":"usage"},"finish_reason":null}]}'
    usage = b'{"id":"1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9,"total_tokens":12}}'
    for wants in (False, True):
        r = rl.make_relay(openai_plan(wants))  # type: ignore[arg-type]
        out = r.feed(content) + r.feed(usage) + r.feed(b"[DONE]") + r.end()
        expected = b"data: " + content + b"\n\n" + (b"data: " + usage + b"\n\n" if wants else b"") + b"data: [DONE]\n\n"
        assert out == expected
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (3, 9)


def test_sse_passthrough_strips_usage_from_a_final_chunk_with_choices() -> None:
    r = rl.make_relay(openai_plan(False))  # type: ignore[arg-type]
    out = r.feed(
        b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}'
    )
    assert json.loads(out[6:]) == {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    assert r.usage.completion_tokens == 2


def test_relays_raise_on_error_events_and_early_ends() -> None:
    r = rl.make_relay(openai_plan(True))  # type: ignore[arg-type]
    with pytest.raises(StreamFailed, match="out of memory"):
        r.feed(b'{"error": {"message": "out of memory", "code": 500}}')
    r = rl.make_relay(openai_plan(True))  # type: ignore[arg-type]
    r.feed(b'{"choices":[]}')
    with pytest.raises(StreamFailed, match="early"):
        r.end()


def test_error_shapes() -> None:
    assert json.loads(shapes.error_body("ollama", 404, "no such model")) == {"error": "no such model"}
    assert json.loads(shapes.error_body("openai", 404, "no such model")) == {
        "error": {"message": "no such model", "type": "not_found_error", "param": None, "code": None}
    }
    assert shapes.error_message(b'{"error": {"message": "bad", "code": 400}}', 400) == "bad"
    assert shapes.error_message(b'{"object": "error", "message": "old vllm"}', 400) == "old vllm"
    assert shapes.error_message(b'{"error": "ollama says"}', 400) == "ollama says"
    assert shapes.error_message(b"", 502) == "HTTP 502"
    tail = shapes.error_tail("openai", "gone")
    assert tail.endswith(b"data: [DONE]\n\n") and json.loads(tail.split(b"\n\n")[0][6:])["error"]["message"] == "gone"
    assert json.loads(shapes.error_tail("ollama", "gone")) == {"error": "gone"}


def test_a_quota_cap_is_said_in_each_dialect():
    """A whole answer that named no limit is held to its quota share (quotas.py) in the client's own field."""
    chat = Call.from_request("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}')
    assert json.loads(chat.capped(7).raw)["max_tokens"] == 7 and chat.capped(7).max_tokens == 7
    ollama = Call.from_request(
        "/api/chat", b'{"model": "m", "messages": [], "options": {"num_predict": -1, "seed": 3}}'
    )
    assert json.loads(ollama.capped(7).raw)["options"] == {"num_predict": 7, "seed": 3}
    assert ollama.body["options"]["num_predict"] == -1  # the client's body is not changed
    api = Call.from_request("/v1/responses", b'{"model": "m", "input": "x"}').capped(7)
    assert api.body["max_tokens"] == 7 and json.loads(api.as_sent().raw)["max_output_tokens"] == 7
