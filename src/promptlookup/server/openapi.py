"""``GET /openapi.json``: the real request bodies (the validating models of :mod:`.schemas`)
and the response bodies (the models below, which describe what :mod:`.responses` builds), so
that clients and fuzzers can read them.

The routes read their bodies themselves (for the size limit, the body timeout and OpenAI's
error JSON), so FastAPI cannot infer the bodies; :func:`install_openapi` writes them in.
"""

from __future__ import annotations

from typing import Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict

from ..limits import MIN_TEMPERATURE
from .schemas import ChatCompletionRequest, CompletionRequest


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


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


class Usage(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails | None
    speculative: Speculative


class AssistantMessage(_Open):
    role: Literal["assistant"]
    content: str
    refusal: str | None


FinishReason = Literal["stop", "length"]


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


class Health(_Open):
    status: str
    model: str


_MODELS = (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
    ChatCompletion,
    Completion,
    Health,
)
_ERRORS = {
    "400": "invalid request",
    "401": "missing or wrong API key",
    "404": "unknown model or path",
    "408": "the request body did not arrive in time",
    "413": "request body too large",
    "429": "queue full (see Retry-After)",
    "500": "internal error",
    "503": "loading or shutting down (see Retry-After)",
}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(name: str, description: str = "OK") -> dict:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


def _errors(*codes: str) -> dict:
    return {code: _json("ErrorResponse", _ERRORS[code]) for code in codes}


def build_openapi(app: FastAPI) -> dict:
    doc = get_openapi(
        title="promptlookup",
        version=app.version,
        description="OpenAI-compatible API over one model, with prompt lookup "
        "(speculative) decoding. See docs/server.md.",
        routes=app.routes,
    )
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for model in _MODELS:
        mode = (
            "validation" if model in (ChatCompletionRequest, CompletionRequest) else "serialization"
        )
        schema = model.model_json_schema(mode=mode, ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    state = getattr(app.state, "server", None)
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        props = schemas[name]["properties"]
        props["temperature"] = {
            "anyOf": [
                {"type": "number", "enum": [0]},
                {"type": "number", "minimum": MIN_TEMPERATURE, "maximum": 2},
                {"type": "null"},
            ],
            "description": "0 is greedy; absent: 1",
        }
        if state is not None and state.status == "ready":
            props["model"] = {"type": "string", "enum": [state.model_id]}
    secured = state is not None and state.settings.api_key is not None
    if secured:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    paths = doc["paths"]
    v1_errors = ("401", "500", "503") if secured else ("500", "503")
    for path, request, response in (
        ("/v1/chat/completions", "ChatCompletionRequest", "ChatCompletion"),
        ("/v1/completions", "CompletionRequest", "Completion"),
    ):
        operation = paths[path]["post"]
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(request)}},
        }
        ok = _json(response)
        ok["content"]["text/event-stream"] = {"schema": {"type": "string"}}
        operation["responses"] = {"200": ok, **_errors("400", "408", "413", "429", *v1_errors)}
    paths["/v1/models"]["get"]["responses"] = {"200": _json("ModelList"), **_errors(*v1_errors)}
    paths["/v1/models/{model_id}"]["get"]["responses"] = {
        "200": _json("ModelCard"),
        **_errors("404", *v1_errors),
    }
    paths["/health"]["get"]["responses"] = {
        "200": _json("Health"),
        "503": _json("Health", "loading or failed"),
    }
    for path, item in paths.items():
        for operation in item.values():
            operation.get("responses", {}).pop("422", None)
            if secured and path.startswith("/v1/"):
                operation["security"] = [{"bearer": []}]
    return doc


def install_openapi(app: FastAPI) -> None:
    app.openapi = lambda: build_openapi(app)
