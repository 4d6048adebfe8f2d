"""Anthropic's Messages API request, in its own shape (:class:`MessagesRequest`), and the same
request said as a chat completions body (:meth:`MessagesRequest.as_chat`: the system prompt,
with the ``system`` messages of ``messages`` folded into it in order, tool results as tool
messages, tool uses as an assistant's tool calls, ``tool_choice`` ``any`` as ``required``,
``output_format`` as ``response_format``), which :mod:`.anthropic.serving` serves.

Unknown fields follow :mod:`.ignored`'s rule. Tools with a ``type`` (Anthropic's server tools,
``web_search_20250305``, ``code_execution_*``, ``tool_search_tool_*``, ...; and its
client tools whose schema only Anthropic's models know, ``bash_*``, ``text_editor_*``,
``computer_*``, ``memory_*``) are left out of the prompt; earlier server-tool blocks
(``server_tool_use``, ``*_tool_result``, ...) likewise. ``cache_control`` is accepted wherever
Anthropic takes it, without effect (the prefix cache is automatic)."""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import Discriminator, Field, Tag

from ..ignored import LeftOut
from ..openai.protocol import INT32_MAX, MAX_STOP_STRINGS, StopString
from ..request_base import LeftOutTool, RequestModel
from ..tool_schemas import NAME_PATTERN


class _Block(RequestModel):
    cache_control: Any = None  # accepted, no effect: the prefix cache is automatic


class TextBlock(_Block):
    type: Literal["text"]
    text: str
    citations: list[dict[str, Any]] | None = None  # accepted, ignored


class ThinkingBlock(_Block):
    """An earlier turn's reasoning: a ``thinking`` block's text goes back into a thinking
    model's prompt as its message's ``reasoning_content`` (:mod:`..reasoning`; the
    ``signature`` is not checked), otherwise it is left out, as is a ``redacted_thinking``
    block (its ``data`` is Anthropic's, opaque)."""

    type: Literal["thinking", "redacted_thinking"]
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    caller: Any = None  # programmatic tool calling's, accepted without effect


#: Blocks of server tools' earlier turns and tool search's references: left out.
SERVER_BLOCKS = (
    "server_tool_use",
    "web_search_tool_result",
    "web_fetch_tool_result",
    "code_execution_tool_result",
    "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result",
    "tool_search_tool_result",
    "mcp_tool_use",
    "mcp_tool_result",
    "container_upload",
    "tool_reference",
)


class ServerBlock(RequestModel, LeftOut):
    """An earlier turn's server-tool block (see :data:`SERVER_BLOCKS`): left out."""

    type: Literal[SERVER_BLOCKS]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: (
        str | list[Annotated[Union[TextBlock, ServerBlock], Field(discriminator="type")]] | None
    ) = None
    is_error: bool | None = None


Block = Annotated[
    Union[TextBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock, ServerBlock],
    Field(discriminator="type"),
]


def _text(content) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(block.text for block in content if block.type == "text")


#: How Claude Code's first system block begins: a billing line whose values (``cc_version``'s
#: suffix, ``cch=``) change between requests. Left out of the prompt, as vLLM and SGLang do:
#: at the prompt's start it would make every request's prompt new to the prefix cache.
BILLING_HEADER = "x-anthropic-billing-header:"


def _system_text(system) -> str:
    """The system prompt's text without Claude Code's billing line (a block that starts with
    :data:`BILLING_HEADER`, or such a first line of a string)."""
    if isinstance(system, str):
        first, newline, rest = system.partition("\n")
        return rest if first.startswith(BILLING_HEADER) else system
    return _text([block for block in system if not block.text.startswith(BILLING_HEADER)])


class Message(RequestModel):
    #: ``system``: Claude Code's mid-conversation system text (folded into the system prompt).
    role: Literal["user", "assistant", "system"]
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
        thought = "".join(b.thinking or "" for b in blocks if b.type == "thinking")
        if thought and self.role == "assistant":
            out[-1]["reasoning_content"] = thought
        return out


class AnthropicTool(RequestModel):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: Any = None
    strict: bool | None = None  # accepted: the grammar always enforces the input schema
    # Accepted without effect: every tool is in the prompt (no tool search here), called
    # by the model (no code execution), its input not streamed early.
    defer_loading: bool | None = None
    allowed_callers: Any = None
    input_examples: Any = None
    eager_input_streaming: Any = None


class TypedTool(LeftOutTool):
    """A tool with a ``type`` of Anthropic's (see the module doc): left out of the prompt."""

    served = ("custom",)


def _tool_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "Custom" if kind in (None, "custom") or not isinstance(kind, str) else "Typed"


Tool = Annotated[
    Union[Annotated[AnthropicTool, Tag("Custom")], Annotated[TypedTool, Tag("Typed")]],
    Discriminator(_tool_kind),
]


class AnthropicToolChoice(RequestModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class OutputFormat(RequestModel):
    """Anthropic's structured output: the answer is JSON valid against ``schema``."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(RequestModel):
    """``output_config``: its ``format`` is served; ``effort`` accepted without effect."""

    format: OutputFormat | None = None
    effort: Any = None


class MessagesRequest(RequestModel):
    """The request (see the module doc)."""

    #: The chat form's fields that have other names here (see ResponsesRequest's).
    chat_names: ClassVar[dict[str, str]] = {
        "response_format": "output_config.format",
        "stop": "stop_sequences",
    }
    model: str
    max_tokens: int = Field(ge=1, le=INT32_MAX)
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    stop_sequences: Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stream: bool | None = False
    temperature: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=0, le=INT32_MAX)
    tools: list[Tool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    output_format: OutputFormat | None = None  # the beta's name for output_config.format
    output_config: OutputConfig | None = None
    # Accepted without effect: nothing here thinks apart, edits the context, or has tiers,
    # containers or MCP servers; the prefix cache is automatic.
    metadata: Any = None
    thinking: Any = None
    context_management: Any = None
    service_tier: Any = None
    container: Any = None
    mcp_servers: Any = None
    inference_geo: Any = None
    cache_control: Any = None

    def cross_check(self) -> None:
        """Rules between fields: checked on the request's chat form."""

    def as_chat(self) -> dict:
        """The same request as a chat completions body."""
        # The system prompt without Claude Code's billing line (_system_text), then the
        # system messages of ``messages``, in order, after it.
        system = [_system_text(self.system)] if self.system else []
        system += [_text(m.content) for m in self.messages if m.role == "system"]
        system = [text for text in system if text]
        messages = [{"role": "system", "content": "\n\n".join(system)}] if system else []
        for message in self.messages:
            if message.role != "system":
                messages.extend(message.as_chat())
        body = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens}
        body["stream"] = bool(self.stream)
        for name in ("temperature", "top_p", "top_k"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if self.stop_sequences:
            body["stop"] = self.stop_sequences
        tools = [tool for tool in self.tools or () if isinstance(tool, AnthropicTool)]
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description or "",
                        "parameters": tool.input_schema,
                    },
                }
                for tool in tools
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
