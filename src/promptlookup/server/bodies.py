"""The response bodies, as pydantic models: what the server returns (built by :mod:`.openai.answers`,
:mod:`.app` and :class:`~.request_base.APIError`) and what ``GET /openapi.json`` documents
(:mod:`.openapi`). One set of models for both, so that the schema cannot drift from the
answers.

Bodies are written with :func:`dump`: every field given when a model is built is in the JSON,
``null`` included (OpenAI's shapes carry ``"logprobs": null`` and the like), and a field left at
its default is left out (a stream's ``usage`` is in its last chunk only). Models allow more
fields than they list, as OpenAI's clients do.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


def dump(body: BaseModel) -> dict:
    """The JSON object of a body: the fields it was built with."""
    return body.model_dump(exclude_unset=True)


class ErrorDetail(_Open):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(_Open):
    error: ErrorDetail


class ModelCard(_Open):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(_Open):
    object: Literal["list"]
    data: list[ModelCard]


class HealthQueue(_Open):
    """The queue's configuration (how many run and wait now: ``GET /metrics``)."""

    capacity: int
    max_batch: int | None


class HealthPrefixCache(_Open):
    """The prefix cache's budget (what it holds now, per tenant: ``GET /metrics``)."""

    budget_mib: float


class Health(_Open):
    status: str
    model: str
    queue: HealthQueue | None = None  # once the model is ready
    prefix_cache: HealthPrefixCache | None = None  # when the server has one
    error: str | None = None  # why loading failed


class TopLogprob(_Open):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Open):
    content: list[TokenLogprobEntry] | None
    refusal: str | None


class CompletionLogprobs(_Open):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class Speculative(_Open):
    """Extension: the speculative decoding statistics of the request."""

    forward_passes: int
    drafted_tokens: int
    accepted_tokens: int
    tokens_per_forward: float
    acceptance_rate: float
    seconds: float


class CompletionTokensDetails(_Open):
    accepted_prediction_tokens: int
    rejected_prediction_tokens: int
    reasoning_tokens: int
    audio_tokens: int


class PromptTokensDetails(_Open):
    cached_tokens: int  # prompt tokens whose keys and values came from the prefix cache


class Usage(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails | None
    speculative: Speculative


class CalledFunction(_Open):
    name: str
    arguments: str  # JSON text, valid against the tool's parameters


class ToolCall(_Open):
    id: str
    type: Literal["function"]
    function: CalledFunction


class AssistantMessage(_Open):
    role: Literal["assistant"]
    content: str | None  # None when the answer calls tools
    refusal: str | None
    tool_calls: list[ToolCall] | None = None


FinishReason = Literal["stop", "length", "tool_calls"]


class ChatChoice(_Open):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason


class ChatCompletion(_Open):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(_Open):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason


class Completion(_Open):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[CompletionChoice]
    usage: Usage


class FunctionDelta(_Open):
    name: str | None = None  # in a call's first delta
    arguments: str  # the next piece of the arguments' JSON text


class ToolCallDelta(_Open):
    """A piece of a streamed tool call: its ``id``, ``type`` and name in its first delta."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta


class ChatDelta(_Open):
    """A chunk's new text: the role first, then content or tool calls; an empty delta with
    the finish."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(_Open):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(_Open):
    """One server-sent event of a chat stream (``data: {...}``)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[ChatChunkChoice]
    usage: Usage | None = None  # the last chunk's, with stream_options.include_usage


class CompletionChunkChoice(_Open):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class CompletionChunk(_Open):
    """One server-sent event of a completions stream (``data: {...}``)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None  # the last chunk's, with stream_options.include_usage


#: Every response body, for the OpenAPI document.
RESPONSE_MODELS = (
    ErrorResponse,
    ModelCard,
    ModelList,
    Health,
    ChatCompletion,
    Completion,
    ChatCompletionChunk,
    CompletionChunk,
)
