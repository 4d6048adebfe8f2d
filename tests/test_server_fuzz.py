"""The server under generated requests: whatever a client sends, the answer is a 2xx or a 4xx
with OpenAI's error JSON, never a 5xx; and /openapi.json describes the real request bodies."""

from __future__ import annotations

import json

import httpx
import pytest
from _server import FIXED, RunningServer, tiny_lm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_server import GOOD

from promptlookup.server import ServerSettings, create_app

#: Any JSON value (small).
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=8),  # NaN and infinities too (sent as Python writes them)
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
#: Every field a request may carry, each given any JSON value.
FIELDS = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "prediction",
    "logprobs",
    "echo",
    "best_of",
    "suffix",
    "user",
]


@pytest.fixture(scope="module")
def server():
    with RunningServer(create_app(tiny_lm(), ServerSettings(generation_options=FIXED))) as running:
        yield running


def check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
    changes=st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=3),
    dropped=st.sets(st.sampled_from(["model", "messages", "max_tokens"])),
)
def test_no_request_body_gets_a_server_error(server, path, changes, dropped):
    body = {
        key: value
        for key, value in {**GOOD, "prompt": "ab", "max_tokens": 2}.items()
        if key not in dropped
    }
    body.pop("prompt" if "chat" in path else "messages", None)
    body.update(changes)
    if body.get("stream") is True:
        body["stream"] = False  # a stream's errors arrive inside a 200; asked for elsewhere
    content = json.dumps(body)  # NaN, Infinity: not JSON, but clients may send them
    check(
        httpx.post(
            server.url + path,
            content=content,
            timeout=60,
            headers={"Content-Type": "application/json"},
        )
    )


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=st.binary(max_size=64))
def test_no_raw_body_gets_a_server_error(server, raw):
    check(
        httpx.post(
            server.url + "/v1/chat/completions",
            content=raw,
            headers={"Content-Type": "application/json"},
            timeout=60,
        )
    )


def test_openapi_describes_the_request_bodies(server):
    schema = httpx.get(server.url + "/openapi.json").json()
    body = schema["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    reference = body["content"]["application/json"]["schema"]["$ref"]
    chat = schema["components"]["schemas"][reference.rsplit("/", 1)[-1]]
    assert {"model", "messages", "max_tokens", "seed", "prediction"} <= set(chat["properties"])
    assert "prompt" in schema["components"]["schemas"]["CompletionRequest"]["properties"]
