"""OpenAI's Responses API (``POST /v1/responses``) with the official ``openai`` client: text
answers whole and streamed alike, function calls and their outputs in the input, structured
output through ``text.format``, ``usage`` with cached tokens, and what it refuses."""

from __future__ import annotations

import json
import warnings

import httpx
import jsonschema
import openai
import pytest
from _server import FIXED, RunningServer
from test_server_tools import WEATHER, ascii_lm

from promptlookup.server import ServerSettings, create_app

TOOLS = [{"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True}]
INPUT = "What is the weather in Paris for 3 days?"
GREEDY = {"model": "tiny", "temperature": 0}


@pytest.fixture(scope="module")
def server():
    warnings.filterwarnings("ignore", "tiny has no chat template", RuntimeWarning)
    with RunningServer(create_app(ascii_lm(), ServerSettings(generation_options=FIXED))) as s:
        yield s


def test_a_text_answer_whole_and_streamed_alike(server):
    client = server.client()
    request = dict(input=INPUT, instructions="Be brief.", max_output_tokens=12, **GREEDY)
    whole = client.responses.create(**request)
    assert whole.object == "response" and whole.status == "incomplete"  # cut at 12 tokens
    assert whole.incomplete_details.reason == "max_output_tokens"
    (message,) = whole.output
    assert message.type == "message" and message.content[0].type == "output_text"
    assert whole.output_text == message.content[0].text and whole.usage.output_tokens == 12
    events = list(client.responses.create(stream=True, **request))
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.incomplete"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    again = client.responses.create(**request)  # the same prompt: found in the prefix cache
    assert again.usage.input_tokens_details.cached_tokens > 0
    assert again.usage.input_tokens == whole.usage.input_tokens


def test_function_calls_whole_and_streamed_and_their_outputs_in_the_input(server):
    client = server.client()
    request = dict(
        input=INPUT, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
        max_output_tokens=120, **GREEDY,
    )  # fmt: skip
    whole = client.responses.create(**request)
    assert whole.status == "completed"
    (call,) = whole.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    events = list(client.responses.create(stream=True, **request))
    arguments = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    )
    (streamed,) = events[-1].response.output
    assert (streamed.name, streamed.arguments, arguments) == (
        call.name,
        call.arguments,
        call.arguments,
    )
    follow_up = [
        {"role": "user", "content": INPUT},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
    ]  # fmt: skip
    answer = client.responses.create(input=follow_up, tools=TOOLS, max_output_tokens=60, **GREEDY)
    assert answer.status in ("completed", "incomplete") and answer.output


def test_text_format_json_schema_is_enforced(server):
    text = {"format": {"type": "json_schema", "name": "weather", "schema": WEATHER, "strict": True}}
    answer = server.client().responses.create(
        input=INPUT, text=text, max_output_tokens=200, **GREEDY
    )
    assert answer.status == "completed"
    jsonschema.validate(json.loads(answer.output_text), WEATHER)
    assert answer.text.format.type == "json_schema"


@pytest.mark.parametrize(
    "extra, says",
    [
        ({"previous_response_id": "resp_1"}, "stores no responses"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "only text content is supported"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "item_reference"),
        ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools.0.name"),
    ],
    ids=["previous-response", "image", "unknown-item", "bad-tool-name"],
)  # fmt: skip
def test_what_cannot_be_served_is_a_400_with_one_readable_line(server, extra, says):
    body = {"model": "tiny", "input": INPUT, **extra}
    response = httpx.post(server.url + "/v1/responses", json=body)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert says in message and "\n" not in message
    with pytest.raises(openai.BadRequestError):
        server.client().responses.create(**body)
