"""Reading an answer back: its text in the request's tool format (the generic one of
:mod:`.tools`, or the chat template's, :class:`.tools.CallFormat`) read into text and tool
calls, as it streams (:class:`ToolStream`, :func:`stream_pieces`) or once it is finished
(:func:`read_choice`, the one reading of a finished answer that every API writes in its own
shape)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .reasoning import Thinking, apart
from .tools import (
    ANSWER_START,
    ARGUMENTS_START,
    CALL_START,
    CALLS_START,
    NEXT_CALL,
    RESPONSE_START,
    CallFormat,
    Scan,
    ToolPlan,
)

if TYPE_CHECKING:
    from .worker import Choice


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def scan(text: str, template: CallFormat | None = None) -> Scan:
    """Read a (partial) answer in the generic format, as laid out by the grammar, or in the
    chat template's format (:meth:`.tool_template.TemplateFormat.scan`)."""
    if template is not None:
        return template.scan(text)
    if text.startswith(RESPONSE_START):
        return Scan(content=_string_prefix(text, len(RESPONSE_START)))
    if text.startswith(ANSWER_START):  # the value's JSON text, as far as it is written
        stop = _value_end(text, len(ANSWER_START))
        return Scan(content=text[len(ANSWER_START) : stop])
    if not text.startswith(CALLS_START):
        return Scan()
    return Scan(calls=read_calls(text, len(CALLS_START), NEXT_CALL))


def read_calls(text: str, pos: int, between: str) -> list[tuple[str, str, bool]]:
    """The calls written from ``pos`` on, each ``{"name": "NAME", "arguments": VALUE``, then
    ``between`` before the next one: ``(name, arguments text so far, complete)``."""
    calls = []
    while text.startswith(CALL_START, pos):
        end = _string_end(text, pos + len(CALL_START))
        if end is None or not text.startswith(ARGUMENTS_START, end + 1):
            break  # the name (or what follows it) is still being written
        name = json.loads(text[pos + len(CALL_START) - 1 : end + 1])
        start = end + 1 + len(ARGUMENTS_START)
        stop = _value_end(text, start)
        calls.append((name, text[start : stop or len(text)], stop is not None))
        if stop is None or not text.startswith(between, stop):
            break
        pos = stop + len(between)
    return calls


def parse(text: str, template: CallFormat | None = None) -> tuple[str | None, list[dict]]:
    """A whole answer: ``(content, tool_calls)`` in OpenAI's shape. An answer the grammar did
    not get to finish (``finish_reason: "length"``) is returned as text."""
    if template is None:
        try:
            json.loads(text)
        except ValueError:
            return text, []
    elif not template.complete(text):
        return text, []
    found = scan(text, template)
    calls = [
        {"id": call_id(), "type": "function", "function": {"name": name, "arguments": args}}
        for name, args, _ in found.calls
    ]
    if not calls:  # a text answer
        return (text if template is not None else found.content or ""), []
    return found.content or None, calls  # the template's format may have text before calls


def read_answer(text: str, plan: ToolPlan | None) -> tuple[str | None, list[dict]]:
    """A whole answer as ``(content, tool_calls)``: read in the plan's format (:func:`parse`),
    or all text where the request has no tools."""
    return parse(text, plan.template) if plan else (text, [])


@dataclass(frozen=True)
class Answer:
    """A finished choice as every API reads it: a thinking model's reasoning (None: there is
    none, :mod:`.reasoning`), its text and tool calls (OpenAI's shape,
    :func:`parse`), its finish reason as the whole answer's (``tool_calls`` where it calls
    tools; a call cut at its length is text, ``length``) and its token counts."""

    content: str | None
    calls: list[dict]
    finish_reason: str
    output_tokens: int  # the tokens the answer reports (:mod:`.shown`)
    prompt_tokens: int
    cached_tokens: int  # of the prompt's, found in the prefix cache
    reasoning: str | None = None


def read_choice(choice: Choice, plan: ToolPlan | None, thinking: Thinking | None = None) -> Answer:
    """A finished choice read in ``plan``'s format (all text where the request has no
    tools), after its reasoning with ``thinking``: whole answers and streams' last events
    alike."""
    result = choice.result
    reasoning, text = apart(thinking, result.text)
    content, calls = read_answer(text, plan)
    return Answer(
        content,
        calls,
        "tool_calls" if calls else result.finish_reason,
        choice.tokens,
        len(result.prompt_ids),
        result.stats.cached_tokens,
        reasoning,
    )


class ToolStream:
    """Turns an answer's text deltas into what OpenAI streams: content deltas (the decoded
    text of a ``response``) and tool call deltas (a call's id and name once its name is
    complete, then its arguments as they come)."""

    def __init__(self, template: CallFormat | None = None) -> None:
        self.template = template  # None: the generic format
        self.text, self.sent_content = "", 0
        self.sent: list[tuple[str, int]] = []  # per call begun: its id, argument chars sent

    def feed(self, delta: str) -> tuple[str, list[dict]]:
        """``(new content, new tool call deltas)`` after ``delta``."""
        self.text += delta
        found = scan(self.text, self.template)
        content = ""
        if found.content is not None:
            content = found.content[self.sent_content :]
            self.sent_content = len(found.content)
        deltas = []
        for index, (name, args, _) in enumerate(found.calls):
            if index == len(self.sent):  # a new call: its id and name first
                self.sent.append((call_id(), 0))
                ident, sent = self.sent[index]
                function = {"name": name, "arguments": args}
                deltas.append(
                    {"index": index, "id": ident, "type": "function", "function": function}
                )
            else:
                ident, sent = self.sent[index]
                if len(args) > sent:
                    deltas.append({"index": index, "function": {"arguments": args[sent:]}})
            self.sent[index] = (ident, len(args))
        return content, deltas


def stream_pieces(stream: ToolStream | None, delta: str) -> list[tuple[str, ...]]:
    """A text delta of the answer as what a streaming API sends, in order: ``("text",
    piece)``, ``("call", id, name)`` where a call begins, ``("arguments", piece)``; through
    ``stream`` where the request has tools (None: all text)."""
    if stream is None:
        return [("text", delta)] if delta else []
    content, calls = stream.feed(delta)
    pieces: list[tuple[str, ...]] = [("text", content)] if content else []
    for call in calls:
        function = call["function"]
        if "id" in call:
            pieces.append(("call", call["id"], function["name"]))
        if function["arguments"]:
            pieces.append(("arguments", function["arguments"]))
    return pieces


def _string_end(text: str, start: int) -> int | None:
    """The index of the quote that closes the JSON string whose characters begin at
    ``start``, or None when it is not closed yet."""
    i = start
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i
        i += 1
    return None


def _string_prefix(text: str, start: int) -> str:
    """The decoded characters of the JSON string that begins at ``start``, as far as they are
    complete (an escape cut short waits for the next delta)."""
    end = _string_end(text, start)
    body = text[start:end] if end is not None else text[start:]
    while body:
        try:
            return json.loads(f'"{body}"')
        except ValueError:
            body = body[:-1]  # an escape cut short
    return ""


def _value_end(text: str, start: int) -> int | None:
    """The index just after the JSON value that begins at ``start``, or None if it is not
    complete yet."""
    depth, i = 0, start
    while i < len(text):
        char = text[i]
        if char == '"':
            end = _string_end(text, i + 1)
            if end is None:
                return None
            i = end
        elif char in "{[":
            depth += 1
        elif char in "}]":
            if depth == 0:
                return i  # a scalar's end: the call's closing brace
            depth -= 1
            if depth == 0:
                return i + 1
        elif char == "," and depth == 0:
            return i
        i += 1
    return None
