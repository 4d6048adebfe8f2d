"""``GET /openapi.json``: the real request bodies (the validating models of :mod:`.openai.protocol`)
and the response bodies (the models of :mod:`.bodies`, from which the answers are built), so
that clients and fuzzers can read them.

The routes read their bodies themselves (for the size limit, the body timeout and OpenAI's
error JSON), so FastAPI cannot infer the bodies; :func:`install_openapi` writes them in.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from ..limits import MIN_TEMPERATURE
from .anthropic.protocol import MessagesRequest
from .bodies import RESPONSE_MODELS
from .edge import KEYED
from .openai.protocol import ChatCompletionRequest, CompletionRequest
from .responses.protocol import ResponsesRequest
from .tokenize import DetokenizeRequest, TokenizeRequest

_MODELS = (
    ChatCompletionRequest,
    CompletionRequest,
    MessagesRequest,
    ResponsesRequest,
    TokenizeRequest,
    DetokenizeRequest,
    *RESPONSE_MODELS,
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
        aliases = state.settings.model_alias if state is not None else ("*",)
        if state is not None and state.status == "ready" and "*" not in aliases:
            props["model"] = {"type": "string", "enum": [state.model_id, *aliases]}
    secured = state is not None and state.tenants.required
    if secured:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    paths = doc["paths"]
    v1_errors = ("401", "500", "503") if secured else ("500", "503")
    for path, request, response, chunk in (
        ("/v1/chat/completions", "ChatCompletionRequest", "ChatCompletion", "ChatCompletionChunk"),
        ("/v1/completions", "CompletionRequest", "Completion", "CompletionChunk"),
    ):
        operation = paths[path]["post"]
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(request)}},
        }
        ok = _json(response)
        events = f"with stream: server-sent events, 'data: ' and a {chunk} each, then [DONE]"
        ok["content"]["text/event-stream"] = {"schema": {"type": "string", "description": events}}
        operation["responses"] = {"200": ok, **_errors("400", "408", "413", "429", *v1_errors)}
    # The other APIs' bodies: their requests validated as these models, their answers written
    # in their own shapes (docs/server.md); and the operators' /tokenize and /detokenize.
    read = ("400", "408", "413", *v1_errors)  # a body read and checked
    queued = (*read, "429")
    for path, request, answer, errors in (
        ("/v1/messages", "MessagesRequest", "Anthropic's message; with stream, its events", queued),
        ("/v1/messages/count_tokens", "MessagesRequest", '{"input_tokens": n}', queued),
        ("/v1/responses", "ResponsesRequest", "a response object; with stream, its events", queued),
        ("/tokenize", "TokenizeRequest", '{"tokens", "count", "max_model_len"}', read),
        ("/detokenize", "DetokenizeRequest", '{"content": text, "prompt": text}', read),
    ):
        operation = paths[path]["post"]
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(request)}},
        }
        operation["responses"] = {"200": {"description": answer}, **_errors(*errors)}
    paths["/v1/models"]["get"]["responses"] = {"200": _json("ModelList"), **_errors(*v1_errors)}
    paths["/v1/models/{model_id}"]["get"]["responses"] = {
        "200": _json("ModelCard"),
        **_errors("404", *v1_errors),
    }
    paths["/metrics"]["get"]["responses"] = {
        "200": {
            "description": "Prometheus' text format (docs/server.md lists the metrics)",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **_errors(*(("401",) if secured else ())),
    }
    paths["/health"]["get"]["responses"] = {
        "200": _json("Health"),
        "503": _json("Health", "loading or failed"),
    }
    for path, item in paths.items():
        for operation in item.values():
            operation.get("responses", {}).pop("422", None)
            if secured and (path.startswith("/v1/") or path in KEYED):
                operation["security"] = [{"bearer": []}]
    return doc


def install_openapi(app: FastAPI) -> None:
    app.openapi = lambda: build_openapi(app)
