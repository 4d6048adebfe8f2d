"""Tool calls in the generic format: how the tools reach the prompt, the JSON schema the output
must match (enforced by the grammar, :mod:`promptlookup.grammar`), and how the output is read
back into tool calls, whole or as it streams. A chat template with a call format of its own
goes through :mod:`.tool_template` instead (a :class:`CallFormat`, with this module's reader).

The format (after llama.cpp's server for chat templates without tools) is one JSON object:

- ``{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}`` to call tools
  (one call unless ``parallel_tool_calls``), each call's arguments valid against its tool's
  ``parameters`` schema;
- ``{"response": "..."}`` to answer in text, where ``tool_choice`` is ``"auto"``; or, with a
  ``response_format`` beside the tools, ``{"answer": VALUE}``, the value valid against the
  format's schema and returned as the answer's content (its JSON text).

The tools and these instructions go into the system message; an assistant message's earlier
``tool_calls`` are written back in the same JSON, and a tool's result is a user message
``{"tool_response": {"name", "tool_call_id", "content"}}``. Both front ends (OpenAI's chat
completions, Anthropic's messages) hand this module the same plain shapes: a tool is
``{"name", "description", "parameters"}``, a message ``{"role", "content", "tool_calls":
[{"id", "name", "arguments"}], "tool_call_id"}``, the choice ``"none"``, ``"auto"``,
``"required"`` or a tool's name.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Protocol

from ..errors import GrammarError
from ..grammar import JSON_LAYOUT, Grammar, prepared_schema
from ..json_schemas import embedded

CALLS_START = '{"tool_calls": ['
RESPONSE_START = '{"response": "'
ANSWER_START = '{"answer": '
CALL_START = '{"name": "'
ARGUMENTS_START = ', "arguments": '
NEXT_CALL = "}, "
#: The parameters of a tool that has none: an empty object only (OpenAI: "omitting
#: parameters defines a function with an empty parameter list").
NO_PARAMETERS = {"type": "object", "properties": {}}


def dumps(value) -> str:
    """JSON as the grammar lays it out (:data:`~promptlookup.grammar.JSON_LAYOUT`)."""
    separators = (JSON_LAYOUT["item_separator"], JSON_LAYOUT["key_separator"])
    return json.dumps(value, ensure_ascii=False, separators=separators)


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class CallFormat(Protocol):
    """A chat template's own format of calls, used instead of the generic one
    (:class:`.tool_template.TemplateFormat`)."""

    def grammar(self, plan: ToolPlan) -> Grammar: ...

    def scan(self, text: str) -> Scan: ...

    def complete(self, text: str) -> bool: ...


@dataclass(frozen=True)
class ToolPlan:
    """How one request may call ``tools`` (``choice``: ``"auto"``, ``"required"`` or a tool's
    name; ``"none"`` leaves the request without a plan)."""

    tools: list[dict]
    choice: str = "auto"
    parallel: bool = True
    #: The chat template's own format (:mod:`.tool_template`); None: the generic format.
    template: CallFormat | None = None
    #: Under ``"auto"``, the JSON schema an answer without calls matches (the request's
    #: ``response_format``); None: text.
    answer: dict | None = None

    def instructions(self) -> str:
        calls = dumps({"tool_calls": [{"name": "<tool name>", "arguments": {"<arg>": "..."}}]})
        text = f"You can call tools. To call tools, answer with JSON only: {calls}."
        if self.choice == "auto" and self.answer is None:
            text += f" To answer without calling a tool, answer {dumps({'response': '...'})}."
        elif self.choice == "auto":
            text += (
                ' To answer without calling a tool, answer {"answer": ...} with a value valid '
                f"against this JSON schema: {dumps(self.answer)}."
            )
        elif self.choice != "required":
            text += f" Call the tool {self.choice}."
        listed = "\n".join(dumps(tool) for tool in self.tools)
        return f"{text}\nThe tools:\n{listed}"

    def call_schemas(self) -> tuple[list[dict], dict]:
        """The JSON schemas of one call, ``{"name", "arguments"}``, per tool it may call, and
        the ``$defs`` they refer to: each tool's ``parameters`` under ``tool-NAME``, its own
        references rebased there (:func:`~promptlookup.json_schemas.embedded`)."""
        tools = self.callable()
        refs, defs = embedded({f"tool-{tool['name']}": _parameters(tool) for tool in tools})
        calls = [
            _object(name={"const": tool["name"]}, arguments=refs[f"tool-{tool['name']}"])
            for tool in tools
        ]
        return calls, defs

    def callable(self) -> list[dict]:
        """The tools the answer may call: all, or the one ``choice`` names."""
        names = [self.choice] if self.choice not in ("auto", "required") else None
        return [tool for tool in self.tools if names is None or tool["name"] in names]

    def schema(self) -> dict:
        """The JSON schema of the answer in the generic format (see the module doc)."""
        calls, defs = self.call_schemas()
        array = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
        if not self.parallel:
            array["maxItems"] = 1
        answer = _object(tool_calls=array)
        if self.choice == "auto" and self.answer is not None:
            refs, answer_defs = embedded({"answer": prepared_schema(self.answer)})
            schema = {"anyOf": [answer, _object(answer=refs["answer"])]}
            defs.update(answer_defs)
        elif self.choice == "auto":
            schema = {"anyOf": [answer, _object(response={"type": "string"})]}
        else:
            schema = answer
        return {**schema, "$defs": defs}

    def grammar(self) -> Grammar:
        """The answer's grammar; a :class:`GrammarError` that names the tool whose parameters
        the engine cannot compile (each compiled alone, only once the whole has failed)."""
        try:
            if self.template is not None:
                return self.template.grammar(self)
            return Grammar.json_schema(self.schema())
        except GrammarError as exc:
            for tool in self.callable():
                parameters = _parameters(tool)  # its own error names it already
                try:
                    Grammar.json_schema(parameters)
                except GrammarError as own:
                    raise GrammarError(f"tool {tool['name']!r}: {own}") from None
            raise exc from None


def _parameters(tool: dict):
    """A tool's parameters as its calls' grammar takes them (:func:`prepared_schema`): a
    schema no finite value matches is an error naming the tool, even where the model could
    avoid it by calling another."""
    try:
        return prepared_schema(tool.get("parameters") or NO_PARAMETERS)
    except GrammarError as exc:
        raise GrammarError(f"tool {tool['name']!r}: {exc}") from None


def tool_texts(tools: list[dict]) -> list[str]:
    """Each tool's text as the prompt lists it (name, description and parameters, JSON): what
    a request's tools add to its prompt, bounded before anything is tokenized."""
    return [dumps(tool) for tool in tools]


