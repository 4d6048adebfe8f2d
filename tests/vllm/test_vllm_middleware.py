"""The middleware of vLLM's OpenAI server without vLLM: a request's ``prediction`` moved into
``vllm_xargs``, and the answer's ``usage.completion_tokens_details`` filled in from vLLM's
per-request speculative counts (``metrics.speculative_decoding``), whole and streamed."""

from __future__ import annotations

import asyncio
import json

import pytest

from promptlookup.vllm.middleware import EventRewriter, PredictedOutputs, rewrite_body

SPEC = {"num_draft_tokens": 12, "num_accepted_draft_tokens": 9, "num_spec_steps": 4}


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            {"prediction": {"type": "content", "content": "x = 1"}},
            {"vllm_xargs": {"prediction": "x = 1"}},
        ),
        (
            {"prediction": {"content": [{"type": "text", "text": "a"}]}, "vllm_xargs": {"k": 1}},
            {"vllm_xargs": {"k": 1, "prediction": "a"}},
        ),
        ({"prediction": {"content": 5}}, None),
        ({"messages": []}, None),
    ],
)
def test_the_middleware_moves_prediction_into_vllm_xargs(body, expected):
    out = rewrite_body(json.dumps(body).encode())
    assert (json.loads(out) if out is not None else None) == expected


def answer(usage_details=None) -> dict:
    usage = {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21}
    if usage_details is not None:
        usage["completion_tokens_details"] = usage_details
    return {"id": "x", "choices": [{"index": 0}], "usage": usage,
            "metrics": {"speculative_decoding": SPEC}}  # fmt: skip


def serve(request: dict, messages: list[dict]) -> tuple[dict, list[dict], dict]:
    """Run the middleware around an app that records the request it got and sends
    ``messages``; returns (that request, what the client got, the client's response start)."""
    seen = {}

    async def app(scope, receive, send):
        seen["scope"] = scope
        seen["body"] = json.loads((await receive())["body"])
        for message in messages:
            await send(message)

    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": json.dumps(request).encode(), "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    asyncio.run(PredictedOutputs(app)(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    return seen["body"], [m for m in sent if m["type"] == "http.response.body"], start


def start(length: int | None = None) -> dict:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http.response.start", "status": 200, "headers": headers}


def test_a_predicted_answer_gets_openais_prediction_counts():
    body = json.dumps(answer({"reasoning_tokens": 0})).encode()
    half = len(body) // 2
    got, bodies, response = serve(
        {"messages": [], "prediction": {"type": "content", "content": "x"}},
        [
            start(len(body)),
            {"type": "http.response.body", "body": body[:half], "more_body": True},
            {"type": "http.response.body", "body": body[half:], "more_body": False},
        ],
    )
    assert got["vllm_xargs"] == {"prediction": "x"}
    out = b"".join(m["body"] for m in bodies)
    assert json.loads(out)["usage"]["completion_tokens_details"] == {
        "reasoning_tokens": 0,
        "accepted_prediction_tokens": 9,
        "rejected_prediction_tokens": 3,
    }
    assert dict(response["headers"])[b"content-length"] == str(len(out)).encode()


def test_an_answer_without_a_prediction_or_without_metrics_passes_unchanged():
    body = json.dumps(answer()).encode()
    messages = [start(len(body)), {"type": "http.response.body", "body": body}]
    _, bodies, _ = serve({"messages": []}, messages)
    assert bodies[0]["body"] == body
    plain = json.dumps({"usage": {"completion_tokens": 3}}).encode()
    messages = [start(len(plain)), {"type": "http.response.body", "body": plain}]
    _, bodies, _ = serve({"messages": [], "vllm_xargs": {"prediction": "x"}}, messages)
    assert b"".join(m["body"] for m in bodies) == plain


def test_a_predicted_stream_gets_the_counts_in_its_final_usage_chunk():
    chunk = {"choices": [{"delta": {"content": "hi"}}]}
    final = {"choices": [], **answer()}
    events = f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(final)}\n\ndata: [DONE]\n\n"
    raw = events.encode()
    pieces = [raw[i : i + 7] for i in range(0, len(raw), 7)]  # events split anywhere
    messages = [start()] + [
        {"type": "http.response.body", "body": p, "more_body": True} for p in pieces
    ]
    messages.append({"type": "http.response.body", "body": b"", "more_body": False})
    request = {"messages": [], "stream": True, "prediction": {"content": "x"}}
    _, bodies, _ = serve(request, messages)
    assert not bodies[-1].get("more_body", False)
    out = b"".join(m["body"] for m in bodies).decode().split("\n\n")
    assert json.loads(out[0][6:]) == chunk
    details = json.loads(out[1][6:])["usage"]["completion_tokens_details"]
    assert details == {"accepted_prediction_tokens": 9, "rejected_prediction_tokens": 3}
    assert out[2:] == ["data: [DONE]", ""]


def test_the_event_rewriter_keeps_incomplete_events_for_later():
    rewriter = EventRewriter()
    assert rewriter.feed(b"data: {") == b""
    assert rewriter.feed(b'"a": 1}\n\ndata: {"b"') == b'data: {"a": 1}\n\n'
    assert rewriter.flush() == b'data: {"b"'
