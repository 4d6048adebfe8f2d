"""The OpenAI-compatible HTTP app: :func:`create_app` over a loaded model or a loader.

Endpoints: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (JSON, or server-sent
events in OpenAI's chunk format ending with ``data: [DONE]`` when ``"stream": true``),
``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``.

Policies:

- *Loading*: given a loader, the app answers at once and loads the model on a background thread;
  ``GET /health`` is 503 ``{"status": "loading"}`` until the model is ready, then 200 (503
  ``"failed"`` if loading failed). ``/v1/*`` answer 503 until then.
- *Context*: prompt tokens + ``max_tokens`` must fit the model's context, else 400 with code
  ``context_length_exceeded``. Without ``max_tokens`` (or ``max_completion_tokens``, which wins
  when both are given) the limit is ``min(default_max_tokens, context - prompt tokens)``; a
  prompt that leaves no room at all is a 400.
- *Defaults* follow OpenAI: ``temperature`` 1 and ``top_p`` 1. Pass ``temperature=0`` for
  greedy output, token-identical to plain decoding.
- *Statistics*: ``usage`` holds OpenAI's token counts plus ``usage.speculative`` =
  ``{forward_passes, drafted_tokens, accepted_tokens, tokens_per_forward, acceptance_rate,
  seconds}``, and ``completion_tokens_details`` the drafted tokens kept and rejected as
  OpenAI's accepted and rejected prediction tokens. Streams carry ``usage`` in a last chunk when ``stream_options.include_usage``.
- *Predicted outputs*: ``prediction.content`` is tokenized and becomes the prompt lookup
  drafter's reference text (drafts come from it, the prompt, or the output so far).
- *Limits*: a body over ``max_body_bytes`` is a 413, one that stalls for ``body_timeout`` a 408; a full queue a 429 with ``Retry-After: 1``
  (see :mod:`.worker`), a loading model a 503 with ``Retry-After: 5``; with ``api_key``, ``/v1/*`` need ``Authorization: Bearer <key>`` (compared in
  constant time), else 401. ``/health`` is always open.
- *Errors* use OpenAI's JSON ``{"error": {"message", "type", "param", "code"}}``; once a stream
  has begun, the same JSON goes out as an ``event: error`` message, then ``data: [DONE]``.
- *Disconnects* cancel the generation within one decoding step, streaming or not.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import threading
import time
import uuid
from contextlib import asynccontextmanager
from typing import Callable, Union

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .._version import __version__
from ..drafters import check_drafter_spec
from ..drafters.options import LOOKUP_OPTIONS
from ..errors import EmptyPromptError, PromptLookupError
from ..generation import LanguageModel
from ..sampling import SamplingParams
from .schemas import (APIError, ChatCompletionRequest, CompletionRequest, chunk,
                      completion_body, content_text, parse_request, read_json, sse, usage)
from .worker import GenerationJob, GenerationWorker, QueueFull

log = logging.getLogger("promptlookup.server")

DEFAULT_MAX_TOKENS = 512
MAX_BODY_BYTES = 4 * 1024 * 1024
#: Seconds a request body may pause between two of its parts before the request is a 408
#: (a slow or stalled client cannot hold the server).
BODY_TIMEOUT = 10.0

ModelOrLoader = Union[LanguageModel, Callable[[], LanguageModel]]


#: Retry-After (seconds) on a 429 (the queue is full) and on a 503 while the model loads.
RETRY_AFTER_BUSY = 1
RETRY_AFTER_LOADING = 5


class ServerState:
    """The model (once loaded), its worker, and the server's settings."""

    def __init__(self, model: ModelOrLoader, *, model_id, api_key, max_queue, max_body_bytes,
                 default_max_tokens, drafter, drafter_options, generation_options,
                 on_load_error) -> None:
        self.loader = model if not isinstance(model, LanguageModel) else None
        self.lm: LanguageModel | None = model if isinstance(model, LanguageModel) else None
        self.model_id = model_id or (self.lm.name if self.lm is not None else "promptlookup")
        self._named = model_id is not None
        self.api_key = api_key
        self.max_queue = max_queue
        self.max_body_bytes = max_body_bytes
        self.body_timeout = BODY_TIMEOUT
        self.default_max_tokens = default_max_tokens
        self.drafter = drafter
        self.drafter_options = dict(drafter_options or {})
        self.generation_options = dict(generation_options or {})
        self.on_load_error = on_load_error
        self.worker: GenerationWorker | None = None
        self.status = "loading"
        self.load_error: str | None = None
        self.tokenizer_lock = threading.Lock()  # request threads encode one at a time

    def start(self) -> None:
        if self.lm is not None:
            self._ready(self.lm)
        else:
            threading.Thread(target=self._load, name="promptlookup-load", daemon=True).start()

    def _load(self) -> None:
        try:
            self._ready(self.loader())
        except Exception as exc:  # a PromptLookupError is one line; anything else gets its type
            self.load_error = str(exc) if isinstance(exc, PromptLookupError) else \
                f"{type(exc).__name__}: {exc}"
            self.status = "failed"
            log.error("model loading failed: %s", self.load_error)
            if self.on_load_error is not None:
                self.on_load_error(self.load_error)

    def _ready(self, lm: LanguageModel) -> None:
        self.lm = lm
        if not self._named:
            self.model_id = lm.name
        self.worker = GenerationWorker(lm, self.max_queue)
        self.worker.start()
        self.status = "ready"

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()

    def ready_model(self) -> LanguageModel:
        if self.status == "ready":
            return self.lm
        message = ("the model is still loading" if self.status == "loading"
                   else f"the model failed to load: {self.load_error}")
        raise APIError(503, message, type="server_error", code=f"model_{self.status}",
                       retry_after=RETRY_AFTER_LOADING if self.status == "loading" else None)


