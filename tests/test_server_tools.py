"""Structured output and tool calls through the server (OpenAI's chat completions) with the
official ``openai`` client: ``response_format``, ``tools`` and ``tool_choice``, calls whole and
streamed in OpenAI's delta format, the history's tool calls and results, and one-line 400s for
what cannot be served. A tiny model over printable ASCII, served by the batch decoder."""

from __future__ import annotations

import json
import warnings

import httpx
import jsonschema
import pytest
from _server import FIXED, RunningServer
from conftest import AsciiTokenizer, tiny_llama

from promptlookup import Grammar
from promptlookup.backends.hf.target import TorchTarget
from promptlookup.generation import LanguageModel
from promptlookup.grammar import engine_tokenizer
from promptlookup.server import ServerSettings, create_app
from promptlookup.server.openai.answers import ChunkEvents
from promptlookup.server.reading import ToolStream, parse
from promptlookup.server.tools import ToolPlan, prompt_messages

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "the time in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
GREEDY = {"model": "tiny", "temperature": 0, "max_tokens": 120}
#: An object that requires a property of its own kind: no finite value.
SELF_REQUIRED = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}


def ascii_lm() -> LanguageModel:
    model = tiny_llama(vocab_size=AsciiTokenizer.vocab_size, seed=5, context=2048)
    return LanguageModel(TorchTarget(model), AsciiTokenizer(), name="tiny", model=model)


@pytest.fixture(scope="module")
def server():
    warnings.filterwarnings("ignore", "tiny has no chat template", RuntimeWarning)
    with RunningServer(create_app(ascii_lm(), ServerSettings(generation_options=FIXED))) as s:
        yield s


