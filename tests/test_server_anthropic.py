"""Anthropic's Messages API (``POST /v1/messages``) with the official ``anthropic`` client:
text answers, ``tool_use`` blocks whole and streamed, ``tool_result`` blocks in the history,
the API key in ``x-api-key``, and errors in Anthropic's JSON."""

from __future__ import annotations

import json
import warnings

import anthropic
import httpx
import jsonschema
import pytest
from _server import FIXED, RunningServer
from test_server_tools import WEATHER, ascii_lm

from promptlookup.server import ServerSettings, create_app

TOOLS = [{"name": "get_weather", "description": "the weather", "input_schema": WEATHER}]
MESSAGES = [{"role": "user", "content": "Weather in Oslo for 2 days?"}]
KEY = "secret"
GREEDY = {"temperature": 0}  # current clients no longer send it themselves


@pytest.fixture(scope="module")
def server():
    warnings.filterwarnings("ignore", "tiny has no chat template", RuntimeWarning)
    settings = ServerSettings(generation_options=FIXED, api_key=KEY)
    with RunningServer(create_app(ascii_lm(), settings)) as s:
        yield s


def client(server, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=60)


def test_a_text_answer_and_its_stream_agree(server):
    request = dict(model="tiny", max_tokens=12, messages=MESSAGES, extra_body=GREEDY)
    whole = client(server).messages.create(**request)
    assert whole.type == "message" and whole.role == "assistant"
    assert [block.type for block in whole.content] == ["text"]
    assert whole.stop_reason in ("end_turn", "max_tokens") and whole.usage.output_tokens > 0
    with client(server).messages.stream(**request) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason


def test_tool_use_blocks_whole_and_streamed(server):
    request = dict(
        model="tiny",
        max_tokens=120,
        messages=MESSAGES,
        extra_body=GREEDY,
        tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    whole = client(server).messages.create(**request)
    assert whole.stop_reason == "tool_use"
    (use,) = [block for block in whole.content if block.type == "tool_use"]
    assert use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER)
    with client(server).messages.stream(**request) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    assert "content_block_start" in events and events[-1] == "message_stop"
    (streamed_use,) = [block for block in final.content if block.type == "tool_use"]
    assert (streamed_use.name, streamed_use.input) == (use.name, use.input)
    assert final.stop_reason == "tool_use"


def test_a_tool_result_in_the_history_is_served(server):
    history = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                 "input": {"city": "Oslo", "days": 2}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "snow"}],
        },
    ]  # fmt: skip
    answer = client(server).messages.create(
        model="tiny", max_tokens=60, messages=history, tools=TOOLS, extra_body=GREEDY
    )
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    for block in answer.content:
        if block.type == "tool_use":
            json.dumps(block.input)


def test_errors_are_anthropic_json(server):
    with pytest.raises(anthropic.AuthenticationError):
        client(server, key="wrong").messages.create(model="tiny", max_tokens=4, messages=MESSAGES)
    bad = {
        "model": "tiny",
        "max_tokens": 4,
        "messages": MESSAGES,
        "tools": TOOLS,
        "tool_choice": {"type": "tool", "name": "nope"},
    }
    response = httpx.post(server.url + "/v1/messages", json=bad, headers={"x-api-key": KEY})
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "no tool is named 'nope'" in body["error"]["message"]
    missing = httpx.post(
        server.url + "/v1/messages",
        json={"model": "tiny", "messages": MESSAGES},
        headers={"x-api-key": KEY},
    )
    assert missing.status_code == 400 and "max_tokens" in missing.json()["error"]["message"]


def test_count_tokens_is_the_prompt_a_message_would_have(server):
    """``/v1/messages/count_tokens`` (Claude Code asks it) counts what ``/v1/messages`` would
    read, tools included; the answer's usage splits the same count into the tokens the prefix
    cache held (``cache_read_input_tokens``, all of them when the prompt comes again) and the
    rest."""
    request = dict(model="tiny", messages=MESSAGES, tools=TOOLS)
    counted = client(server).messages.count_tokens(**request).input_tokens
    bare = client(server).messages.count_tokens(model="tiny", messages=MESSAGES).input_tokens
    assert counted > bare > 0  # the tools are part of the prompt
    for _ in range(2):  # the second time, the prompt is found in the prefix cache
        usage = client(server).messages.create(max_tokens=4, extra_body=GREEDY, **request).usage
        assert usage.input_tokens + usage.cache_read_input_tokens == counted
    assert usage.cache_read_input_tokens > 0
    with client(server).messages.stream(max_tokens=4, extra_body=GREEDY, **request) as stream:
        streamed = stream.get_final_message().usage
    assert streamed.input_tokens + streamed.cache_read_input_tokens == counted


def test_earlier_thinking_blocks_are_accepted_and_left_out_of_the_prompt(server):
    thought = [
        MESSAGES[0],
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "The user wants weather.", "signature": "c2ln"},
            {"type": "redacted_thinking", "data": "ZGF0YQ=="},
            {"type": "text", "text": "Which unit?"},
        ]},
        {"role": "user", "content": "Celsius"},
    ]  # fmt: skip
    plain = [*thought[:1], {"role": "assistant", "content": "Which unit?"}, thought[2]]
    count = client(server).messages.count_tokens
    assert count(model="tiny", messages=thought).input_tokens == (
        count(model="tiny", messages=plain).input_tokens
    )


@pytest.mark.parametrize(
    "path, content",
    [
        ("/v1/messages", [{"type": "image", "source": {"type": "base64", "data": "AA=="}}]),
        ("/v1/messages/count_tokens", [{"type": "document", "source": {}}]),
        ("/v1/messages", [{"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "image", "source": {}}]}]),
    ],
    ids=["image", "document", "image-in-a-tool-result"],
)  # fmt: skip
def test_blocks_other_than_text_are_a_400_that_says_so(server, path, content):
    body = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    response = httpx.post(server.url + path, json=body, headers={"x-api-key": KEY})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "only text content is supported" in message and "messages.0.content.0" in message


@pytest.mark.parametrize(
    "spelling",
    [
        lambda schema: {"output_format": {"type": "json_schema", "schema": schema}},
        lambda schema: {"output_config": {"format": {"type": "json_schema", "schema": schema},
                                          "effort": "low"}},
    ],
    ids=["output_format", "output_config"],
)  # fmt: skip
def test_structured_output_is_enforced_whole_and_streamed(server, spelling):
    body = {
        "model": "tiny", "max_tokens": 200, "messages": MESSAGES, **GREEDY,
        **spelling(WEATHER), "tools": [{**TOOLS[0], "strict": True}],
        "tool_choice": {"type": "none"},
    }  # fmt: skip
    headers = {"x-api-key": KEY}
    whole = httpx.post(server.url + "/v1/messages", json=body, headers=headers)
    assert whole.status_code == 200, whole.text
    answer = whole.json()
    assert answer["stop_reason"] == "end_turn"
    (block,) = answer["content"]
    jsonschema.validate(json.loads(block["text"]), WEATHER)
    with httpx.stream(
        "POST", server.url + "/v1/messages", json={**body, "stream": True}, headers=headers
    ) as response:
        events = [
            json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")
        ]
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == block["text"]