def create_app(model: ModelOrLoader, *, model_id: str | None = None, api_key: str | None = None,
               max_queue: int = 16, max_body_bytes: int = MAX_BODY_BYTES,
               default_max_tokens: int = DEFAULT_MAX_TOKENS, drafter: str = "prompt-lookup",
               drafter_options: dict | None = None, generation_options: dict | None = None,
               on_load_error: Callable[[str], None] | None = None,
               body_timeout: float = BODY_TIMEOUT) -> FastAPI:
    """Build the app. ``model``: a :class:`~promptlookup.LanguageModel`, or a function returning
    one (called on a background thread at startup). ``model_id``: the name clients must send as
    ``model`` (default: the model's name). ``drafter``/``drafter_options``: a drafter spec
    and its options, as in :func:`promptlookup.make_drafter`, for requests without a
    ``prediction`` (those use prompt lookup with the prediction as reference).
    ``generation_options``: more keyword arguments for every
    :meth:`~promptlookup.LanguageModel.stream` call (e.g. ``{"speculation": "fixed"}``).
    ``on_load_error(message)`` is called if the loader fails. ``body_timeout``: seconds a
    request body may stall before the request is answered 408."""
    check_drafter_spec(drafter, **(drafter_options or {}))  # bad settings fail here, not later
    state = ServerState(model, model_id=model_id, api_key=api_key, max_queue=max_queue,
                        max_body_bytes=max_body_bytes, default_max_tokens=default_max_tokens,
                        drafter=drafter, drafter_options=drafter_options,
                        generation_options=generation_options, on_load_error=on_load_error)
    state.body_timeout = body_timeout

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.start()
        yield
        state.stop()

    app = FastAPI(title="promptlookup", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None)  # /openapi.json only
    app.openapi = functools.partial(_openapi, app)
    app.state.server = state
    app.add_exception_handler(APIError, _api_error_response)
    app.add_exception_handler(StarletteHTTPException, _http_error_response)
    app.add_exception_handler(Exception, _internal_error_response)

    async def check_api_key(request: Request) -> None:
        if state.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if not (scheme.lower() == "bearer"
                and hmac.compare_digest(token.strip().encode(), state.api_key.encode())):
            raise APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_api_key)])

    @app.get("/health")
    async def health():
        status = "ok" if state.status == "ready" else state.status
        body = {"status": status, "model": state.model_id}
        if state.worker is not None:
            body["queue"] = {"running": state.worker.current is not None,
                             "waiting": state.worker.waiting, "capacity": state.max_queue}
        if state.load_error:
            body["error"] = state.load_error
        return JSONResponse(body, status_code=200 if state.status == "ready" else 503)

    @v1.get("/models")
    async def models():
        state.ready_model()
        return {"object": "list", "data": [{"id": state.model_id, "object": "model",
                                            "created": 0, "owned_by": "promptlookup"}]}

    @v1.get("/models/{model_id:path}")
    async def model(model_id: str):
        state.ready_model()
        if model_id != state.model_id:
            raise APIError(404, f"The model {model_id!r} does not exist; this server has "
                                f"{state.model_id!r}", param="model", code="model_not_found")
        return {"id": state.model_id, "object": "model", "created": 0, "owned_by": "promptlookup"}

    @v1.post("/chat/completions", openapi_extra=_body_schema(ChatCompletionRequest))
    async def chat_completions(request: Request):
        return await _serve(state, request, chat=True)

    @v1.post("/completions", openapi_extra=_body_schema(CompletionRequest))
    async def completions(request: Request):
        return await _serve(state, request, chat=False)

    app.include_router(v1)
    return app


