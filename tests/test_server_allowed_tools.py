"""OpenAI's ``tool_choice`` of type ``allowed_tools`` (chat completions' shape and the
Responses API's): the prompt lists every tool, as the same request with ``auto`` or
``required``, and the grammar lets the answer call only the listed ones; a listed function
the request does not have, or ``required`` with no function listed, is a 400 naming it. A
tiny model over printable ASCII, through the server."""

from __future__ import annotations

import httpx
import pytest
from test_server_tools import GREEDY, MESSAGES, TOOLS, server  # noqa: F401 (the fixture)

from promptlookup.server.openai.protocol import ChatCompletionRequest
from promptlookup.server.request_base import parse_request


def allowed(mode: str, *names: str) -> dict:
    """Chat completions' ``allowed_tools`` choice of the functions ``names``."""
    tools = [{"type": "function", "function": {"name": name}} for name in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": tools}}


def chat(choice) -> ChatCompletionRequest:
    body = {"model": "tiny", "messages": MESSAGES, "tools": TOOLS, "tool_choice": choice}
    return parse_request(ChatCompletionRequest, body)


@pytest.mark.parametrize("mode", ["auto", "required"])
def test_the_prompt_lists_every_tool_and_the_grammar_only_the_allowed(mode):
    request, plain = chat(allowed(mode, "get_time")), chat(mode)
    assert request.prompt_messages() == plain.prompt_messages()
    plan = request.tool_plan()
    assert plan.choice == mode and [t["name"] for t in plan.tools] == ["get_weather", "get_time"]
    assert [tool["name"] for tool in plan.callable()] == ["get_time"]
    calls = plan.schema()
    calls = calls["properties"] if mode == "required" else calls["anyOf"][0]["properties"]
    names = [call["properties"]["name"] for call in calls["tool_calls"]["items"]["anyOf"]]
    assert names == [{"const": "get_time"}]


def test_required_allowed_tools_call_only_those_through_the_server(server):
    answer = server.client().chat.completions.create(
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice=allowed("required", "get_time"),
        parallel_tool_calls=False,
        **GREEDY,
    )
    calls = answer.choices[0].message.tool_calls
    assert calls and {call.function.name for call in calls} == {"get_time"}


def test_the_responses_api_shape_is_served_alike(server):
    tools = [
        {
            "type": "function",
            "name": t["function"]["name"],
            "parameters": t["function"]["parameters"],
        }
        for t in TOOLS
    ] + [{"type": "web_search"}]
    choice = {"type": "allowed_tools", "mode": "required",
              "tools": [{"type": "function", "name": "get_time"}, {"type": "web_search"}]}  # fmt: skip
    body = {"model": "tiny", "input": MESSAGES[0]["content"], "tools": tools,
            "tool_choice": choice, "parallel_tool_calls": False, "temperature": 0, "max_output_tokens": 120}  # fmt: skip
    response = httpx.post(server.url + "/v1/responses", json=body, timeout=120)
    assert response.status_code == 200, response.text
    output = response.json()["output"]
    assert output and {item["name"] for item in output if item["type"] == "function_call"} == {
        "get_time"
    }
    assert response.json()["tool_choice"] == choice


@pytest.mark.parametrize(
    ("choice", "said"),
    [
        (allowed("auto", "get_date"), "allowed_tools: no tool is named 'get_date'"),
        (allowed("required"), "allowed_tools: mode 'required' lists no function tool"),
        ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{}]}},
         "allowed_tools must be"),
    ],
)  # fmt: skip
def test_an_allowed_tools_choice_the_tools_cannot_meet_is_a_400(server, choice, said):
    body = {**GREEDY, "messages": MESSAGES, "tools": TOOLS, "tool_choice": choice}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 400 and said in response.json()["error"]["message"]
    assert response.json()["error"]["param"] == "tool_choice"
