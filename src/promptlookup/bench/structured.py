"""The suite's ``structured`` task: answers that must match a schema, generated at run time
from the Python standard library like the other tasks (:mod:`.suite`).

- *Extraction* (even rows): a function's source and a JSON schema of facts about it (its
  name, module, parameters, the exceptions it raises, a one-line summary), answered with
  ``response_format`` ``json_schema``.
- *Tool calls* (odd rows): a function's source and a request that one of three tools answers
  (rename a parameter, add a docstring, find a symbol's usages), with ``tools`` and
  ``tool_choice: "required"``, one call; the arguments come from the context.

A row carries its OpenAI request fields (``BenchRow.request``); :func:`constraint` turns them
into what promptlookup's methods take (the prompt's messages with the tools in the generic
format, and the grammar) and :func:`matches_schema` checks an answer against its schema.
"""

from __future__ import annotations

import ast
import json

import jsonschema

from ..grammar import Grammar
from ..server.tools import ToolPlan, prompt_messages

#: Strings are bounded so that every answer ends within the bench's token budget.
SHORT = {"type": "string", "maxLength": 80}
EXTRACTION = {
    "type": "object",
    "properties": {
        "function": SHORT,
        "module": SHORT,
        "parameters": {"type": "array", "items": SHORT, "maxItems": 8},
        "raises": {"type": "array", "items": SHORT, "maxItems": 4},
        "summary": {"type": "string", "maxLength": 200},
    },
    "required": ["function", "module", "parameters", "raises", "summary"],
    "additionalProperties": False,
}


def _tool(name: str, description: str, **properties) -> dict:
    parameters = {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TOOLS = [
    _tool(
        "rename_parameter",
        "Rename a parameter of a function everywhere in it.",
        module=SHORT,
        function=SHORT,
        old_name=SHORT,
        new_name=SHORT,
    ),
    _tool(
        "add_docstring",
        "Give a function a docstring.",
        module=SHORT,
        function=SHORT,
        docstring={"type": "string", "maxLength": 240},
    ),
    _tool("find_usages", "List where a symbol is used.", module=SHORT, symbol=SHORT),
]


def structured_prompt(module: str, name: str, function: ast.FunctionDef, code: str, index: int):
    """``(user message, request fields)`` for one function, or None if it does not fit."""
    fence = "```"
    context = (
        f"Here is `{name}` from Python's `{module}` module:\n\n{fence}python\n{code}{fence}\n\n"
    )
    if index % 2 == 0:
        ask = (
            "Extract the function's name, its module, its parameter names, the exceptions it "
            "raises and a one-sentence summary, as JSON."
        )
        response_format = {
            "type": "json_schema",
            "json_schema": {"name": "function_facts", "schema": EXTRACTION, "strict": True},
        }
        return context + ask, {"response_format": response_format}
    params = [a.arg for a in function.args.args if a.arg not in ("self", "cls")]
    if index % 4 == 1 and params:
        ask = f"Rename the parameter `{params[0]}` of `{name}` to `{params[0]}_value`."
    elif index % 4 == 3:
        ask = f"Find where `{name}` is used in the `{module}` module."
    else:
        ask = f"Add a docstring to `{name}` in the `{module}` module."
    tools = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
    return context + ask + " Use one of the tools.", tools


def _plan(request: dict) -> ToolPlan | None:
    if "tools" not in request:
        return None
    tools = [{**tool["function"]} for tool in request["tools"]]
    return ToolPlan(tools, request["tool_choice"], request["parallel_tool_calls"])


def constraint(messages: list[dict], request: dict | None) -> tuple[list[dict], Grammar | None]:
    """The messages to encode (with the tools' instructions) and the grammar of a row."""
    if not request:
        return messages, None
    plan = _plan(request)
    if plan is not None:
        return prompt_messages(messages, plan), plan.grammar()
    return messages, Grammar.of_response_format(request["response_format"])


def server_request(messages: list[dict], request: dict | None) -> tuple[list[dict], dict]:
    """What a server is sent for a row: its messages and request fields. Tools go as the
    generic format's prompt and JSON schema (``response_format``), so that every server does
    the same work under the same grammar: llama-server's chat parser ignores ``tools`` for a
    template without tools (the default model's), answering in free text."""
    plan = _plan(request or {})
    if plan is None:
        return messages, dict(request or {})
    schema = {"name": "tool_calls", "schema": plan.schema(), "strict": True}
    return prompt_messages(messages, plan), {
        "response_format": {"type": "json_schema", "json_schema": schema}
    }


def matches_schema(text: str, request: dict | None) -> bool | None:
    """Whether an answer matches its row's schema (None: the row has none): JSON valid
    against the ``response_format``'s schema, or against the generic tool format's (any
    whitespace, as a server may write it)."""
    if not request:
        return None
    plan = _plan(request)
    schema = plan.schema() if plan else request["response_format"]["json_schema"]["schema"]
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True
