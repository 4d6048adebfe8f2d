"""The Responses API's bodies, as pydantic models: the response object with its output items
(:mod:`.serving` builds it whole, and as a stream's events go by); what ``GET /openapi.json``
documents for ``/v1/responses`` (one set of models for both, written with
:func:`..bodies.dump`). Its errors are OpenAI's (:class:`..bodies.ErrorResponse`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..bodies import Body, documented

#: An output item's status: ``in_progress`` while a stream writes it.
ItemStatus = Literal["in_progress", "completed"]


class ResponseOutputText(Body):
    type: Literal["output_text"]
    text: str
    annotations: list


class ResponseOutputMessage(Body):
    type: Literal["message"]
    id: str
    status: ItemStatus
    role: Literal["assistant"]
    content: list[ResponseOutputText]


class ResponseFunctionCall(Body):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str  # JSON text, valid against the tool's parameters
    status: ItemStatus
    namespace: str | None = None  # a namespace tool's (Codex's)


class ResponseReasoningText(Body):
    type: Literal["reasoning_text"]
    text: str


class ResponseReasoning(Body):
    """A thinking model's reasoning (:mod:`..reasoning`): its text as ``reasoning_text``
    content, no summary."""

    type: Literal["reasoning"]
    id: str
    summary: list
    content: list[ResponseReasoningText]
    status: ItemStatus


OutputItem = Annotated[
    ResponseReasoning | ResponseOutputMessage | ResponseFunctionCall, Field(discriminator="type")
]


class InputTokensDetails(Body):
    cached_tokens: int  # prompt tokens whose keys and values came from the prefix cache


class OutputTokensDetails(Body):
    reasoning_tokens: int


class ResponseUsage(Body):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(Body):
    reason: Literal["max_output_tokens"]


class ResponseText(Body):
    format: dict  # the request's text.format, or {"type": "text"}


class ResponseObject(Body):
    """``POST /v1/responses``' answer: the request's settings said back, the output and the
    usage once the answer is in (a stream's ``response.created`` has neither yet)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    error: None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: None
    temperature: float
    top_p: float
    tool_choice: str | dict
    tools: list[dict]
    text: ResponseText
    store: bool
    usage: ResponseUsage | None


#: Every response body of the Responses API, for the OpenAPI document.
RESPONSE_MODELS = (ResponseObject,)

#: What ``POST /v1/responses`` answers (its errors are OpenAI's).
RESPONSE_ANSWERS = documented(
    ResponseObject,
    events="the Responses API's events: response.created and response.in_progress (the "
    "response, without output), per output item response.output_item.added, its deltas and "
    ".done events, then response.completed or response.incomplete (the whole response)",
)
