"""Anthropic's response bodies, as pydantic models: the message (:mod:`.serving` builds it whole,
and sends it empty in a stream's ``message_start``), the token count and Anthropic's error
JSON; what ``GET /openapi.json`` documents for ``/v1/messages`` (one set of models for both,
written with :func:`..bodies.dump`, as OpenAI's are)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..bodies import READ, Body, documented

#: Why a message ended: the model's own end, ``max_tokens``, or calls to make.
StopReason = Literal["end_turn", "max_tokens", "tool_use"]


class OutputTextBlock(Body):
    type: Literal["text"]
    text: str


class OutputThinkingBlock(Body):
    """A thinking model's reasoning (:mod:`..reasoning`); nothing is signed here, so its
    ``signature`` is empty."""

    type: Literal["thinking"]
    thinking: str
    signature: str


class OutputToolUseBlock(Body):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict  # the arguments, valid against the tool's input_schema


ContentBlock = Annotated[
    OutputThinkingBlock | OutputTextBlock | OutputToolUseBlock, Field(discriminator="type")
]


class MessageUsage(Body):
    """The prompt's tokens the prefix cache held (``cache_read_input_tokens``), the others
    (``input_tokens``: their sum is the prompt) and the answer's."""

    input_tokens: int
    cache_read_input_tokens: int
    output_tokens: int


class AnthropicMessage(Body):
    """``POST /v1/messages``' answer (in a stream, ``message_start``'s ``message``: no
    content and no stop reason yet)."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[ContentBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: MessageUsage


class MessageTokenCount(Body):
    """``POST /v1/messages/count_tokens``' answer."""

    input_tokens: int


class AnthropicErrorDetail(Body):
    type: str  # invalid_request_error, overloaded_error, ... (.serving.ERROR_TYPES)
    message: str


class AnthropicError(Body):
    """Anthropic's error JSON, for every error of ``/v1/messages``."""

    type: Literal["error"]
    error: AnthropicErrorDetail


#: Every response body of Anthropic's API, for the OpenAPI document.
RESPONSE_MODELS = (AnthropicMessage, MessageTokenCount, AnthropicError)

#: What ``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` answer.
MESSAGE_ANSWERS = documented(
    AnthropicMessage,
    AnthropicError,
    events="Anthropic's events: message_start (the message, empty), per content block "
    "content_block_start, content_block_delta (text_delta, input_json_delta, or a thinking "
    "block's thinking_delta then signature_delta) and "
    "content_block_stop, then message_delta (the stop reason and usage) and message_stop; "
    "ping while idle",
)
COUNT_ANSWERS = documented(MessageTokenCount, AnthropicError, READ)
