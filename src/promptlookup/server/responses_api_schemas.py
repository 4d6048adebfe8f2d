"""OpenAI's Responses API request (``POST /v1/responses``), in its own shape
(:class:`ResponsesRequest`), and the same request said as a chat completions body
(:meth:`ResponsesRequest.as_chat`: ``instructions`` as the system message, input items as
messages, ``function_call`` items as an assistant's tool calls, ``function_call_output`` items
as tool messages, ``text.format`` as ``response_format``), which :mod:`.responses_api` serves.

Nothing is stored: ``previous_response_id`` is a 400 (send the whole conversation as
``input``), ``store`` is accepted and ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import ConfigDict, Discriminator, Field, Tag, model_validator

from .request_base import Forbid
from .schemas import INT32_MAX
from .tool_schemas import FunctionDef


class InputText(Forbid):
    type: Literal["input_text", "output_text", "text"]
    text: str
    annotations: list[Any] | None = None  # an earlier answer's, accepted and ignored


class MessageItem(Forbid):
    """A message: ``{"role", "content"}``, with ``"type": "message"`` or without."""

    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionCallItem(Forbid):
    """An earlier answer's call of a tool."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(Forbid):
    """What a call returned."""

    type: Literal["function_call_output"]
    call_id: str
    output: str
    id: str | None = None
    status: str | None = None


class ReasoningItem(Forbid):
    """An earlier answer's reasoning: accepted and left out of the prompt."""

    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["reasoning"]


def _kind(item: Any) -> str:
    """An input item's type (a message may leave it out)."""
    return (item.get("type") or "message") if isinstance(item, dict) else "message"


InputItem = Annotated[
    Union[
        Annotated[MessageItem, Tag("message")],
        Annotated[FunctionCallItem, Tag("function_call")],
        Annotated[FunctionCallOutputItem, Tag("function_call_output")],
        Annotated[ReasoningItem, Tag("reasoning")],
    ],
    Discriminator(_kind),
]


class FunctionTool(FunctionDef):
    """A tool, flat (``{"type": "function", "name", "parameters"}``, not under ``function``)."""

    type: Literal["function"]


class NamedFunction(Forbid):
    type: Literal["function"]
    name: str


class TextFormat(Forbid):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextOptions(Forbid):
    model_config = ConfigDict(extra="ignore", strict=True)  # verbosity and the like

    format: TextFormat | None = None


class ResponsesRequest(Forbid):
    """The request; top-level fields it does not list are ignored (``store``, ``reasoning``,
    ``metadata``, ``include``, ...), as clients send many."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    temperature: float | None = Field(None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    stream: bool | None = False
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    previous_response_id: str | None = None

    @model_validator(mode="after")
    def _stateless(self):
        if self.previous_response_id is not None:
            raise ValueError(
                "previous_response_id: this server stores no responses; send the whole "
                "conversation as input"
            )
        return self

    def cross_check(self) -> None:
        """Rules between fields: checked on the request's chat form."""

    def as_chat(self) -> dict:
        """The same request as a chat completions body."""
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        items = (
            [MessageItem(role="user", content=self.input)]
            if isinstance(self.input, str)
            else self.input
        )
        for item in items:
            if isinstance(item, MessageItem):
                messages.append({"role": item.role, "content": item.text()})
            elif isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
                last = messages[-1] if messages else None
                if last and last["role"] == "assistant" and last.get("tool_calls") is not None:
                    last["tool_calls"].append(call)  # parallel calls: one assistant message
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif isinstance(item, FunctionCallOutputItem):
                messages.append(
                    {"role": "tool", "tool_call_id": item.call_id, "content": item.output}
                )
        body: dict = {"model": self.model, "messages": messages, "stream": bool(self.stream)}
        if self.max_output_tokens is not None:
            body["max_tokens"] = self.max_output_tokens
        for name in ("temperature", "top_p", "parallel_tool_calls"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if self.tools:
            body["tools"] = [
                {"type": "function", "function": {
                    "name": tool.name, "description": tool.description or "",
                    "parameters": tool.parameters or {"type": "object"}}}
                for tool in self.tools
            ]  # fmt: skip
        choice = self.tool_choice
        if choice is not None:
            named = isinstance(choice, NamedFunction)
            body["tool_choice"] = (
                {"type": "function", "function": {"name": choice.name}} if named else choice
            )
        form = self.text.format if self.text is not None else None
        if form is not None and form.type == "json_schema":
            schema = {"name": form.name or "output", "schema": form.schema_}
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
        elif form is not None:
            body["response_format"] = {"type": form.type}
        return body
