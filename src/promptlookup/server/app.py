"""The OpenAI-compatible HTTP app: :func:`create_app` over a loaded model or a loader.

Endpoints: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (JSON, or server-sent
events in OpenAI's chunk format ending with ``data: [DONE]`` when ``"stream": true``),
``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (Anthropic's Messages API,
:mod:`.anthropic.serving`), ``POST /v1/responses`` (OpenAI's Responses API, :mod:`.responses.serving`),
``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``, ``GET /openapi.json``, and the
operators' ``GET /metrics`` (:mod:`.metrics`), ``POST /tokenize`` and ``POST /detokenize``
(:mod:`.tokenize`).
The complete list of what is supported and refused is ``docs/server.md``.

Policies:

- *Loading*: given a loader, the app answers at once and loads the model on a background thread;
  ``GET /health`` is 503 ``{"status": "loading"}`` until the model is ready, then 200 (503
  ``"failed"`` if loading failed). ``/v1/*`` answer 503 until then. ``/health`` shows the
  configuration only, nothing that moves with anyone's requests.
- *Context*: a generation ends at ``max_tokens`` (or ``max_completion_tokens``, which wins
  when both are given; absent: ``default_max_tokens``) or where the model's context is full,
  whichever comes first (``finish_reason`` ``"length"``); a prompt that leaves no room at all
  is a 400 with code ``context_length_exceeded``.
- *Defaults* follow OpenAI: ``temperature`` 1 and ``top_p`` 1. Pass ``temperature=0`` for
  greedy output, token-identical to plain decoding.
- *Statistics*: ``usage`` holds OpenAI's token counts plus ``usage.speculative`` =
  ``{forward_passes, drafted_tokens, accepted_tokens, tokens_per_forward, acceptance_rate,
  seconds}``. Streams carry ``usage`` in a last chunk when ``stream_options.include_usage``.
- *Predicted outputs*: ``prediction.content`` is tokenized and becomes the prompt lookup
  drafter's reference text (drafts come from it, the prompt, or the output so far, not from
  the cross-request index); one of
  more tokens than the context is a 400. Long texts are tokenized a chunk at a time, without
  holding up other requests, and no further than the context (see :mod:`.texts`).
- *Limits*: a body over ``max_body_bytes`` is a 413, a body not received within
  ``body_timeout`` seconds a 408; a full queue a 429 with ``Retry-After`` (see :mod:`.worker`),
  as are 503s while loading or shutting down; with API keys, every ``/v1`` path (unknown
  ones included) and ``/metrics``, ``/tokenize``, ``/detokenize`` need
  ``Authorization: Bearer <key>``, else 401 (see :mod:`.edge`); the key names the
  request's tenant (:mod:`.tenants`). ``/health`` is always open.
- *Keep-alive*: a stream sends a keep-alive (an SSE comment, or Anthropic's ``ping`` event)
  whenever nothing has gone out for ``--stream-keepalive`` seconds, and begins (200) after
  that long in the queue, so that no client's idle timer fires on a request that waits or
  prefills (:func:`.streams.keep_alive`). A whole (non-streamed) answer sends nothing
  until it is done, as llama-server and vLLM do.
- *Errors* use OpenAI's JSON ``{"error": {"message", "type", "param", "code"}}``; once a stream
  has begun, the same JSON goes out as an ``event: error`` message, then ``data: [DONE]``.
- *Disconnects* cancel the generation before its next forward pass, streaming or not; a
  request still waiting leaves the queue at once; a client that leaves while sending its body
  is one line in the log.
- *Shutdown* (:class:`Server`, on SIGTERM/SIGINT): new requests get 503; waiting ones are
  answered with a 503 error JSON (a stream begun while waiting, with an ``event: error``);
  the running generation ends before its next forward pass, its
  stream with an ``event: error`` and ``data: [DONE]``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ..drafters import check_drafter_spec
from .anthropic.bodies import COUNT_ANSWERS, MESSAGE_ANSWERS
from .anthropic.serving import count_message_tokens, serve_messages
from .bodies import (
    CHAT_ANSWERS,
    COMPLETION_ANSWERS,
    Health,
    HealthPrefixCache,
    HealthQueue,
    ModelCard,
    ModelList,
    documented,
    dump,
)
from .edge import APIKeyGate, install_error_handlers
from .metrics import CONTENT_TYPE_LATEST, RequestCounter
from .openai.serving import serve_completions
from .openapi import install_openapi
from .request_base import APIError
from .responses.bodies import RESPONSE_ANSWERS
from .responses.serving import serve_responses
from .settings import ServerSettings
from .state import ModelOrLoader, ServerState
from .tokenize import detokenize, tokenize

log = logging.getLogger("promptlookup.server")


def create_app(
    model: ModelOrLoader,
    settings: ServerSettings | None = None,
    *,
    on_load_error: Callable[[str], None] | None = None,
) -> FastAPI:
    """Build the app. ``model``: a :class:`~promptlookup.LanguageModel`, or a function returning
    one (called on a background thread at startup). ``settings``: the
    :class:`~promptlookup.server.ServerSettings` (the options of ``promptlookup serve``, its
    drafter and generation options; default: the defaults). ``on_load_error(message)`` is
    called if the loader fails. Serve it with :meth:`Server.for_app` for a graceful
    shutdown."""
    settings = settings or ServerSettings()
    check_drafter_spec(settings.drafter, **settings.drafter_options)  # bad ones fail here
    state = ServerState(model, settings, on_load_error)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.start()
        yield
        state.stop()

    app = FastAPI(title="promptlookup", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = state
    install_error_handlers(app)
    app.add_middleware(APIKeyGate, tenants=state.tenants)
    app.add_middleware(RequestCounter, metrics=state.metrics)  # outside the gate: 401s too

    v1 = APIRouter(prefix="/v1")

    @app.get("/health")
    async def health():
        # Open to anyone: the status and the configuration, nothing that moves with
        # requests (a tenant could watch another's traffic); that is /metrics, behind the key.
        status = "ok" if state.status == "ready" else state.status
        status = "shutting_down" if state.shutting_down else status
        body = Health(status=status, model=state.model_id)
        if state.worker is not None:
            body.queue = HealthQueue(capacity=state.settings.max_queue, max_batch=state.max_batch)
        if (cache := state.prefix_cache) is not None:
            body.prefix_cache = HealthPrefixCache(budget_mib=round(cache.budget_bytes / 2**20, 3))
        if state.load_error:
            body.error = state.load_error
        ok = state.status == "ready" and not state.shutting_down
        return JSONResponse(dump(body), status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.scrape(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/tokenize")
    async def tokenize_text(request: Request):
        return await tokenize(state, request)

    @app.post("/detokenize")
    async def detokenize_tokens(request: Request):
        return await detokenize(state, request)

    @v1.get("/models", responses=documented(ModelList, statuses=(401, 500, 503)))
    async def models():
        state.ready_model()
        return dump(ModelList(object="list", data=[state.model_card()]))

    @v1.get(
        "/models/{model_id:path}", responses=documented(ModelCard, statuses=(401, 404, 500, 503))
    )
    async def model(model_id: str):
        state.ready_model()
        if not state.serves(model_id):
            raise APIError(
                404,
                f"The model {model_id!r} does not exist; this server has {state.model_id!r}",
                param="model",
                code="model_not_found",
            )
        return dump(state.model_card())

    @v1.post(
        "/chat/completions",
        responses=CHAT_ANSWERS,
    )
    async def chat_completions(request: Request):
        return await serve_completions(state, request, chat=True)

    @v1.post("/completions", responses=COMPLETION_ANSWERS)
    async def completions(request: Request):
        return await serve_completions(state, request, chat=False)

    @v1.post("/messages", responses=MESSAGE_ANSWERS)
    async def messages(request: Request):
        return await serve_messages(state, request)

    @v1.post("/messages/count_tokens", responses=COUNT_ANSWERS)
    async def message_tokens(request: Request):
        return await count_message_tokens(state, request)

    @v1.post("/responses", responses=RESPONSE_ANSWERS)
    async def responses(request: Request):
        return await serve_responses(state, request)

    app.include_router(v1)
    install_openapi(app)
    return app


# -- one request ----------------------------------------------------------------------------
