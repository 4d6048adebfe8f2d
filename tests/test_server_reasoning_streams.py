"""A thinking model's streamed answer in each API's events (:class:`.streams.APIEvents` over
a finished job, :mod:`promptlookup.server.reasoning`): the markers cut across deltas, the
reasoning's pieces before the text's, what the splitter held back given out before the end,
a call after the reasoning ending the answer as a call, and the same blocks, items and message
as the whole answer however the answer ends (all reasoning, cut right after the opening
marker, or none)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from promptlookup.server.anthropic.serving import EventWriter, _blocks
from promptlookup.server.openai.answers import ChunkEvents, _chat_choice
from promptlookup.server.reading import read_choice
from promptlookup.server.reasoning import ThinkFormat, Thinking
from promptlookup.server.responses.protocol import ResponsesRequest
from promptlookup.server.responses.serving import ResponseEvents, _shell, output_items
from promptlookup.server.tools import NO_PARAMETERS, ToolPlan

FORM = ThinkFormat("<think>", "</think>")
META = {"id": "c", "created": 0, "model": "tiny"}


def _events(text: str) -> list[tuple[str, dict]]:
    """Server-sent events as ``(event, data)``."""
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


#: An answer's deltas with its markers cut across them.
DELTAS = ["  <thi", "nk>ab", "c</th", "ink>\nhel", "lo</"]


class _Job:
    """A finished job's events (:meth:`.streams.APIEvents.events` reads them): ``deltas``,
    then its one choice."""

    def __init__(self, deltas: list[str]) -> None:
        self.events = asyncio.Queue()
        for delta in deltas:
            self.events.put_nowait(("delta", (0, delta, None)))
        stats = SimpleNamespace(cached_tokens=0)
        text = "".join(deltas)
        result = SimpleNamespace(finish_reason="stop", text=text, prompt_ids=[1, 2, 3], stats=stats)
        self.choice = choice = SimpleNamespace(index=0, result=result, tokens=len(deltas))
        self.events.put_nowait(("choice", choice))
        self.events.put_nowait(("done", [choice]))

    def cancel(self) -> None:
        pass


def _streamed(writer, deltas: list[str] = DELTAS) -> str:
    """The events ``writer`` sends for a job of ``deltas``, its end included."""

    async def events():
        return "".join([event async for event in writer.events(_Job(deltas))])

    return asyncio.run(events())


def test_a_streamed_thinking_block_with_markers_cut_across_deltas():
    writer = EventWriter("msg_1", "tiny", 3, None, thinking=Thinking(FORM, False))
    kinds = [
        (kind, data.get("content_block") or data.get("delta"))
        for kind, data in _events(_streamed(writer))
        if kind.startswith("content_block")
    ]
    assert kinds == [
        ("content_block_start", {"type": "thinking", "thinking": "", "signature": ""}),
        ("content_block_delta", {"type": "thinking_delta", "thinking": "ab"}),
        ("content_block_delta", {"type": "thinking_delta", "thinking": "c"}),
        ("content_block_delta", {"type": "signature_delta", "signature": ""}),
        ("content_block_stop", None),
        ("content_block_start", {"type": "text", "text": ""}),
        ("content_block_delta", {"type": "text_delta", "text": "\nhel"}),
        ("content_block_delta", {"type": "text_delta", "text": "lo</"}),
        ("content_block_stop", None),
    ]  # fmt: skip


def test_a_streamed_reasoning_item_with_markers_cut_across_deltas():
    shell = _shell("tiny", ResponsesRequest.model_validate({"model": "tiny", "input": "x"}))
    writer = ResponseEvents(shell, None, {}, Thinking(FORM, False))
    events = _events(_streamed(writer))
    kinds = [kind for kind, _ in events]
    assert kinds == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.output_item.done", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert events[5][1]["text"] == "abc" and events[6][1]["item"]["type"] == "reasoning"
    output = events[-1][1]["response"]["output"]
    assert output[0]["content"] == [{"type": "reasoning_text", "text": "abc"}]
    assert output[1]["content"][0]["text"] == "\nhello</"


def test_streamed_reasoning_content_chunks_with_markers_cut_across_deltas():
    writer = ChunkEvents(META, True, "fp", False, thinking=Thinking(FORM, False))
    sent = [f"data: {block}" for block in _streamed(writer).split("data: ")[1:]]
    deltas = [json.loads(e[6:])["choices"][0]["delta"] for e in sent[:-1]]
    assert sent[-1] == "data: [DONE]\n\n"
    assert [d.get("reasoning_content") for d in deltas if "reasoning_content" in d] == ["ab", "c"]
    assert "".join(d.get("content") or "" for d in deltas) == "\nhello</"
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all("reasoning_content" not in d for d in deltas[first_content:])


#: An answer that reasons, then calls a tool in the generic format (:mod:`.tools`).
CALL = ["<think>pl", "an</think>", '{"tool_calls": [{"name": "now", "arguments": {}}]}']
PLAN = ToolPlan([{"name": "now", "parameters": NO_PARAMETERS}])


def test_a_call_after_the_reasoning_ends_each_stream_as_a_call():
    thinking = Thinking(FORM, False)
    chat = _streamed(ChunkEvents(META, True, "fp", False, PLAN, thinking=thinking), CALL)
    chunks = [json.loads(e) for e in chat.split("data: ")[1:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "plan"
    assert [d["tool_calls"][0]["function"]["name"] for d in deltas if "tool_calls" in d] == ["now"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    message = _events(_streamed(EventWriter("msg_1", "tiny", 3, PLAN, thinking=thinking), CALL))
    blocks = [data["content_block"]["type"] for kind, data in message if "content_block" in data]
    assert blocks == ["thinking", "tool_use"]
    assert message[-2][1]["delta"]["stop_reason"] == "tool_use"
    shell = _shell("tiny", ResponsesRequest.model_validate({"model": "tiny", "input": "x"}))
    response = _events(_streamed(ResponseEvents(shell, PLAN, {}, thinking), CALL))[-1][1][
        "response"
    ]
    assert [item["type"] for item in response["output"]] == ["reasoning", "function_call"]
    assert response["status"] == "completed"


#: Answers whose reasoning is all or part of them, cut anywhere (a model stopped or cut at
#: its length inside or right after the opening marker), and answers without reasoning.
ENDINGS = [
    ["<think>"], [" <th", "ink>"], ["<think>ab", "c"], ["<think>abc</think>"],
    ["<think></think>"], ["<think></th", "ink>hi"], ["<think>a</think>", "hi"], ["hi"], [""],
]  # fmt: skip


def _whole(deltas: list[str]):
    """The whole answer of a job of ``deltas``, as every API reads it."""
    return read_choice(_Job(deltas).choice, None, Thinking(FORM, False))


def _block_text(block) -> str:
    return block.thinking if block.type == "thinking" else block.text


def test_an_answer_gives_the_same_blocks_whole_and_streamed():
    """Anthropic: a thinking block wherever the answer began with reasoning (empty or cut
    short), a text block where it has text or nothing else."""
    for deltas in ENDINGS:
        whole = [(block.type, _block_text(block)) for block in _blocks(_whole(deltas))]
        writer = EventWriter("msg_1", "tiny", 3, None, thinking=Thinking(FORM, False))
        streamed = []
        for kind, data in _events(_streamed(writer, deltas)):
            if kind == "content_block_start":
                streamed.append((data["content_block"]["type"], ""))
            elif kind == "content_block_delta" and "signature" not in data["delta"]:
                piece = data["delta"].get("thinking", data["delta"].get("text"))
                streamed[-1] = (streamed[-1][0], streamed[-1][1] + piece)
        assert streamed == whole, deltas
        assert whole[-1][0] == "text" or [kind for kind, _ in whole] == ["thinking"], deltas


def test_an_answer_gives_the_same_items_whole_and_streamed():
    shell = _shell("tiny", ResponsesRequest.model_validate({"model": "tiny", "input": "x"}))
    for deltas in ENDINGS:
        answer = _whole(deltas)
        whole = [(item.type, item.content[0].text) for item in output_items(answer, {})]
        writer = ResponseEvents(shell, None, {}, Thinking(FORM, False))
        output = _events(_streamed(writer, deltas))[-1][1]["response"]["output"]
        assert [(item["type"], item["content"][0]["text"]) for item in output] == whole, deltas
        if answer.reasoning is not None:
            assert whole[0] == ("reasoning", answer.reasoning), deltas


def test_an_answer_gives_the_same_message_whole_and_streamed():
    for deltas in ENDINGS:
        answer = _whole(deltas)
        message = _chat_choice(SimpleNamespace(index=0, logprobs=None), answer).message
        writer = ChunkEvents(META, True, "fp", False, thinking=Thinking(FORM, False))
        sent = [json.loads(e) for e in _streamed(writer, deltas).split("data: ")[1:-1]]
        got = [chunk["choices"][0]["delta"] for chunk in sent if chunk["choices"]]
        thoughts = [d["reasoning_content"] for d in got if "reasoning_content" in d]
        assert ("".join(thoughts) if thoughts else None) == message.reasoning_content, deltas
        assert "".join(d.get("content") or "" for d in got) == (message.content or ""), deltas
