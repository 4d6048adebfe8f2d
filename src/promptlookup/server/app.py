"""The OpenAI-compatible HTTP app: :func:`create_app` over a loaded model or a loader.

Endpoints: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (JSON, or server-sent
events in OpenAI's chunk format ending with ``data: [DONE]`` when ``"stream": true``),
``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``, ``GET /openapi.json``.
The complete list of what is supported and refused is ``docs/server.md``.

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
  seconds}``. Streams carry ``usage`` in a last chunk when ``stream_options.include_usage``.
- *Predicted outputs*: ``prediction.content`` is tokenized and becomes the prompt lookup
  drafter's reference text (drafts come from it, the prompt, or the output so far, not from
  the cross-request index); one of
  more tokens than the context is a 400. Long texts are tokenized a chunk at a time, without
  holding up other requests, and no further than the context (see :mod:`.texts`).
- *Limits*: a body over ``max_body_bytes`` is a 413, a body not received within
  ``body_timeout`` seconds a 408; a full queue a 429 with ``Retry-After`` (see :mod:`.worker`),
  as are 503s while loading or shutting down; with ``api_key``, every ``/v1`` path needs
  ``Authorization: Bearer <key>``, unknown ones included, else 401 (see :mod:`.edge`).
  ``/health`` is always open.
- *Errors* use OpenAI's JSON ``{"error": {"message", "type", "param", "code"}}``; once a stream
  has begun, the same JSON goes out as an ``event: error`` message, then ``data: [DONE]``.
- *Disconnects* cancel the generation before its next forward pass, streaming or not; a
  request still waiting leaves the queue at once; a client that leaves while sending its body
  is one line in the log.
- *Shutdown* (:class:`Server`, on SIGTERM/SIGINT): new requests get 503; waiting ones are
  answered with a 503 error JSON; the running generation ends before its next forward pass, its
  stream with an ``event: error`` and ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ..drafters import check_drafter_spec, parse_drafter_spec
from ..drafters.options import LOOKUP_OPTIONS
from ..errors import EmptyPromptError, PromptLookupError
from ..sampling import SamplingParams
from .bodies import Health, HealthQueue, ModelList, dump
from .edge import APIKeyGate, install_error_handlers
from .openapi import install_openapi
from .responses import ChunkWriter, completion_body, sse, sse_error
from .schemas import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    content_text,
    parse_request,
    read_json,
)
from .settings import ServerSettings
from .state import ModelOrLoader, ServerState
from .texts import CHUNK, bounded_ids
from .worker import GenerationJob, QueueFull

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
    app.add_middleware(APIKeyGate, key=settings.api_key)

    v1 = APIRouter(prefix="/v1")

    @app.get("/health")
    async def health():
        status = "ok" if state.status == "ready" else state.status
        status = "shutting_down" if state.shutting_down else status
        body = Health(status=status, model=state.model_id)
        if state.worker is not None:
            body.queue = HealthQueue(
                running=state.worker.running,
                waiting=state.worker.waiting,
                capacity=state.settings.max_queue,
                max_batch=state.max_batch,
            )
        if state.load_error:
            body.error = state.load_error
        ok = state.status == "ready" and not state.shutting_down
        return JSONResponse(dump(body), status_code=200 if ok else 503)

    @v1.get("/models")
    async def models():
        state.ready_model()
        return dump(ModelList(object="list", data=[state.model_card()]))

    @v1.get("/models/{model_id:path}")
    async def model(model_id: str):
        state.ready_model()
        if model_id != state.model_id:
            raise APIError(
                404,
                f"The model {model_id!r} does not exist; this server has {state.model_id!r}",
                param="model",
                code="model_not_found",
            )
        return dump(state.model_card())

    @v1.post("/chat/completions")
    async def chat_completions(request: Request):
        return await _serve(state, request, chat=True)

    @v1.post("/completions")
    async def completions(request: Request):
        return await _serve(state, request, chat=False)

    app.include_router(v1)
    install_openapi(app)
    return app


# -- one request ----------------------------------------------------------------------------


async def _serve(state: ServerState, request: Request, chat: bool) -> Response:
    settings = state.settings
    body = await read_json(request, settings.max_body_bytes, settings.body_timeout)
    req = parse_request(ChatCompletionRequest if chat else CompletionRequest, body)
    state.ready_model()
    if req.model != state.model_id:
        raise APIError(
            400,
            f"The model {req.model!r} does not exist; this server has {state.model_id!r}",
            param="model",
            code="model_not_found",
        )
    _check_characters(state, req, chat)  # before tokenizing: megabytes take seconds
    # The tenant whose cross-request index the request drafts from: its API key (one tenant
    # without --api-key, whatever clients send).
    tenant = request.headers.get("authorization") if settings.api_key else None
    job_inputs = await run_in_threadpool(_prepare, state, req, chat, tenant)
    job = GenerationJob(
        **job_inputs, n=req.choices, logprobs=req.top_logprobs_count, wants_deltas=bool(req.stream)
    )
    try:
        state.worker.submit(job)
    except QueueFull:
        raise APIError(
            429,
            f"the server is busy ({settings.max_queue} requests already waiting); retry later",
            type="rate_limit_error",
            code="queue_full",
            headers={"Retry-After": str(state.worker.retry_after())},
        ) from None
    meta = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": state.model_id,
    }
    prediction_tokens = None  # (tokens) for usage.completion_tokens_details
    if req.prediction is not None:
        prediction_tokens = len(job_inputs["drafter_options"].get("reference_ids") or ())
    if req.stream:
        # The response (200) begins when the job starts: one still queued when the server
        # shuts down gets its 503 as JSON, as one refused when admitted gets its 400.
        started, _ = await _unless_disconnected(job.started(), job, request)
        if not started:
            return Response(status_code=499)
        writer = ChunkWriter(meta, chat, state.fingerprint, req.top_logprobs_count is not None)
        events = _sse_events(job, writer, req.choices, req.include_usage, prediction_tokens)
        return StreamingResponse(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    finished, choices = await _unless_disconnected(job.outcome(), job, request)
    if not finished:  # the client is gone; nobody reads this
        return Response(status_code=499)
    return JSONResponse(completion_body(meta, chat, choices, state.fingerprint, prediction_tokens))


def _check_characters(state: ServerState, req, chat: bool) -> None:
    """A 400 for a prompt (or prediction) with more characters than the context's tokens can
    hold (:attr:`ServerState.max_text_chars`), found without tokenizing it."""
    limit, context = state.max_text_chars, state.lm.target.max_context
    if chat:
        param, chars = "messages", sum(len(content_text(m.content)) for m in req.messages)
    else:
        param, chars = "prompt", len(req.prompt) if isinstance(req.prompt, str) else 0
    if chars > limit:
        raise APIError(
            400,
            f"This model's maximum context length is {context} tokens; the {param} "
            f"({chars} characters) cannot fit in it (at most {limit} characters)",
            param=param,
            code="context_length_exceeded",
        )
    if req.prediction is not None and len(content_text(req.prediction.content)) > limit:
        raise APIError(
            400,
            f"prediction: longer than this model's context can use (at most {limit} characters)",
            param="prediction",
        )


def _prepare(state: ServerState, req, chat: bool, tenant: str | None = None) -> dict:
    """Tokenize and check one request (runs on a thread): the :class:`GenerationJob` inputs,
    prompt lookup's with ``tenant``'s cross-request index (see ``--cross-request``)."""
    lm, context = state.lm, state.lm.target.max_context
    param = "messages" if chat else "prompt"
    # Long texts a chunk at a time, others' requests between chunks, only up to the context.
    texts = [content_text(m.content) for m in req.messages] if chat else [req.prompt]
    texts = [text for text in texts if isinstance(text, str)]
    lock = state.tokenizer_lock
    if sum(map(len, texts)) > CHUNK and bounded_ids(lm.tokenizer, lock, texts, context) is None:
        raise APIError(
            400,
            f"This model's maximum context length is {context} tokens; the {param} has more",
            param=param,
            code="context_length_exceeded",
        )
    reference_ids = None
    if req.prediction is not None:
        prediction = [content_text(req.prediction.content)]
        reference_ids = bounded_ids(lm.tokenizer, lock, prediction, context)
        if reference_ids is None:
            raise APIError(
                400,
                f"prediction: more tokens than this model's context of {context} can use",
                param="prediction",
            )
    with lock:
        try:
            prompt_ids = lm.encode([m.as_dict() for m in req.messages] if chat else req.prompt)
        except Exception as exc:  # the prompt's fault, incl. chat template (jinja2) errors?
            if not (
                isinstance(exc, (PromptLookupError, ValueError, TypeError))
                or type(exc).__module__.startswith("jinja2")
            ):
                raise
            empty = isinstance(exc, EmptyPromptError)
            raise APIError(
                400, str(exc) if empty else f"cannot encode the prompt: {exc}", param=param
            ) from None
    vocab = getattr(getattr(lm.model, "config", None), "vocab_size", None)
    if vocab and any(not 0 <= t < vocab for t in prompt_ids):
        raise APIError(400, f"prompt: token ids must be in [0, {vocab})", param="prompt")
    sampling = req.sampling()
    try:
        SamplingParams(
            sampling["temperature"],
            sampling["top_k"],
            sampling["top_p"],
            sampling["repetition_penalty"],
            sampling["seed"],
        )
    except PromptLookupError as exc:
        raise APIError(400, str(exc), param=str(exc).split()[0]) from None
    used = len(prompt_ids)
    max_new_tokens = req.requested_max_tokens
    if max_new_tokens is None:
        max_new_tokens = min(state.settings.default_max_tokens, context - used)
    if max_new_tokens < 1 or used + max_new_tokens > context:
        raise APIError(
            400,
            f"This model's maximum context length is {context} tokens; the "
            f"prompt has {used} tokens and max_tokens is {max_new_tokens}",
            param=param,
            code="context_length_exceeded",
        )
    drafter, options = state.settings.drafter, state.settings.drafter_options
    if reference_ids:
        lookup = {k: v for k, v in options.items() if k in LOOKUP_OPTIONS}
        drafter, options = "prompt-lookup", {**lookup, "reference_ids": reference_ids}
    # A prediction is the request's own draft material: no index beside it (its accepted
    # drafts are then what usage.completion_tokens_details counts).
    index = None if reference_ids else state.cross_request.for_tenant(tenant)
    if index is not None and _looks_up(drafter):
        options = {**options, "cross_request": index}
    return {
        "prompt_ids": prompt_ids,
        "max_new_tokens": max_new_tokens,
        "sampling": sampling,
        "drafter": drafter,
        "drafter_options": options,
        # The policy weighs the request's drafts with its tenant's history only.
        "generation_options": {**state.settings.generation_options, "tenant": tenant},
    }


def _looks_up(drafter) -> bool:
    """Whether a drafter spec has a prompt lookup member (which takes ``cross_request``)."""
    return isinstance(drafter, str) and any(
        name == "prompt-lookup" for name, _ in parse_drafter_spec(drafter)
    )


async def _unless_disconnected(waited, job: GenerationJob, request: Request):
    """``(True, result)`` of ``waited`` (one of the job's coroutines; its
    :class:`APIError` raised), or ``(False, None)`` and the job cancelled if the client
    disconnects first."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(waited)
    gone = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return True, task.result()
        return False, None
    finally:
        if not task.done() or task.cancelled():
            job.cancel()  # the client left (or this handler was cancelled) first
        task.cancel()
        gone.cancel()


async def _sse_events(
    job: GenerationJob, writer: ChunkWriter, n: int, include_usage: bool, prediction_tokens
):
    """The stream's server-sent events. If the client disconnects, Starlette cancels this
    generator; its ``finally`` cancels the job."""
    try:
        if writer.chat:
            for index in range(n):
                yield sse(writer.role(index))
        while True:
            kind, value = await job.events.get()
            if kind == "delta":
                index, text, infos = value
                if text or infos:
                    yield sse(writer.delta(index, text, infos))
            elif kind == "choice":
                yield sse(writer.finish(value.index, value.result.finish_reason))
            elif kind == "done":
                if include_usage:
                    yield sse(writer.usage(value, prediction_tokens))
                break
            else:
                error = (
                    value
                    if kind == "error"
                    else APIError(
                        503, "the generation was cancelled", type="server_error", code="cancelled"
                    )
                )
                yield sse_error(error)
                break
        yield "data: [DONE]\n\n"
    finally:
        job.cancel()  # no effect once the job has ended
