"""Every field the three APIs document and the server does not use, and every tool type it
does not run, as issue 52 lists them (docs/server.md, "Fields and tools the server does not
use"): each request is a 200 that ignores nothing (the field is declared, so never taken for
a typo or listed as unknown), and what the model sees is the prompt without it
(``count_tokens`` and ``/tokenize`` count the same tokens as the bare request)."""

from __future__ import annotations

import httpx
import pytest
from test_agent_requests import (
    ANTHROPIC,
    BEARER,
    EPHEMERAL,
    FIELDS,
    SCHEMA,
    TOOLS_LEFT_OUT,
    chat_body,
    claude_code_body,
    codex_body,
    count,
    post,
)
from test_server_anthropic import server  # noqa: F401 (the fixture: the tiny model, a key)

#: Chat completions' documented fields without effect (docs/server.md's table).
CHAT_UNUSED = {
    "store": False,
    "metadata": {"session": "s1"},
    "service_tier": "auto",
    "prompt_cache_key": "k1",
    "prompt_cache_retention": "24h",
    "safety_identifier": "h1",
    "reasoning_effort": "high",
    "verbosity": "low",
    "user": "u1",
}
#: The Responses API's (docs/server.md, "OpenAI's Responses API").
RESPONSES_UNUSED = {
    "store": False,
    "reasoning": {"effort": "high", "summary": "auto"},
    "metadata": {"a": "b"},
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "k1",
    "prompt_cache_retention": "in-memory",
    "client_metadata": {"session_id": "s1"},
    "safety_identifier": "h1",
    "user": "u1",
    "service_tier": "auto",
    "truncation": "disabled",
    "stream_options": {"include_obfuscation": False},
    "text": {"verbosity": "low"},
}
#: Messages' (docs/server.md, "Anthropic's Messages API").
MESSAGES_UNUSED = {
    "metadata": {"user_id": "u1"},
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
    "output_config": {"effort": "medium"},
    "service_tier": "auto",
    "container": "c1",
    "mcp_servers": [],
    "inference_geo": "us",
    "cache_control": EPHEMERAL,
}


def tokenized(server, body: dict) -> int:
    """The prompt tokens of a chat request (vLLM's ``/tokenize`` chat form)."""
    keep = {k: body[k] for k in ("messages", "tools") if k in body}
    response = httpx.post(server.url + "/tokenize", json=keep, headers=BEARER, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["count"]


@pytest.mark.parametrize("field", sorted(CHAT_UNUSED))
def test_chat_fields_without_effect_are_accepted_and_ignore_nothing(server, field):
    body = chat_body(stream=False, max_tokens=2, **{field: CHAT_UNUSED[field]})
    response = post(server, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    assert FIELDS not in response.headers and TOOLS_LEFT_OUT not in response.headers


@pytest.mark.parametrize("field", sorted(RESPONSES_UNUSED))
def test_responses_fields_without_effect_are_accepted_and_ignore_nothing(server, field):
    body = codex_body(stream=False, max_output_tokens=2, **{field: RESPONSES_UNUSED[field]})
    body["tools"] = body["tools"][:3]  # the web search aside: said in its own header
    response = post(server, "/v1/responses", body)
    assert response.status_code == 200, response.text
    assert FIELDS not in response.headers and TOOLS_LEFT_OUT not in response.headers


@pytest.mark.parametrize("field", sorted(MESSAGES_UNUSED))
def test_messages_fields_without_effect_are_accepted_and_change_no_prompt(server, field):
    bare = claude_code_body(stream=False, max_tokens=2, thinking=None, context_management=None,
                            output_config=None, metadata=None)  # fmt: skip
    body = {**bare, field: MESSAGES_UNUSED[field]}
    response = post(server, "/v1/messages", body, ANTHROPIC)
    assert response.status_code == 200, response.text
    assert FIELDS not in response.headers and TOOLS_LEFT_OUT not in response.headers
    assert count(server, body) == count(server, bare)


def test_cache_control_everywhere_anthropic_takes_it_changes_nothing(server):
    """On the body, system blocks, text, tool_use, tool_result and thinking blocks, a tool
    result's own text blocks, and tools: accepted, nothing ignored, the same prompt."""

    def conversation(mark: dict) -> dict:
        body = claude_code_body(stream=False, max_tokens=2, **mark)
        body["system"] = [{"type": "text", "text": "You are an agent.", **mark}]
        body["tools"] = [{"name": "Read", "input_schema": SCHEMA, **mark}]
        body["messages"] = [
            {"role": "user", "content": [{"type": "text", "text": "fix calc", **mark}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "read it", "signature": "", **mark},
                {"type": "text", "text": "reading", **mark},
                {"type": "tool_use", "id": "toolu_1", "name": "Read",
                 "input": {"path": "calc.py"}, **mark},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", **mark,
                 "content": [{"type": "text", "text": "def add(a, b): ...", **mark}]},
            ]},
        ]  # fmt: skip
        return body

    marked, bare = conversation({"cache_control": EPHEMERAL}), conversation({})
    response = post(server, "/v1/messages", marked, ANTHROPIC)
    assert response.status_code == 200, response.text
    assert FIELDS not in response.headers and TOOLS_LEFT_OUT not in response.headers
    assert count(server, marked) == count(server, bare)


