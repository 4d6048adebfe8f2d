"""What every request meets outside its route: the API key gate, and the error responses.

- *API keys*: with keys, every path under ``/v1`` (and the operators' ``/metrics``,
  ``/tokenize``, ``/detokenize``) needs ``Authorization: Bearer <key>``
  or Anthropic's ``x-api-key: <key>`` with one of them (compared in constant time),
  checked before routing, so that an unknown ``/v1/*`` path or method is a 401 too and
  reveals nothing without a key. A valid key in either header authenticates (clients send
  both, one of them sometimes a placeholder); with two valid keys, ``Authorization``'s names
  the tenant (:mod:`.tenants`), which goes to the route as ``request.state.tenant``. The 401
  is in the API's own error shape (Anthropic's under ``/v1/messages``). Other paths
  (``/health``, ``/openapi.json``) are open.
- *Ignored fields*: a ``/v1`` request's parsing notes what it ignored (:mod:`.ignored`); the
  response's headers say it (``x-promptlookup-ignored-fields``, ``-tools``).
- *Errors* are OpenAI's JSON (:class:`~.request_base.APIError`), Starlette's own (404, 405) too;
  an unexpected exception is a 500 with its traceback logged once (in Anthropic's JSON under
  ``/v1/messages``); a client that leaves while sending its body is one line in the log.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .anthropic.serving import error_body
from .ignored import collecting
from .request_base import APIError
from .tenants import Tenants

log = logging.getLogger("promptlookup.server")


class APIKeyGate:
    """ASGI middleware: a 401 for any ``/v1`` request without one of the keys (no keys: all
    pass, as the tenant None); then the request's ignored fields in its response headers."""

    def __init__(self, app, tenants: Tenants) -> None:
        self.app, self.tenants = app, tenants

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not _keyed(scope["path"]):
            await self.app(scope, receive, send)
            return
        if self.tenants.required:
            tenant = self._tenant(dict(scope["headers"]))
            if tenant is None:
                error = APIError(
                    401,
                    "Incorrect or missing API key: send 'Authorization: Bearer <key>' "
                    "or 'x-api-key: <key>'",
                    code="invalid_api_key",
                )
                respond = _anthropic_error if _anthropic(scope["path"]) else error_response
                await respond(error)(scope, receive, send)
                return
            scope.setdefault("state", {})["tenant"] = tenant

        with collecting() as ignored:

            async def send_saying(message) -> None:
                if message["type"] == "http.response.start" and (said := ignored.headers()):
                    message = {**message, "headers": [*message.get("headers", []), *said]}
                await send(message)

            await self.app(scope, receive, send_saying)

    def _tenant(self, headers: dict[bytes, bytes]) -> str | None:
        """The tenant of the first valid key: ``Authorization``'s, else ``x-api-key``'s."""
        tenant = self.tenants.tenant(headers.get(b"authorization"))
        if tenant is None and b"x-api-key" in headers:  # Anthropic's clients
            tenant = self.tenants.tenant(b"Bearer " + headers[b"x-api-key"])
        return tenant


#: The paths outside ``/v1`` that need a key.
KEYED = {"/metrics", "/tokenize", "/detokenize"}


def _keyed(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/") or path.rstrip("/") in KEYED


def _anthropic(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def _anthropic_error(error: APIError) -> Response:
    """An error in Anthropic's JSON (:func:`.anthropic.error_body`)."""
    body = json.dumps(error_body(error))
    return Response(body, status_code=error.status, media_type="application/json")


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
    error = APIError(500, f"internal server error: {type(exc).__name__}", type="server_error")
    return _anthropic_error(error) if _anthropic(request.url.path) else error_response(error)
