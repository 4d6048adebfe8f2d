"""The request fields of structured output and tool calls (OpenAI's shapes), validated at the
edge like the rest of :mod:`.openai.protocol`: ``response_format``, ``tools``, ``tool_choice`` and an
assistant message's ``tool_calls``."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag

from .ignored import LeftOut
from .request_base import Forbid, LeftOutTool
from .tools import NO_PARAMETERS

#: A function's name, as OpenAI allows it.
NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
CHOICES = ("none", "auto", "required")


class FunctionDef(Forbid):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # accepted: the grammar always enforces the parameters


class Tool(Forbid):
    type: Literal["function"]
    function: FunctionDef

    def plain(self) -> dict:
        """The tool as :mod:`.tools` takes it."""
        tool = {"name": self.function.name, "description": self.function.description or ""}
        return {**tool, "parameters": self.function.parameters or NO_PARAMETERS}


class OtherTool(LeftOutTool):
    """A tool of a type this server does not run (OpenAI's ``custom`` freeform tools, hosted
    tools): left out of the prompt, said in ``x-promptlookup-ignored-tools``."""

    served = ("function",)


def _tool_type(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "Function" if kind == "function" or not isinstance(kind, str) else "Other"


#: A ``tools`` entry of chat completions: a function, or another type, left out.
ChatTool = Annotated[
    Union[Annotated[Tool, Tag("Function")], Annotated[OtherTool, Tag("Other")]],
    Discriminator(_tool_type),
]


def function_tools(tools) -> list:
    """The tools of a list that the server serves (those not :class:`LeftOut`)."""
    return [tool for tool in tools or () if not isinstance(tool, LeftOut)]


class CalledFunction(Forbid):
    name: str
    arguments: str


class ToolCall(Forbid):
    """An earlier call, in an assistant message of the history."""

    id: str
    type: Literal["function"]
    function: CalledFunction

    def plain(self) -> dict:
        return {"id": self.id, "name": self.function.name, "arguments": self.function.arguments}


class OtherToolCall(LeftOutTool):
    """An earlier call of a tool of another type (OpenAI's ``custom`` tools, ``{"id",
    "type": "custom", "custom": {"name", "input"}}``): left out of the prompt with its result,
    as the tool is, and said in ``x-promptlookup-ignored-fields``."""

    kind = "fields"
    served = ("function",)
    id: str | None = None


#: An assistant message's ``tool_calls`` entry: a function's call, or another type's, left out.
ChatToolCall = Annotated[
    Union[Annotated[ToolCall, Tag("Function")], Annotated[OtherToolCall, Tag("Other")]],
    Discriminator(_tool_type),
]


class NamedFunction(Forbid):
    name: str


class NamedToolChoice(Forbid):
    type: Literal["function"]
    function: NamedFunction


def allowed_names(tools: list[dict[str, Any]]) -> list[str]:
    """The function tools an ``allowed_tools`` list names, in chat's shape (``{"type":
    "function", "function": {"name"}}``) or the Responses API's (``{"type": "function",
    "name"}``); entries of other types name tools this server does not run (left out)."""
    entries = [tool for tool in tools if tool.get("type") == "function"]
    return [(tool.get("function") or tool).get("name") for tool in entries]


class AllowedTools(Forbid):
    """OpenAI's ``allowed_tools``: the answer may call (``auto``) or must call (``required``)
    only these of the request's tools; the prompt lists them all (so that it stays the same
    from turn to turn), the grammar only these."""

    mode: Literal["auto", "required"]
    tools: list[dict[str, Any]]

    def names(self) -> list[str]:
        return allowed_names(self.tools)


class AllowedToolsChoice(Forbid):
    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


ToolChoice = Union[Literal["none", "auto", "required"], NamedToolChoice, AllowedToolsChoice]


def check_tool_choice(value):
    """A before-validator: one clear line for any other shape."""
    if value is None or value in CHOICES:
        return value
    if isinstance(value, dict) and value.get("type") == "allowed_tools":
        allowed = value.get("allowed_tools")
        tools = allowed.get("tools") if isinstance(allowed, dict) else None
        if isinstance(tools, list) and all(_names_a_tool(tool) for tool in tools):
            return value
        raise ValueError(
            "allowed_tools must be {'mode': 'auto' or 'required', 'tools': [{'type': "
            "'function', 'function': {'name': ...}}, ...]}"
        )
    function = value.get("function") if isinstance(value, dict) else None
    if (
        isinstance(value, dict)
        and value.get("type") == "function"
        and isinstance(function, dict)
        and isinstance(function.get("name"), str)
    ):
        return value
    raise ValueError(
        "must be 'none', 'auto', 'required', {'type': 'function', 'function': {'name': ...}} "
        "or {'type': 'allowed_tools', 'allowed_tools': {...}}"
    )


def _names_a_tool(entry) -> bool:
    """Whether an ``allowed_tools`` entry is a tool of some type (a function with its name)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
        return False
    return entry["type"] != "function" or all(isinstance(n, str) for n in allowed_names([entry]))


class JSONSchemaFormat(Forbid):
    name: str | None = Field(None, pattern=NAME_PATTERN)  # OpenAI requires it; a label only
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # accepted: the grammar always enforces the schema


class ResponseFormat(Forbid):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None
    #: llama-server's ``{"type": "json_object", "schema": {...}}``: an object in that schema.
    schema_: dict[str, Any] | None = Field(None, alias="schema")

    def plain(self) -> dict:
        """OpenAI's shape, as :meth:`promptlookup.grammar.Grammar.of_response_format` reads it."""
        if self.type == "json_schema" and self.json_schema is not None:
            return {"type": self.type, "json_schema": {"schema": self.json_schema.schema_}}
        if self.schema_ is not None:  # json_object's (tools_problem refuses it elsewhere)
            return {"type": self.type, "schema": self.schema_}
        return {"type": self.type}

    def schema(self) -> dict | None:
        """The JSON schema of an answer in this format (None: text)."""
        if self.type == "json_schema" and self.json_schema is not None:
            return self.json_schema.schema_
        if self.type == "json_object":
            return self.schema_ if self.schema_ is not None else {"type": "object"}
        return None


def tools_problem(
    tools: list[Tool] | None, choice: ToolChoice | None, response_format: ResponseFormat | None
) -> tuple[str, str] | None:
    """What is wrong between these fields, as ``(parameter, message)``; None: nothing."""
    names = [tool.function.name for tool in tools or ()]
    if choice not in (None, "none") and not names:
        return "tool_choice", "there are no tools to choose"
    if isinstance(choice, AllowedToolsChoice):  # each function it names is a tool
        wanted = choice.allowed_tools.names()
        missing = [name for name in wanted if name not in names]
        if missing:
            listed = ", ".join(names)
            return (
                "tool_choice",
                f"allowed_tools: no tool is named {missing[0]!r} (the tools: {listed})",
            )
        if not wanted and choice.allowed_tools.mode == "required":
            return "tool_choice", "allowed_tools: mode 'required' lists no function tool to call"
    elif choice is not None and not isinstance(choice, str) and choice.function.name not in names:
        listed = ", ".join(names)
        return "tool_choice", f"no tool is named {choice.function.name!r} (the tools: {listed})"
    if len(set(names)) < len(names):
        return "tools", "two tools have the same name"
    if response_format is not None and response_format.type == "json_schema":
        if response_format.json_schema is None:
            return "response_format", "type json_schema needs a json_schema object"
    if response_format is not None and response_format.schema_ is not None:
        if response_format.type != "json_object":
            return "response_format", "schema goes with type json_object (or in json_schema)"
    return None