def test_chat_cache_control_on_every_text_part_changes_nothing(server):
    marked = chat_body(stream=False, max_tokens=2)
    part = {"type": "text", "text": "You are an agent.", "cache_control": EPHEMERAL}
    marked["messages"][0]["content"] = [part]
    marked["messages"][1]["content"] = [{**part, "text": "fix calc.py"}]
    marked["messages"][3]["content"] = [{**part, "text": "def add(a, b): ..."}]
    response = post(server, "/v1/chat/completions", marked)
    assert response.status_code == 200, response.text
    assert FIELDS not in response.headers
    assert tokenized(server, marked) == tokenized(server, chat_body())


#: Hosted and custom tools of the Responses API, as OpenAI documents them (made-up values).
RESPONSES_HOSTED = [
    {"type": "web_search", "search_context_size": "low"},
    {"type": "web_search_preview"},
    {"type": "local_shell"},
    {"type": "shell"},
    {"type": "apply_patch"},
    {"type": "custom", "name": "apply_freeform", "description": "a patch",
     "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
    {"type": "file_search", "vector_store_ids": ["vs_1"]},
    {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "image_generation"},
    {"type": "mcp", "server_label": "x", "server_url": "https://example.com"},
    {"type": "computer_use_preview", "display_width": 8, "display_height": 8,
     "environment": "linux"},
]  # fmt: skip


def test_responses_hosted_and_custom_tools_are_left_out_and_said(server):
    plain = codex_body(stream=False, max_output_tokens=2)
    plain["tools"] = plain["tools"][:1]
    body = {**plain, "tools": [*plain["tools"], *RESPONSES_HOSTED]}
    response = post(server, "/v1/responses", body)
    assert response.status_code == 200, response.text
    said = ", ".join(f"tools.{i + 1} ({t['type']})" for i, t in enumerate(RESPONSES_HOSTED))
    assert response.headers[TOOLS_LEFT_OUT] == said
    assert FIELDS not in response.headers
    # Their earlier calls and outputs are left out of the prompt too.
    body["input"] += [
        {"type": "local_shell_call", "id": "lsh_1", "call_id": "c1", "status": "completed",
         "action": {"type": "exec", "command": ["ls"], "env": {}}},
        {"type": "local_shell_call_output", "id": "lsho_1", "call_id": "c1", "output": "a.py"},
        {"type": "custom_tool_call", "id": "ctc_1", "call_id": "c2", "name": "apply_freeform",
         "input": "*** patch"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
        {"type": "message", "role": "user", "content": "go on"},
    ]  # fmt: skip
    response = post(server, "/v1/responses", body)
    assert response.status_code == 200, response.text
    assert response.headers[FIELDS] == (
        "input.2 (local_shell_call), input.3 (local_shell_call_output), "
        "input.4 (custom_tool_call), input.5 (custom_tool_call_output)"
    )


def test_a_tool_choice_of_a_left_out_tool_is_a_400_in_each_api(server):
    chat = chat_body(stream=False, tools=[{"type": "custom", "custom": {"name": "c"}}],
                     tool_choice={"type": "custom", "custom": {"name": "c"}})  # fmt: skip
    responses = codex_body(stream=False, tool_choice={"type": "local_shell"})
    anthropic = claude_code_body(stream=False, tool_choice={"type": "tool", "name": "bash"})
    anthropic["tools"] = [{"type": "bash_20250124", "name": "bash"}]
    for path, body, headers in [
        ("/v1/chat/completions", chat, BEARER),
        ("/v1/responses", responses, BEARER),
        ("/v1/messages", anthropic, ANTHROPIC),
    ]:
        response = post(server, path, body, headers)
        assert response.status_code == 400, (path, response.text)
        message = response.json()["error"]["message"]
        assert message and "\n" not in message, message


NO_END = {"$ref": "#"}  # no finite value matches it: a 400 when its grammar is built


@pytest.mark.parametrize(
    "path, change, param, says",
    [
        ("/v1/responses", {"input": "ab " * 3000}, "input", "maximum context length is"),
        ("/v1/responses", {"text": {"format": {"type": "json_schema", "name": "x", "schema": NO_END}}},
         "text.format", "text.format: invalid JSON schema: no finite value"),
        ("/v1/responses", {"max_output_tokens": 1, "tool_choice": {"type": "function", "name": "g"}},
         "tool_choice", "tool_choice: no tool is named 'g'"),
        ("/v1/messages", {"output_config": {"format": {"type": "json_schema", "schema": NO_END}}},
         None, "output_config.format: invalid JSON schema: no finite value"),
        ("/v1/messages", {"messages": [{"role": "user", "content": "ab " * 3000}]},
         None, "maximum context length is"),
    ],
    ids=["responses-overlong", "responses-format", "responses-choice", "messages-format",
         "messages-overlong"],
)  # fmt: skip
def test_errors_of_the_chat_form_name_the_apis_own_fields(server, path, change, param, says):
    """The Responses and Messages APIs are served as chat requests: an error found in that
    form names the field the client sent (``input``, ``text.format``,
    ``output_config.format``), never chat's ``messages`` or ``response_format``."""
    if path == "/v1/responses":
        response = post(server, path, codex_body(stream=False, **change))
        error = response.json()["error"]
        assert error["param"] == param
    else:
        response = post(server, path, claude_code_body(stream=False, **change), ANTHROPIC)
        error = response.json()["error"]
    assert response.status_code == 400
    assert says in error["message"], error
    assert "messages" not in error["message"] or path == "/v1/messages"
    assert "response_format" not in error["message"], error


def test_earlier_calls_of_a_chat_custom_tool_are_left_out_with_their_results(server):
    """OpenAI's chat shape of a custom tool's call (``type: "custom"``) in the history: the
    tool is left out, so are its calls and their results (as the Responses API's
    ``custom_tool_call`` items); a function's call beside it stays."""
    custom = {"id": "call_9", "type": "custom", "custom": {"name": "apply_patch", "input": "*"}}
    marked = chat_body(stream=False, max_tokens=2)
    marked["messages"][2]["tool_calls"].append(custom)
    marked["messages"] += [
        {"role": "tool", "tool_call_id": "call_9", "content": "patched"},
        {"role": "assistant", "content": None, "tool_calls": [{**custom, "id": "call_10"}]},
        {"role": "tool", "tool_call_id": "call_10", "content": "patched again"},
        {"role": "user", "content": "go on"},
    ]
    bare = chat_body(stream=False, max_tokens=2)
    bare["messages"].append({"role": "user", "content": "go on"})
    response = post(server, "/v1/chat/completions", marked)
    assert response.status_code == 200, response.text
    assert response.headers[FIELDS] == (
        "messages.2.tool_calls.1 (custom), messages.5.tool_calls.0 (custom)"
    )
    assert tokenized(server, marked) == tokenized(server, bare)
    custom_typo = {**custom, "type": "functon"}
    marked["messages"][5]["tool_calls"] = [custom_typo]
    response = post(server, "/v1/chat/completions", marked)
    assert response.status_code == 400
    assert "did you mean 'function'" in response.json()["error"]["message"]


def test_an_earlier_refusal_part_is_left_out_as_a_messages_refusal_is(server):
    """OpenAI's assistant content may hold ``refusal`` parts beside text: accepted, left out
    of the prompt and said; another part's type is still a 400 naming it."""
    marked = chat_body(stream=False, max_tokens=2)
    marked["messages"][2] = {"role": "assistant", "content": [
        {"type": "text", "text": "no"}, {"type": "refusal", "refusal": "I cannot"}]}  # fmt: skip
    bare = chat_body(stream=False, max_tokens=2)
    bare["messages"][2] = {"role": "assistant", "content": "no"}
    del marked["messages"][3], bare["messages"][3]  # the tool result of the call replaced
    response = post(server, "/v1/chat/completions", marked)
    assert response.status_code == 200, response.text
    assert response.headers[FIELDS] == "messages.2.content.1 (refusal)"
    assert tokenized(server, marked) == tokenized(server, bare)
    marked["messages"][2]["content"][1] = {"type": "input_audio", "input_audio": {}}
    response = post(server, "/v1/chat/completions", marked)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "messages.2.content.1.type: only text content is supported (the model reads text), "
        "not 'input_audio'"
    )
