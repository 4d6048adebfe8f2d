"""What every request meets outside its route: the API key gate, and the error responses.

- *API keys*: with keys, every path under ``/v1`` (and the operators' ``/metrics``,
  ``/tokenize``, ``/detokenize``) needs ``Authorization: Bearer <key>``
  (or Anthropic's ``x-api-key: <key>``) with one of them (compared in constant time),
  checked before routing, so that an unknown ``/v1/*`` path or method is a 401 too and
  reveals nothing without a key; the key's tenant (:mod:`.tenants`) goes to the route as
  ``request.state.tenant``. Other paths (``/health``, ``/openapi.json``) are open.
- *Errors* are OpenAI's JSON (:class:`~.schemas.APIError`), Starlette's own (404, 405) too;
  an unexpected exception is a 500 with its traceback logged once; a client that leaves
  while sending its body is one line in the log.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .schemas import APIError
from .tenants import Tenants

log = logging.getLogger("promptlookup.server")


class APIKeyGate:
    """ASGI middleware: a 401 for any ``/v1`` request without one of the keys (no keys: all
    pass, as the tenant None)."""

    def __init__(self, app, tenants: Tenants) -> None:
        self.app, self.tenants = app, tenants

    async def __call__(self, scope, receive, send) -> None:
        if self.tenants.required and scope["type"] == "http" and _keyed(scope["path"]):
            headers = dict(scope["headers"])
            if b"x-api-key" in headers:  # Anthropic's clients
                authorization = b"Bearer " + headers[b"x-api-key"]
            else:
                authorization = headers.get(b"authorization")
            tenant = self.tenants.tenant(authorization)
            if tenant is None:
                error = APIError(
                    401,
                    "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                    code="invalid_api_key",
                )
                await error_response(error)(scope, receive, send)
                return
            scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)


#: The paths outside ``/v1`` that need a key.
KEYED = {"/metrics", "/tokenize", "/detokenize"}


def _keyed(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/") or path.rstrip("/") in KEYED


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error_response)
    app.add_exception_handler(StarletteHTTPException, _http_error_response)
    app.add_exception_handler(ClientDisconnect, _client_left)
    app.add_exception_handler(Exception, _internal_error_response)


def error_response(error: APIError) -> Response:
    # ASCII-escaped JSON: an error message may quote a client's string, lone surrogates included.
    return Response(
        json.dumps(error.body()),
        status_code=error.status,
        media_type="application/json",
        headers=error.headers,
    )


async def _api_error_response(request: Request, exc: APIError) -> Response:
    return error_response(exc)


async def _http_error_response(request: Request, exc: StarletteHTTPException) -> Response:
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    error = APIError(exc.status_code, str(exc.detail), type=kind, headers=exc.headers)
    return error_response(error)


async def _client_left(request: Request, exc: ClientDisconnect) -> Response:
    client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
    log.info("%s left before sending its whole request body", client)
    return Response(status_code=499)  # nobody reads it


async def _internal_error_response(request: Request, exc: Exception) -> Response:
    log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(
        APIError(500, f"internal server error: {type(exc).__name__}", type="server_error")
    )
