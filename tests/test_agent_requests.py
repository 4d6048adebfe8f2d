"""The request shapes the coding agents send, written by hand after captures of Claude Code
2.1.332, Codex 0.171.0, Qwen Code 0.24.4 and opencode 1.18.33 (the same field names, nesting
and types; made-up short strings), served by the real app over a tiny model: each is a 200
with a meaningful answer. Fields the server does not declare are ignored and said in
``x-promptlookup-ignored-fields``, tools it does not run are left out and said in
``x-promptlookup-ignored-tools``, a typo of a field it implements is a 400 naming the field
meant (see docs/server.md, "Fields and tools the server does not use")."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from test_server_anthropic import KEY, server  # noqa: F401 (the fixture: the tiny model, a key)
from test_server_tools import WEATHER

from promptlookup.server.anthropic.protocol import MessagesRequest
from promptlookup.server.request_base import parse_request

FIELDS, TOOLS_LEFT_OUT = "x-promptlookup-ignored-fields", "x-promptlookup-ignored-tools"
ANTHROPIC = {"x-api-key": KEY, "anthropic-version": "2023-06-01",
             "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"}  # fmt: skip
BEARER = {"Authorization": f"Bearer {KEY}"}
EPHEMERAL = {"type": "ephemeral"}
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


def post(server, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    headers = BEARER if headers is None else headers
    return httpx.post(server.url + path, json=body, headers=headers, timeout=120)


def events(server, path: str, body: dict, headers: dict) -> tuple[httpx.Response, list[dict]]:
    """A streamed answer's response and its events' data."""
    with httpx.stream("POST", server.url + path, json=body, headers=headers, timeout=120) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    return r, [json.loads(line.removeprefix("data: ")) for line in lines]


# -- Claude Code: POST /v1/messages ---------------------------------------------------------


def billing(version: str, nonce: str) -> str:
    """Claude Code's first system block (made-up values): a version whose suffix and a
    ``cch`` value that change between requests."""
    return f"x-anthropic-billing-header: cc_version={version}; cc_entrypoint=sdk-cli; cch={nonce};"


def claude_code_body(**changes) -> dict:
    """A first turn as Claude Code sends it: three system blocks (cache_control on two), a
    ``system`` message inside ``messages``, tools (one deferred), thinking, context
    management, output_config.effort, metadata."""
    body = {
        "model": "tiny",
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "note"},
                {"type": "text", "text": "fix calc", "cache_control": EPHEMERAL},
            ]},
            {"role": "system", "content": "the repository is small"},
        ],
        "system": [
            {"type": "text", "text": billing("1.0.0.abc", "00f1e")},
            {"type": "text", "text": "You are an agent.", "cache_control": EPHEMERAL},
            {"type": "text", "text": "Be brief.", "cache_control": EPHEMERAL},
        ],
        "tools": [
            {"name": "Read", "description": "read a file", "input_schema": SCHEMA},
            {"name": "Placeholder", "description": "later", "input_schema": {"type": "object"},
             "defer_loading": True},
        ],
        "metadata": {"user_id": "u1"},
        "max_tokens": 32000,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "stream": True,
        "temperature": 0,
    }  # fmt: skip
    return {**body, **changes}


def test_claude_code_first_turn_streams_an_answer_and_ignores_nothing(server):
    response, data = events(server, "/v1/messages?beta=true", claude_code_body(), ANTHROPIC)
    assert response.status_code == 200
    assert FIELDS not in response.headers and TOOLS_LEFT_OUT not in response.headers
    kinds = [event["type"] for event in data]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    blocks = [e["content_block"]["type"] for e in data if e["type"] == "content_block_start"]
    assert blocks and set(blocks) <= {"text", "tool_use"}
    final = next(e for e in data if e["type"] == "message_delta")
    assert final["delta"]["stop_reason"] in ("end_turn", "max_tokens", "tool_use")
    assert final["usage"]["output_tokens"] > 0


def test_claude_code_later_turn_with_tool_use_and_result(server):
    history = claude_code_body(stream=False, max_tokens=40)
    history["messages"] += [
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "look first", "signature": "c2ln"},
            {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "calc.py"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "def add(a, b): ...",
             "cache_control": EPHEMERAL},
        ]},
    ]  # fmt: skip
    response = post(server, "/v1/messages", history, ANTHROPIC)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["type"] == "message" and answer["content"]
    assert answer["usage"]["input_tokens"] + answer["usage"]["cache_read_input_tokens"] > 0


def count(server, body: dict) -> int:
    body = {k: v for k, v in body.items() if k not in ("stream", "max_tokens")}
    response = post(server, "/v1/messages/count_tokens", body, ANTHROPIC)
    assert response.status_code == 200, response.text
    return response.json()["input_tokens"]


def test_system_messages_are_folded_into_the_system_prompt_in_order(server):
    inside = claude_code_body(system="first")
    inside["messages"] = [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "second"},
        {"role": "assistant", "content": "yes"},
        {"role": "system", "content": "third"},
        {"role": "user", "content": "go"},
    ]
    folded = claude_code_body(system="first\n\nsecond\n\nthird")
    folded["messages"] = [m for m in inside["messages"] if m["role"] != "system"]
    assert count(server, inside) == count(server, folded)
    chat = parse_request(MessagesRequest, inside).as_chat()["messages"]
    assert chat[0] == {"role": "system", "content": "first\n\nsecond\n\nthird"}
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user"]


def test_claude_codes_billing_line_is_left_out_of_the_prompt(server):
    """Its values change between requests at the prompt's very start; the prompt is the
    system prompt without it (a block, or a string's first line), so requests that differ
    only there have the same prompt, and the prefix cache finds it."""
    body = claude_code_body(stream=False)
    other = claude_code_body(stream=False)
    other["system"] = [{"type": "text", "text": billing("1.0.0.f00", "9a9a9")}, *body["system"][1:]]
    without = claude_code_body(stream=False, system=body["system"][1:])
    as_string = claude_code_body(
        stream=False, system=billing("2.0.0.123", "1") + "\nYou are an agent.Be brief."
    )
    assert count(server, body) == count(server, other) == count(server, without)
    assert count(server, as_string) == count(server, without)
    chat = parse_request(MessagesRequest, body).as_chat()["messages"]
    assert chat[0] == {
        "role": "system",
        "content": "You are an agent.Be brief.\n\nthe repository is small",
    }
    assert chat == parse_request(MessagesRequest, as_string).as_chat()["messages"]


def test_anthropic_server_and_client_defined_tools_are_left_out_and_said(server):
    hosted = [
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        {"type": "bash_20250124", "name": "bash"},
        {"type": "tool_search_tool_regex_20251119", "name": "tool_search"},
    ]
    plain = claude_code_body(stream=False, max_tokens=8)
    body = {**plain, "tools": [*plain["tools"], *hosted]}
    response = post(server, "/v1/messages", body, ANTHROPIC)
    assert response.status_code == 200, response.text
    assert response.headers[TOOLS_LEFT_OUT] == (
        "tools.2 (web_search_20250305), tools.3 (bash_20250124), "
        "tools.4 (tool_search_tool_regex_20251119)"
    )
    assert count(server, body) == count(server, plain)  # not in the prompt


def test_earlier_server_tool_blocks_are_left_out_and_said(server):
    body = claude_code_body(stream=False, max_tokens=8)
    body["messages"] += [
        {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
             "input": {"query": "q"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
            {"type": "text", "text": "found nothing"},
        ]},
        {"role": "user", "content": "thanks"},
    ]  # fmt: skip
    response = post(server, "/v1/messages", body, ANTHROPIC)
    assert response.status_code == 200, response.text
    assert response.headers[FIELDS] == (
        "messages.2.content.0 (server_tool_use), messages.2.content.1 (web_search_tool_result)"
    )


def test_anthropic_unknown_fields_are_ignored_and_a_typo_is_a_400(server):
    body = claude_code_body(stream=False, max_tokens=8, speed="fast")
    body["tools"][0]["frobnicate"] = 1
    response = post(server, "/v1/messages", body, ANTHROPIC)
    assert response.status_code == 200, response.text
    assert response.headers[FIELDS] == "speed, tools.0.frobnicate"
    typo = post(server, "/v1/messages", {**body, "temprature": 0}, ANTHROPIC)
    assert typo.status_code == 400
    assert typo.json() == {"type": "error", "error": {"type": "invalid_request_error",
        "message": "temprature: unknown field; did you mean 'temperature'?"}}  # fmt: skip
    schema_typo = claude_code_body(stream=False)
    schema_typo["tools"][0] = {"name": "Read", "input_schem": SCHEMA}
    response = post(server, "/v1/messages", schema_typo, ANTHROPIC)
    assert response.status_code == 400
    assert "did you mean 'input_schema'" in response.json()["error"]["message"]


def test_message_start_counts_cached_tokens_apart(server):
    body = claude_code_body(max_tokens=4)
    for _ in range(2):  # the second time, the prompt is in the prefix cache
        response, data = events(server, "/v1/messages", body, ANTHROPIC)
        assert response.status_code == 200
    start = data[0]["message"]["usage"]
    final = next(e for e in data if e["type"] == "message_delta")["usage"]
    prompt = count(server, body)
    assert start["cache_read_input_tokens"] > 0
    assert start["input_tokens"] + start["cache_read_input_tokens"] == prompt
    assert final["input_tokens"] + final["cache_read_input_tokens"] == prompt


@pytest.mark.parametrize(
    "headers, status",
    [
        ({"x-api-key": "wrong"}, 401),
        ({"Authorization": "Bearer wrong", "x-api-key": KEY}, 200),
        ({"Authorization": f"Bearer {KEY}", "x-api-key": "placeholder"}, 200),
        ({}, 401),
    ],
    ids=["wrong-x-api-key", "x-api-key-valid", "authorization-valid", "none"],
)
def test_a_valid_key_in_either_header_authenticates_and_401s_speak_each_api(
    server, headers, status
):
    body = claude_code_body(stream=False, max_tokens=2)
    response = post(server, "/v1/messages", body, headers)
    assert response.status_code == status
    if status == 401:
        assert response.json()["type"] == "error"
        assert response.json()["error"]["type"] == "authentication_error"
        openai_shape = post(server, "/v1/responses", {"model": "tiny", "input": "hi"}, headers)
        assert openai_shape.status_code == 401
        assert openai_shape.json()["error"]["code"] == "invalid_api_key"


# -- Codex: POST /v1/responses --------------------------------------------------------------


def codex_body(**changes) -> dict:
    """A first turn as Codex sends it: developer and user message items with ids, function
    tools (strict false), a namespace of sub-agent functions, a hosted web search, and its
    reasoning/store/include/prompt_cache_key/client_metadata."""
    function = {"type": "function", "strict": False}
    body = {
        "model": "tiny",
        "stream": True,
        "input": [
            {"type": "message", "role": "developer", "id": "msg_1",
             "content": [{"type": "input_text", "text": "You are an agent."}]},
            {"type": "message", "role": "user", "id": "msg_2",
             "content": [{"type": "input_text", "text": "fix calc.py"}]},
        ],
        "tools": [
            {**function, "name": "exec_command", "description": "run", "parameters": SCHEMA},
            {**function, "name": "get_weather", "description": "weather", "parameters": WEATHER},
            {"type": "namespace", "name": "agents", "description": "sub-agents", "tools": [
                {**function, "name": "spawn_agent", "description": "spawn",
                 "parameters": {"type": "object", "properties": {"task": {"enum": ["a", "b"]}},
                                "required": ["task"], "additionalProperties": False}},
            ]},
            {"type": "web_search", "external_web_access": False},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "k1",
        "client_metadata": {"session_id": "s1", "turn_id": "t1"},
        "temperature": 0,
        "max_output_tokens": 60,
    }  # fmt: skip
    return {**body, **changes}


def test_codex_first_turn_streams_and_leaves_out_web_search(server):
    response, data = events(server, "/v1/responses", codex_body(), BEARER)
    assert response.status_code == 200
    assert response.headers[TOOLS_LEFT_OUT] == "tools.3 (web_search)"
    assert FIELDS not in response.headers
    kinds = [event["type"] for event in data]
    assert kinds[0] == "response.created"
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert data[-1]["response"]["output"]


def test_a_namespace_tool_is_called_with_its_namespace_whole_and_streamed(server):
    body = codex_body(stream=False, tool_choice="required", parallel_tool_calls=False)
    body["tools"], body["max_output_tokens"] = [body["tools"][2]], 200
    whole = post(server, "/v1/responses", body)
    assert whole.status_code == 200, whole.text
    (call,) = whole.json()["output"]
    assert (call["type"], call["namespace"], call["name"]) == ("function_call", "agents",
                                                               "spawn_agent")  # fmt: skip
    assert "task" in json.loads(call["arguments"])
    _, data = events(server, "/v1/responses", {**body, "stream": True}, BEARER)
    done = [e["item"] for e in data if e["type"] == "response.output_item.done"]
    assert [(i["namespace"], i["name"]) for i in done] == [("agents", "spawn_agent")]
    # The next turn sends the call back, with its namespace, and its output.
    turn = codex_body(stream=False, max_output_tokens=8)
    turn["input"] += [
        {"type": "function_call", "id": "fc_1", "status": "completed", "call_id": call["call_id"],
         "namespace": "agents", "name": "spawn_agent", "arguments": call["arguments"]},
        {"type": "function_call_output", "id": "fco_1", "call_id": call["call_id"],
         "output": "started"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e30="},
    ]  # fmt: skip
    response = post(server, "/v1/responses", turn)
    assert response.status_code == 200, response.text
    assert response.json()["status"] in ("completed", "incomplete")


@pytest.mark.parametrize(
    "change, says",
    [
        ({"input": []}, "input: the list of input items is empty"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input: there is no message"),
        ({"max_output_token": 5}, "did you mean 'max_output_tokens'"),
        ({"tools": [{"type": "functon", "name": "a"}]}, "did you mean 'function'"),
        ({"tool_choice": {"type": "web_search"}}, "choosing a 'web_search' tool is not supported"),
    ],
    ids=["empty-input", "only-reasoning", "typo", "tool-type-typo", "hosted-tool-choice"],
)
def test_responses_400s_name_the_responses_fields(server, change, says):
    response = post(server, "/v1/responses", codex_body(stream=False, **change))
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert says in message and "messages" not in message


def test_responses_unknown_fields_and_hosted_items_are_ignored_and_said(server):
    body = codex_body(stream=False, max_output_tokens=4, frobnicate={"a": 1})
    body["input"].insert(1, {"type": "web_search_call", "id": "ws_1", "status": "completed",
                             "action": {"type": "search", "query": "q"}})  # fmt: skip
    response = post(server, "/v1/responses", body)
    assert response.status_code == 200, response.text
    assert response.headers[FIELDS] == "frobnicate, input.1 (web_search_call)"


# -- Qwen Code and opencode: POST /v1/chat/completions ---------------------------------------


def chat_body(**changes) -> dict:
    """A turn as Qwen Code and opencode send it: text parts, a tool call and its result,
    streamed with usage."""
    body = {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "You are an agent."}]},
            {"role": "user", "content": "fix calc.py"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "read_file", "arguments": "{\"path\": \"calc.py\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "def add(a, b): ..."},
        ],
        "tools": [{"type": "function", "function": {
            "name": "read_file", "description": "read", "parameters": SCHEMA}}],
        "tool_choice": "auto",
        "max_tokens": 30,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
    }  # fmt: skip
    return {**body, **changes}


def test_qwen_code_and_opencode_turns_stream_with_usage(server):
    response, data = events(server, "/v1/chat/completions", chat_body(), BEARER)
    assert response.status_code == 200
    assert FIELDS not in response.headers
    assert data[-1]["usage"]["prompt_tokens"] > 0
    assert any(c["choices"] and c["choices"][0]["finish_reason"] for c in data)


def test_chat_ignores_what_it_does_not_use_and_leaves_out_custom_tools(server):
    body = chat_body(stream=False, store=False, metadata={"a": "b"}, min_p=0.1)
    body["messages"][1] = {"role": "user", "content": [
        {"type": "text", "text": "fix calc.py", "cache_control": EPHEMERAL}]}  # fmt: skip
    body["messages"][2]["reasoning_content"] = "read it first"
    body["tools"] += [
        {"type": "custom", "custom": {"name": "apply_patch", "format": {"type": "text"}}},
        {"type": "web_search"},
    ]
    response = post(server, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
    assert response.headers[FIELDS] == "min_p"
    assert response.headers[TOOLS_LEFT_OUT] == "tools.1 (custom), tools.2 (web_search)"
    for typo, meant in [("max_token", "max_tokens"), ("tool_choise", "tool_choice")]:
        response = post(server, "/v1/chat/completions", {**body, typo: 1})
        assert response.status_code == 400
        error = response.json()["error"]
        assert (error["param"], f"did you mean {meant!r}" in error["message"]) == (typo, True)


@pytest.mark.parametrize(
    "change, param",
    [
        ({"prediction": {"type": "content", "content": "a\ud800b"}}, "prediction"),
        ({"messages": [{"role": "user", "content": "\udfff"}]}, "messages"),
        ({"tools": [{"type": "function", "function": {"name": "f", "description": "\ud83d"}}]},
         "tools"),
    ],
    ids=["prediction", "message", "tool-description"],
)  # fmt: skip
def test_a_lone_surrogate_anywhere_is_a_400(server, change, param):
    body = json.dumps(chat_body(stream=False, **change))  # \\u escapes: the lone surrogates
    response = httpx.post(
        server.url + "/v1/chat/completions",
        content=body,
        headers={**BEARER, "Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert "not valid Unicode" in response.json()["error"]["message"]


def test_an_overlong_prompt_names_the_context_and_the_prompt(server):
    context = server.state.lm.target.max_context
    text = "ab " * context
    body = chat_body(stream=False, messages=[{"role": "user", "content": text}])
    response = post(server, "/v1/chat/completions", body)
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert f"maximum context length is {context} tokens" in message
    assert re.search(r"the prompt has \d+ tokens", message), message