# -- the schema ----------------------------------------------------------------------------

#: Where request models' nested definitions go in ``/openapi.json``.
_REF = "#/components/schemas/{model}"


def _body_schema(model) -> dict:
    """The route's request body, described by its typed model (bodies are read and validated
    by hand, so FastAPI cannot see them)."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": _REF.format(model=model.__name__)}}}}}


def _openapi(app: FastAPI) -> dict:
    """FastAPI's schema with the request models (and the models they nest) as components."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (ChatCompletionRequest, CompletionRequest):
            body = model.model_json_schema(ref_template=_REF)
            components.update(body.pop("$defs", {}))
            components[model.__name__] = body
        app.openapi_schema = schema
    return app.openapi_schema


# -- one request ----------------------------------------------------------------------------


async def _serve(state: ServerState, request: Request, chat: bool) -> Response:
    body = await read_json(request, state.max_body_bytes, state.body_timeout)
    req = parse_request(ChatCompletionRequest if chat else CompletionRequest, body)
    state.ready_model()
    if req.model != state.model_id:
        raise APIError(400, f"The model {req.model!r} does not exist; this server has "
                            f"{state.model_id!r}", param="model", code="model_not_found")
    job_inputs = await run_in_threadpool(_prepare, state, req, chat)
    job = GenerationJob(**job_inputs, wants_deltas=bool(req.stream))
    try:
        state.worker.submit(job)
    except QueueFull:
        raise APIError(429, f"the server is busy ({state.max_queue} requests already waiting); "
                            "retry later", type="rate_limit_error", code="queue_full",
                       retry_after=RETRY_AFTER_BUSY) from None
    meta = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "created": int(time.time()), "model": state.model_id}
    if req.stream:
        return StreamingResponse(_sse_events(job, meta, chat, req.include_usage),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    result = await _outcome_unless_disconnected(job, request)
    if result is None:  # the client is gone; nobody reads this
        return Response(status_code=499)
    return JSONResponse(completion_body(meta, chat, result))


def _prepare(state: ServerState, req, chat: bool) -> dict:
    """Tokenize and check one request (runs on a thread): the :class:`GenerationJob` inputs."""
    lm = state.lm
    param = "messages" if chat else "prompt"
    with state.tokenizer_lock:
        try:
            prompt_ids = lm.encode([m.as_dict() for m in req.messages] if chat else req.prompt)
            reference_ids = None
            if req.prediction is not None:
                reference_ids = list(lm.tokenizer(content_text(req.prediction.content),
                                                  add_special_tokens=False)["input_ids"])
        except Exception as exc:  # the prompt's fault, incl. chat template (jinja2) errors?
            if not (isinstance(exc, (PromptLookupError, ValueError, TypeError))
                    or type(exc).__module__.startswith("jinja2")):
                raise
            empty = isinstance(exc, EmptyPromptError)
            raise APIError(400, str(exc) if empty else f"cannot encode the prompt: {exc}",
                           param=param) from None
    vocab = getattr(getattr(lm.model, "config", None), "vocab_size", None)
    if vocab and any(not 0 <= t < vocab for t in prompt_ids):
        raise APIError(400, f"prompt: token ids must be in [0, {vocab})", param="prompt")
    sampling = req.sampling()
    try:
        SamplingParams(sampling["temperature"], sampling["top_k"], sampling["top_p"],
                       sampling["repetition_penalty"], sampling["seed"])
    except PromptLookupError as exc:
        raise APIError(400, str(exc), param=str(exc).split()[0]) from None
    context, used = lm.target.max_context, len(prompt_ids)
    max_new_tokens = req.requested_max_tokens
    if max_new_tokens is None:
        max_new_tokens = min(state.default_max_tokens, context - used)
    if max_new_tokens < 1 or used + max_new_tokens > context:
        raise APIError(400, f"This model's maximum context length is {context} tokens; the "
                            f"prompt has {used} tokens and max_tokens is {max_new_tokens}",
                       param=param, code="context_length_exceeded")
    drafter, options = state.drafter, state.drafter_options
    if reference_ids:
        lookup = {k: v for k, v in options.items() if k in LOOKUP_OPTIONS}
        drafter, options = "prompt-lookup", {**lookup, "reference_ids": reference_ids}
    return {"prompt_ids": prompt_ids, "max_new_tokens": max_new_tokens, "sampling": sampling,
            "drafter": drafter, "drafter_options": options,
            "generation_options": state.generation_options}


async def _outcome_unless_disconnected(job: GenerationJob, request: Request):
    """The job's result, or None (and the job cancelled) if the client disconnects first."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    outcome = asyncio.ensure_future(job.outcome())
    gone = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({outcome, gone}, return_when=asyncio.FIRST_COMPLETED)
        if outcome.done():
            return outcome.result()
        return None
    finally:
        outcome.cancel()
        gone.cancel()
        job.cancel()  # no effect once the job has ended


async def _sse_events(job: GenerationJob, meta: dict, chat: bool, include_usage: bool):
    """The stream's server-sent events. If the client disconnects, Starlette cancels this
    generator; its ``finally`` cancels the job."""
    try:
        if chat:
            yield sse(chunk(meta, chat, {"role": "assistant", "content": ""}))
        while True:
            kind, value = await job.events.get()
            if kind == "delta":
                yield sse(chunk(meta, chat, {"content": value} if chat else value))
            elif kind == "done":
                yield sse(chunk(meta, chat, {} if chat else "", value.finish_reason))
                if include_usage:
                    yield sse({**chunk(meta, chat, None), "usage": usage(value)})
                break
            else:
                error = value if kind == "error" else APIError(
                    503, "the generation was cancelled", type="server_error", code="cancelled")
                yield f"event: error\ndata: {json.dumps(error.body())}\n\n"
                break
        yield "data: [DONE]\n\n"
    finally:
        job.cancel()  # no effect once the job has ended


# -- errors ---------------------------------------------------------------------------------


async def _api_error_response(request: Request, exc: APIError) -> JSONResponse:
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


async def _http_error_response(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    error = APIError(exc.status_code, str(exc.detail), type=kind)
    return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)


async def _internal_error_response(request: Request, exc: Exception) -> JSONResponse:
    log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    error = APIError(500, f"internal server error: {type(exc).__name__}", type="server_error")
    return JSONResponse(error.body(), status_code=500)