def streamed(client, **request):
    """A streamed answer, put together: (content, {index: [id, name, arguments]}, finish)."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **request):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for call in choice.delta.tool_calls or ():
            entry = calls.setdefault(call.index, [call.id, call.function.name, ""])
            entry[2] += call.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, calls, finish


def test_a_json_schema_answer_is_valid_whole_and_streamed(server):
    schema = {**WEATHER, "properties": {**WEATHER["properties"], "ok": {"type": "boolean"}}}
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "weather", "schema": schema, "strict": True},
    }
    client = server.client()
    whole = client.chat.completions.create(
        messages=MESSAGES, response_format=response_format, **GREEDY
    )
    jsonschema.validate(json.loads(whole.choices[0].message.content), schema)
    assert whole.choices[0].finish_reason == "stop"
    content, calls, finish = streamed(
        client, messages=MESSAGES, response_format=response_format, **GREEDY
    )
    assert content == whole.choices[0].message.content and not calls and finish == "stop"


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_schema", "json_schema": {"schema": WEATHER}},  # no name (a label only)
        {"type": "json_object", "schema": WEATHER},  # llama-server's way of saying it
    ],
    ids=["json-schema-without-name", "json-object-with-schema"],
)
def test_other_servers_spellings_of_a_schema_are_enforced(server, response_format):
    body = {"messages": MESSAGES, "response_format": response_format, **GREEDY}
    response = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), WEATHER)


def test_json_object_starts_an_object(server):
    answer = server.client().chat.completions.create(
        messages=MESSAGES, response_format={"type": "json_object"}, **GREEDY
    )
    text = answer.choices[0].message.content
    assert text.startswith("{")
    if answer.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_required_tool_calls_come_back_whole_and_streamed_with_arguments_that_parse(server):
    client = server.client()
    request = dict(
        messages=MESSAGES, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, **GREEDY
    )
    whole = client.chat.completions.create(**request)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    content, calls, finish = streamed(client, **request)
    assert finish == "tool_calls" and content == ""
    assert [(name, args) for _, name, args in calls.values()] == [
        (call.function.name, call.function.arguments) for call in choice.message.tool_calls
    ]
    assert all(ident.startswith("call_") for ident, _, _ in calls.values())


def test_a_named_tool_choice_and_no_parallel_calls_give_one_call_of_that_tool(server):
    answer = server.client().chat.completions.create(
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False,
        **GREEDY,
    )
    calls = answer.choices[0].message.tool_calls
    assert [call.function.name for call in calls] == ["get_time"]
    assert json.loads(calls[0].function.arguments)["city"] in ("Paris", "Oslo")


def test_auto_answers_with_text_or_calls_and_takes_a_history_of_calls(server):
    history = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Paris", "days": 3}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    answer = server.client().chat.completions.create(messages=history, tools=TOOLS, **GREEDY)
    choice = answer.choices[0]
    if choice.finish_reason == "tool_calls":
        assert choice.message.tool_calls and choice.message.content is None
    else:
        assert choice.message.tool_calls is None and isinstance(choice.message.content, str)
    none = server.client().chat.completions.create(
        messages=history, tools=TOOLS, tool_choice="none", **GREEDY
    )
    assert none.choices[0].message.tool_calls is None


@pytest.mark.parametrize("step", [1, 2, 5, 13])
def test_a_streamed_answer_adds_up_to_the_whole_one(step):
    text = (
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris \\"x\\"", '
        '"n": [1, {"a": 2}]}}, {"name": "f", "arguments": {}}]}'
    )
    stream, calls = ToolStream(), {}
    for start in range(0, len(text), step):
        content, deltas = stream.feed(text[start : start + step])
        assert content == ""
        for delta in deltas:
            entry = calls.setdefault(
                delta["index"], [delta.get("id"), delta["function"].get("name"), ""]
            )
            entry[2] += delta["function"]["arguments"]
    whole = parse(text)[1]
    assert [(name, args) for _, name, args in calls.values()] == [
        (call["function"]["name"], call["function"]["arguments"]) for call in whole
    ]
    assert json.loads(calls[0][2]) == {"city": 'Paris "x"', "n": [1, {"a": 2}]}
    answer, stream = '{"response": "caf\\u00e9 \\n ok"}', ToolStream()
    pieces = [stream.feed(answer[i : i + step])[0] for i in range(0, len(answer), step)]
    assert "".join(pieces) == "caf\u00e9 \n ok" == parse(answer)[0]


def test_openai_chunks_say_each_delta_as_the_tool_stream_reads_it():
    """A streamed chat answer's chunks (:class:`ChunkEvents`, from the pieces every API
    streams) carry each delta's tool call deltas as :meth:`ToolStream.feed` reads them, wherever
    the deltas are cut: one that ends a call's arguments and begins the next call included."""
    answer = (
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
        '{"name": "f", "arguments": {}}]}'
    )
    plan = ToolPlan([{"name": "get_weather"}, {"name": "f"}])
    meta = {"id": "x", "created": 0, "model": "tiny"}

    def said(call: dict) -> dict:  # the ids are each reader's own
        return {**{key: value for key, value in call.items() if key != "id"}, "new": "id" in call}

    for cut in range(1, len(answer)):
        for length in (1, 9, 30):
            pieces = [answer[:cut], answer[cut : cut + length], answer[cut + length :]]
            chunks, reader = ChunkEvents(meta, True, "fp", False, plan), ToolStream()
            for piece in pieces:
                content, expected = reader.feed(piece)
                sent = chunks.delta(0, piece, None).split("\n\n")[:-1]
                deltas = [json.loads(e.removeprefix("data: "))["choices"][0]["delta"] for e in sent]
                assert len(deltas) == (1 if expected else 0) and content == ""
                calls = [call for delta in deltas for call in delta["tool_calls"]]
                assert list(map(said, calls)) == list(map(said, expected)), (cut, length)


