"""The response bodies, as pydantic models: what the server returns (built by :mod:`.openai.answers`,
:mod:`.app` and :class:`~.request_base.APIError`) and what ``GET /openapi.json`` documents
(:mod:`.openapi`; each route declares its answers and errors, :func:`documented`). One set of
models for both, so that the schema cannot drift from the answers; the other APIs' are in
their folders (:mod:`.anthropic.bodies`, :mod:`.responses.bodies`).

Bodies are written with :func:`dump`: every field given when a model is built is in the JSON,
``null`` included (OpenAI's shapes carry ``"logprobs": null`` and the like), and a field left at
its default is left out (a stream's ``usage`` is in its last chunk only). Models allow more
fields than they list, as OpenAI's clients do.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class Body(BaseModel):
    """A response body: it allows more fields than it lists (see the module doc)."""

    model_config = ConfigDict(extra="allow")


def dump(body: BaseModel) -> dict:
    """The JSON object of a body: the fields it was built with."""
    return body.model_dump(exclude_unset=True)


class ErrorDetail(Body):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(Body):
    error: ErrorDetail


class ModelCard(Body):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(Body):
    object: Literal["list"]
    data: list[ModelCard]


class HealthQueue(Body):
    """The queue's configuration (how many run and wait now: ``GET /metrics``)."""

    capacity: int
    max_batch: int | None


class HealthPrefixCache(Body):
    """The prefix cache's budget (what it holds now, per tenant: ``GET /metrics``)."""

    budget_mib: float


class Health(Body):
    status: str
    model: str
    queue: HealthQueue | None = None  # once the model is ready
    prefix_cache: HealthPrefixCache | None = None  # when the server has one
    error: str | None = None  # why loading failed


class TopLogprob(Body):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Body):
    content: list[TokenLogprobEntry] | None
    refusal: str | None


class CompletionLogprobs(Body):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class Speculative(Body):
    """Extension: the speculative decoding statistics of the request."""

    forward_passes: int
    drafted_tokens: int
    accepted_tokens: int
    tokens_per_forward: float
    acceptance_rate: float
    seconds: float


class CompletionTokensDetails(Body):
    accepted_prediction_tokens: int
    rejected_prediction_tokens: int
    reasoning_tokens: int
    audio_tokens: int


class PromptTokensDetails(Body):
    cached_tokens: int  # prompt tokens whose keys and values came from the prefix cache


class Usage(Body):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails | None
    speculative: Speculative


class CalledFunction(Body):
    name: str
    arguments: str  # JSON text, valid against the tool's parameters


class ToolCall(Body):
    id: str
    type: Literal["function"]
    function: CalledFunction


class AssistantMessage(Body):
    role: Literal["assistant"]
    content: str | None  # None when the answer calls tools
    refusal: str | None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None  # a thinking model's reasoning, apart (.reasoning)


FinishReason = Literal["stop", "length", "tool_calls"]


class ChatChoice(Body):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason


class ChatCompletion(Body):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(Body):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason


class Completion(Body):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[CompletionChoice]
    usage: Usage


class FunctionDelta(Body):
    name: str | None = None  # in a call's first delta
    arguments: str  # the next piece of the arguments' JSON text


class ToolCallDelta(Body):
    """A piece of a streamed tool call: its ``id``, ``type`` and name in its first delta."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta


class ChatDelta(Body):
    """A chunk's new text: the role first, then a thinking model's reasoning
    (:mod:`.reasoning`), content or tool calls; an empty delta with the finish."""

    role: Literal["assistant"] | None = None
    reasoning_content: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(Body):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(Body):
    """One server-sent event of a chat stream (``data: {...}``)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[ChatChunkChoice]
    usage: Usage | None = None  # the last chunk's, with stream_options.include_usage


class CompletionChunkChoice(Body):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class CompletionChunk(Body):
    """One server-sent event of a completions stream (``data: {...}``)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None  # the last chunk's, with stream_options.include_usage


#: What each error status means, as the OpenAPI document says it.
ERROR_STATUSES = {
    400: "invalid request",
    401: "missing or wrong API key",
    404: "unknown model or path",
    408: "the request body did not arrive in time",
    413: "request body too large",
    429: "queue full (see Retry-After)",
    500: "internal error",
    503: "loading or shutting down (see Retry-After)",
}
#: The statuses of a route that reads a body and checks it; and of one that queues a job too.
READ = (400, 401, 408, 413, 500, 503)
QUEUED = (*READ, 429)


def documented(
    answer: type[BaseModel],
    error: type[BaseModel] = ErrorResponse,
    statuses: tuple[int, ...] = QUEUED,
    events: str | None = None,
) -> dict:
    """A route's ``responses=`` (FastAPI's, and so ``GET /openapi.json``'s): ``answer``'s
    model for 200 (and with ``events``, the stream's server-sent events, described), the
    API's ``error`` model for each of ``statuses``."""
    ok: dict = {"model": answer, "description": "OK"}
    if events is not None:
        stream = {"schema": {"type": "string", "description": events}}
        ok["content"] = {"text/event-stream": stream}
    errors = {
        status: {"model": error, "description": ERROR_STATUSES[status]} for status in statuses
    }
    return {200: ok, **errors}


def _chunks(chunk: str) -> str:
    return f"server-sent events, 'data: ' and a {chunk} each, then 'data: [DONE]'"


#: What ``POST /v1/chat/completions`` and ``POST /v1/completions`` answer.
CHAT_ANSWERS = documented(ChatCompletion, events=_chunks("ChatCompletionChunk"))
COMPLETION_ANSWERS = documented(Completion, events=_chunks("CompletionChunk"))

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
