"""``GET /openapi.json``: the real request bodies (the validating models of :mod:`.openai.protocol`,
:mod:`.anthropic.protocol`, :mod:`.responses.protocol`) and the response bodies (the models
the answers are built from, :mod:`.bodies`, :mod:`.anthropic.bodies`,
:mod:`.responses.bodies`: each API's routes declare theirs, its own error shape included, with
``responses=``), so that clients and fuzzers can read them.

The routes read their bodies themselves (for the size limit, the body timeout and each API's
error JSON), so FastAPI cannot infer the request bodies; :func:`install_openapi` writes them
in, and the operators' endpoints' answers. A 401 is documented only where the server has keys.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from ..limits import MIN_TEMPERATURE
from .anthropic import bodies as anthropic_bodies
from .anthropic.protocol import MessagesRequest
from .bodies import ERROR_STATUSES, READ, RESPONSE_MODELS
from .edge import KEYED
from .openai.protocol import ChatCompletionRequest, CompletionRequest
from .responses import bodies as responses_bodies
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
    *anthropic_bodies.RESPONSE_MODELS,
    *responses_bodies.RESPONSE_MODELS,
)


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(name: str, description: str = "OK") -> dict:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


def _errors(*codes: int) -> dict:
    return {str(code): _json("ErrorResponse", ERROR_STATUSES[code]) for code in codes}


def build_openapi(app: FastAPI) -> dict:
    doc = get_openapi(
        title="promptlookup",
        version=app.version,
        description="OpenAI-compatible API over one model, with prompt lookup "
        "(speculative) decoding. See docs/server.md.",
        routes=app.routes,
    )
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    # The models' own schemas (FastAPI's copies of the routes' declared ones drop defaults).
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
    # The routes read their bodies themselves: the request models are written in here. Each
    # API's routes declare their answers (responses=, the models of .bodies and the APIs'
    # folders); the operators' endpoints' are written in below.
    for path, request in (
        ("/v1/chat/completions", "ChatCompletionRequest"),
        ("/v1/completions", "CompletionRequest"),
        ("/v1/messages", "MessagesRequest"),
        ("/v1/messages/count_tokens", "MessagesRequest"),
        ("/v1/responses", "ResponsesRequest"),
        ("/tokenize", "TokenizeRequest"),
        ("/detokenize", "DetokenizeRequest"),
    ):
        paths[path]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(request)}},
        }
    for path, answer in (
        ("/tokenize", '{"tokens", "count", "max_model_len"}'),
        ("/detokenize", '{"content": text, "prompt": text}'),
    ):
        paths[path]["post"]["responses"] = {"200": {"description": answer}, **_errors(*READ)}
    paths["/metrics"]["get"]["responses"] = {
        "200": {
            "description": "Prometheus' text format (docs/server.md lists the metrics)",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **_errors(401),
    }
    paths["/health"]["get"]["responses"] = {
        "200": _json("Health"),
        "503": _json("Health", "loading or failed"),
    }
    for path, item in paths.items():
        for operation in item.values():
            operation.get("responses", {}).pop("422", None)
            if not secured:  # no key to miss
                operation.get("responses", {}).pop("401", None)
            if secured and (path.startswith("/v1/") or path in KEYED):
                operation["security"] = [{"bearer": []}]
    return doc


def install_openapi(app: FastAPI) -> None:
    app.openapi = lambda: build_openapi(app)