def test_the_generic_format_in_the_prompt():
    plan = ToolPlan([{"name": "f", "description": "", "parameters": {"type": "object"}}])
    history = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "name": "f", "arguments": "{}"}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    system, call, result = prompt_messages(history, plan)
    assert system["content"].startswith("Be brief.\n\nYou can call tools.")
    assert call == {
        "role": "assistant",
        "content": '{"tool_calls": [{"name": "f", "arguments": {}}]}',
    }
    assert json.loads(result["content"]) == {
        "tool_response": {"name": "f", "tool_call_id": "c1", "content": "42"}
    }
    assert result["role"] == "user"
    Grammar.json_schema(plan.schema())  # compiles


@pytest.mark.parametrize(
    "extra, param, says",
    [
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "no tool is named 'nope'",
        ),
        ({"tool_choice": "auto"}, "tool_choice", "there are no tools"),
        (
            {"tools": TOOLS, "tool_choice": "sometimes"},
            "tool_choice",
            "must be 'none', 'auto', 'required'",
        ),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools", "same name"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "wat"}}}
                ]
            },
            "tools",
            "invalid JSON schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "wat"}},
                }
            },
            "response_format",
            "invalid JSON schema",
        ),
        (
            {"response_format": {"type": "json_schema"}},
            "response_format",
            "needs a json_schema object",
        ),
        (
            {"response_format": {"type": "xml"}},
            "response_format",
            "'text', 'json_object' or 'json_schema'",
        ),
        (
            {"response_format": {"type": "text", "schema": WEATHER}},
            "response_format",
            "schema goes with type json_object",
        ),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"$ref": "#"}}}
                ]
            },
            "tools",
            "tool 'f': invalid JSON schema: no finite value matches it",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": SELF_REQUIRED},
                }
            },
            "response_format",
            "invalid JSON schema: no finite value matches it",
        ),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4 stop sequences, got 5"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages", "needs tool_call_id"),
        ({"functions": [{"name": "f"}]}, "functions", "use tools"),
    ],
)
def test_what_cannot_be_served_is_a_400_with_one_readable_line(server, extra, param, says):
    """(The schemas no finite value matches used to be ``stop`` with empty content, or a
    grammar that failed at the first token and took every other stream of the batch.)"""
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, **extra}
    response = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and says in error["message"], error
    assert "\n" not in error["message"] and "Input should be 'none'" not in error["message"]


def test_tools_text_more_than_the_context_can_hold_is_a_400_before_tokenizing(server, monkeypatch):
    """A tool description of megabytes used to be tokenized whole (10-13 s in which every
    other request waited for the tokenizer); now its characters are counted first."""
    limit, context = server.state.max_text_chars, server.state.lm.target.max_context
    tokenized = []
    real = AsciiTokenizer.__call__

    def spy(self, text, add_special_tokens=True):
        tokenized.append(len(text))
        return real(self, text, add_special_tokens)

    monkeypatch.setattr(AsciiTokenizer, "__call__", spy)
    big = {"type": "function", "function": {"name": "big", "description": "x" * limit}}
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, "tools": [big]}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "tools" and error["code"] == "context_length_exceeded"
    assert (
        f"{context} tokens" in error["message"]
        and f"at most {limit} characters" in error["message"]
    )
    assert tokenized == []  # refused before any of it was tokenized


def test_a_tool_without_parameters_is_called_with_an_empty_object(server):
    answer = server.client().chat.completions.create(
        messages=MESSAGES,
        tools=[{"type": "function", "function": {"name": "now"}}],
        tool_choice="required",
        parallel_tool_calls=False,
        **GREEDY,
    )
    calls = answer.choices[0].message.tool_calls
    assert [(call.function.name, call.function.arguments) for call in calls] == [("now", "{}")]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "f"}}])