def _object(**properties) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def prompt_messages(messages: list[dict], plan: ToolPlan | None) -> list[dict]:
    """The chat template's messages (``{"role", "content"}``): earlier tool calls and results
    written in the generic format, and the plan's instructions in the system message."""
    names = {
        call["id"]: call["name"] for m in messages for call in m.get("tool_calls") or () if call
    }
    out = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if message.get("tool_calls"):
            calls = [
                {"name": call["name"], "arguments": loads_arguments(call["arguments"])}
                for call in message["tool_calls"]
            ]
            content = dumps({"tool_calls": calls})
        elif role == "tool":
            role, ident = "user", message.get("tool_call_id")
            result = {"name": names.get(ident), "tool_call_id": ident, "content": content}
            content = dumps({"tool_response": result})
        elif role == "assistant" and plan is not None and plan.choice == "auto":
            content = _reply(content, plan.answer is not None)
        out.append({"role": role, "content": content})
    if plan is not None:
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{plan.instructions()}"}
        else:
            out.insert(0, {"role": "system", "content": plan.instructions()})
    return out


def _reply(content: str, structured: bool) -> str:
    """An earlier text answer as the generic format writes it: ``{"answer": VALUE}`` where
    the answer is JSON and a format is asked for, else ``{"response": "..."}``; an answer
    that is already in the format (one cut at its length comes back as its raw text) as it
    is, so that it reads as the model wrote it."""
    if content.startswith((RESPONSE_START, ANSWER_START, CALLS_START)):
        return content
    if structured:
        try:
            return dumps({"answer": json.loads(content)})
        except ValueError:
            pass
    return dumps({"response": content})


def loads_arguments(arguments: str):
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments  # written back as the client sent it


@dataclass
class Scan:
    """What an answer's text says so far: its text (decoded; None when it has none, or has not
    said yet; a template's format may have text before calls) and its calls, ``(name,
    arguments text so far, complete)``."""

    content: str | None = None
    calls: list[tuple[str, str, bool]] = field(default_factory=list)


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

    def finish_reason(self, reason: str) -> str:
        """The stream's finish reason, as the whole answer's (:func:`parse`): ``tool_calls``
        where the answer is complete calls, else ``reason`` (a call cut at ``max_tokens``
        was streamed in part, and ends with ``length``)."""
        return "tool_calls" if parse(self.text, self.template)[1] else reason


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
