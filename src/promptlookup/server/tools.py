"""Tool calls in the generic format: how the tools reach the prompt and the JSON schema the
output must match (enforced by the grammar, :mod:`promptlookup.grammar`); the output is read
back into tool calls, whole or as it streams, by :mod:`.reading`. A chat template with a call
format of its own goes through :mod:`.tool_template` instead (a :class:`CallFormat`).

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


@dataclass
class Scan:
    """What an answer's text says so far: its text (decoded; None when it has none, or has not
    said yet; a template's format may have text before calls) and its calls, ``(name,
    arguments text so far, complete)``."""

    content: str | None = None
    calls: list[tuple[str, str, bool]] = field(default_factory=list)


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
    #: The names of the tools the answer may call (OpenAI's ``allowed_tools``); None: all.
    #: The prompt lists every tool either way.
    allowed: tuple[str, ...] | None = None

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
        """The tools the answer may call: all (or those ``allowed``), or the one ``choice``
        names."""
        names = [self.choice] if self.choice not in ("auto", "required") else self.allowed
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