def test_response_format_beside_required_calls_is_served_as_calls(server, choice):
    """Agents' SDKs send an output schema and tools together; where calls are required the
    answer is calls, which the response format does not shape (as OpenAI serves it)."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": WEATHER}}]
    body = {
        "model": "tiny", "messages": MESSAGES, "max_tokens": 80, "temperature": 0,
        "tools": tools, "tool_choice": choice, "parallel_tool_calls": False,
        "response_format": {"type": "json_object"},
    }  # fmt: skip
    response = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "f"
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)


SUMMARY = {
    "type": "object",
    "properties": {"summary": {"type": "string", "maxLength": 40}},
    "required": ["summary"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("step", [1, 4, 9])
def test_beside_tools_an_answer_in_the_response_format_is_its_json_whole_and_streamed(step):
    """The generic format's ``{"answer": VALUE}``: the value's JSON text is the content; an
    earlier such answer goes back into the prompt the same way."""
    plan = ToolPlan([TOOLS[0]["function"]], "auto", answer=SUMMARY)
    Grammar.json_schema(plan.schema())  # compiles
    text = '{"answer": {"summary": "sunny, \\"warm\\""}}'
    assert parse(text) == ('{"summary": "sunny, \\"warm\\""}', [])
    stream = ToolStream()
    pieces = [stream.feed(text[i : i + step]) for i in range(0, len(text), step)]
    assert "".join(content for content, _ in pieces) == parse(text)[0]
    assert all(calls == [] for _, calls in pieces)
    assert '{"answer": ...}' in plan.instructions() and '"summary"' in plan.instructions()
    history = [{"role": "assistant", "content": '{"summary": "cold"}'}]
    assert prompt_messages(history, plan)[1]["content"] == '{"answer": {"summary": "cold"}}'


def test_beside_tools_a_response_format_is_served_under_auto_whole_and_streamed(server):
    """Agents' SDKs send an output schema and tools together under "auto": the answer is
    calls, or JSON valid against the schema (the grammar takes nothing else); the tiny model
    calls, and its stream ends as its whole answer does."""
    format_ = {"type": "json_schema", "json_schema": {"name": "s", "schema": SUMMARY}}
    client = server.client()
    request = dict(
        messages=MESSAGES, tools=TOOLS, response_format=format_, parallel_tool_calls=False,
        **{**GREEDY, "max_tokens": 400},
    )  # fmt: skip
    choice = client.chat.completions.create(**request).choices[0]
    content, calls, finish = streamed(client, **request)
    assert choice.finish_reason == finish == "tool_calls" and content == ""
    (call,) = choice.message.tool_calls
    assert [call.function.name, call.function.arguments] == calls[0][1:]
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    grammar = ToolPlan([TOOLS[0]["function"]], "auto", answer=SUMMARY).grammar()
    lm = server.state.lm
    for text, taken in [
        ('{"answer": {"summary": "warm"}}', True),
        ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}]}', True),
        ('{"response": "warm"}', False),  # text, where the format asks for JSON
        ('{"answer": {"summary": 3}}', False),
    ]:  # fmt: skip
        matcher = grammar.start(engine_tokenizer(lm.tokenizer, lm.eos_token_ids)).matcher
        ids = lm.tokenizer(text)["input_ids"]
        accepted = all(matcher.consume_token(i) for i in ids) and matcher.is_accepting()
        assert accepted == taken, text


def test_the_default_model_calls_a_tool_through_the_openai_client(default_lm):
    """The real model and chat template, served by the batch decoder: the call comes back with
    arguments that parse, whole and streamed alike."""
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
        TOOLS[1],
    ]
    request = dict(
        model=default_lm.name,
        messages=MESSAGES,
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=80,
    )
    with RunningServer(create_app(default_lm)) as running:
        client = running.client()
        whole = client.chat.completions.create(**request)
        content, calls, finish = streamed(client, **request)
    (call,) = whole.choices[0].message.tool_calls
    assert whole.choices[0].finish_reason == finish == "tool_calls"
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and arguments["city"] == "Paris"
    assert [(name, args) for _, name, args in calls.values()] == [
        (call.function.name, call.function.arguments)
    ]
