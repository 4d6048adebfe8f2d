"""A next turn reuses the answer before it when the answer was tool calls and the client sends
them back as Qwen Code does (chat completions, streamed; the assistant message with
``tool_calls``, ``content`` null or empty, each call's arguments re-serialized compactly by
JSON.stringify, the results as tool messages of text parts): in the generic format, for a
model without a chat template (Gemma 3 270M's GGUF) and one whose template lists no tools, its
prompt's token ids start with the turn's prompt and every token generated (the end marker
aside), several calls included; through the server, the prefix cache finds them."""

from __future__ import annotations

import json
import warnings

import pytest
from _server import FIXED, RunningServer
from test_answer_cache import CHATML, request, turn_ids
from test_server_tool_template import template_lm
from test_server_tools import ascii_lm

from promptlookup.grammar import Grammar
from promptlookup.server import ServerSettings, create_app
from promptlookup.server.reading import read_answer
from promptlookup.server.tool_template import detect, encode
from promptlookup.server.tools import dumps

#: A shell tool whose commands are a few (a random model's answer stays short).
COMMANDS = ["ls", "pwd", "cat calc.py"]
SHELL = {
    "type": "object",
    "properties": {"command": {"enum": COMMANDS}, "is_background": {"type": "boolean"}},
    "required": ["command", "is_background"],
}
TOOLS = [{"type": "function", "function": {"name": "run_shell_command", "parameters": SHELL}}]
QUESTION = [
    {"role": "system", "content": "You run commands."},
    {"role": "user", "content": [{"type": "text", "text": "List the files, then where."}]},
]


def sent_back(calls: list[dict], content) -> list[dict]:
    """The assistant message and tool results as Qwen Code sends them back."""
    calls = [
        {
            "id": call["id"],
            "type": "function",
            "function": {
                "name": call["function"]["name"],
                "arguments": json.dumps(
                    json.loads(call["function"]["arguments"]), separators=(",", ":")
                ),
            },
        }
        for call in calls
    ]
    results = [
        {"role": "tool", "tool_call_id": call["id"], "content": [{"type": "text", "text": "ok"}]}
        for call in calls
    ]
    return [{"role": "assistant", "content": content, "tool_calls": calls}, *results]


@pytest.mark.filterwarnings("ignore:tiny has no chat template")
@pytest.mark.parametrize("make", [ascii_lm, lambda: template_lm(CHATML)], ids=["none", "chatml"])
@pytest.mark.parametrize("content", [None, ""])
def test_several_calls_sent_back_start_the_next_turn_with_the_tokens_generated(make, content):
    lm = make()
    assert detect(lm.tokenizer) is None  # the generic format
    req = request(lm, QUESTION, TOOLS, "auto")
    ids = encode(lm, req.prompt_messages(None), None)
    # The model made to write three calls (its tokens) as the generic format lays them out.
    calls = [{"name": "run_shell_command", "arguments": {"command": c, "is_background": False}}
             for c in COMMANDS]  # fmt: skip
    answer = dumps({"tool_calls": calls})
    forced = Grammar.lark(f"start: {json.dumps(answer)}\n")
    result = lm.generate(ids, max_new_tokens=len(answer) + 8, grammar=forced)
    assert result.text == answer and result.finish_reason == "stop"
    _, read = read_answer(result.text, req.tool_plan(None))
    assert [json.loads(call["function"]["arguments"])["command"] for call in read] == COMMANDS
    generated = [t for t in result.token_ids if t not in lm.eos_token_ids]
    following = [*QUESTION, *sent_back(read, content), {"role": "user", "content": "Now?"}]
    again = turn_ids(lm, following, TOOLS, "auto")
    assert again[: len(ids) + len(generated)] == ids + generated


@pytest.fixture(scope="module")
def server():
    warnings.filterwarnings("ignore", "tiny has no chat template", RuntimeWarning)
    with RunningServer(create_app(ascii_lm(), ServerSettings(generation_options=FIXED))) as s:
        yield s


def streamed(client, messages) -> tuple[list[dict], object]:
    """A streamed answer's calls, put together as a client does, and its usage."""
    chunks = client.chat.completions.create(
        model="tiny", messages=messages, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_tokens=200, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    calls, usage = {}, None
    for chunk in chunks:
        usage = chunk.usage or usage
        for delta in (c.delta for c in chunk.choices):
            for piece in delta.tool_calls or ():
                call = calls.setdefault(piece.index, {"id": None, "function": {"arguments": ""}})
                call["id"] = piece.id or call["id"]
                call["function"]["name"] = piece.function.name or call["function"].get("name")
                call["function"]["arguments"] += piece.function.arguments or ""
    return [calls[i] for i in sorted(calls)], usage


def test_through_the_server_the_next_turn_finds_the_streamed_call_cached(server):
    client = server.client()
    calls, first = streamed(client, QUESTION)
    assert calls and first.completion_tokens > 0
    _, second = streamed(client, [*QUESTION, *sent_back(calls, None)])
    # All but the answer's last token (its keys were never computed).
    cached = second.prompt_tokens_details.cached_tokens
    assert cached >= first.prompt_tokens + first.completion_tokens - 1
