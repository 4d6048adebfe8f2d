"""Anthropic's Messages API request, in its own shape (:class:`MessagesRequest`), and the same
request said as a chat completions body (:meth:`MessagesRequest.as_chat`: the system prompt,
tool results as tool messages, tool uses as an assistant's tool calls, ``tool_choice`` ``any``
as ``required``, ``output_format`` as ``response_format``), which :mod:`.anthropic` serves."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import ConfigDict, Field

from .request_base import Forbid
from .schemas import INT32_MAX, MAX_STOP_STRINGS, StopString
from .tool_schemas import NAME_PATTERN


class _Block(Forbid):
    cache_control: dict[str, Any] | None = None  # accepted, ignored (no prompt caching)


class TextBlock(_Block):
    type: Literal["text"]
    text: str
    citations: list[dict[str, Any]] | None = None  # accepted, ignored


class ThinkingBlock(_Block):
    """An earlier turn's reasoning (Anthropic's models' answers carry it): accepted and left
    out of the prompt, as Anthropic's API leaves it out of earlier turns' context."""

    type: Literal["thinking", "redacted_thinking"]
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None


Block = Annotated[
    Union[TextBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock], Field(discriminator="type")
]


def _text(content) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(block.text for block in content if block.type == "text")


class Message(Forbid):
    role: Literal["user", "assistant"]
    content: str | list[Block]

    def as_chat(self) -> list[dict]:
        """The message as chat completions messages (a user's tool results come first)."""
        if isinstance(self.content, str):
            return [{"role": self.role, "content": self.content}]
        blocks = self.content
        out = [
            {"role": "tool", "tool_call_id": b.tool_use_id, "content": _text(b.content)}
            for b in blocks
            if b.type == "tool_result"
        ]
        text = _text([b for b in blocks if b.type == "text"])
        calls = [
            {
                "id": b.id,
                "type": "function",
                "function": {"name": b.name, "arguments": json.dumps(b.input)},
            }
            for b in blocks
            if b.type == "tool_use"
        ]
        if calls:
            out.append({"role": "assistant", "content": text or None, "tool_calls": calls})
        elif text or not out:
            out.append({"role": self.role, "content": text})
        return out


class AnthropicTool(Forbid):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None  # accepted: the grammar always enforces the input schema


class AnthropicToolChoice(Forbid):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class OutputFormat(Forbid):
    """Anthropic's structured output: the answer is JSON valid against ``schema``."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Forbid):
    """``output_config``: its ``format`` is served; other settings (``effort``) are ignored."""

    model_config = ConfigDict(extra="ignore", strict=True)

    format: OutputFormat | None = None


class MessagesRequest(Forbid):
    """The request; fields it does not list are ignored (Anthropic's clients send many a local
    model has no use for: ``thinking``, ``service_tier``, ...), its blocks' are a 400."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    max_tokens: int = Field(ge=1, le=INT32_MAX)
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    stop_sequences: Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stream: bool | None = False
    temperature: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=0, le=INT32_MAX)
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    metadata: dict[str, Any] | None = None
    output_format: OutputFormat | None = None  # the beta's name for output_config.format
    output_config: OutputConfig | None = None

    def cross_check(self) -> None:
        """Rules between fields: checked on the request's chat form."""

    def as_chat(self) -> dict:
        """The same request as a chat completions body."""
        messages = [{"role": "system", "content": _text(self.system)}] if self.system else []
        for message in self.messages:
            messages.extend(message.as_chat())
        body = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens}
        body["stream"] = bool(self.stream)
        for name in ("temperature", "top_p", "top_k"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if self.stop_sequences:
            body["stop"] = self.stop_sequences
        if self.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description or "",
                        "parameters": tool.input_schema,
                    },
                }
                for tool in self.tools
            ]
        choice = self.tool_choice
        if choice is not None:
            named = {"type": "function", "function": {"name": choice.name or ""}}
            body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(
                choice.type, named
            )
            if choice.disable_parallel_tool_use:
                body["parallel_tool_calls"] = False
        form = self.output_format or (self.output_config and self.output_config.format)
        if form is not None:
            schema = {"name": "output", "schema": form.schema_}
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
        return body
