"""OpenAI's chat completions and completions, ``POST /v1/chat/completions`` and
``POST /v1/completions``: a request (:mod:`.protocol`) becomes a job (:func:`..serving.start_job`),
its answer OpenAI's body or chunks (:mod:`.answers`)."""

from __future__ import annotations

import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from .. import reasoning
from ..request_base import parse_request, read_json
from ..serving import start_job, started_soon, unless_disconnected
from ..state import ServerState
from ..streams import event_stream
from .answers import ChunkEvents, completion_body
from .protocol import ChatCompletionRequest, CompletionRequest


async def serve_completions(state: ServerState, request: Request, chat: bool) -> Response:
    settings = state.settings
    body = await read_json(
        request, settings.max_body_bytes, settings.body_timeout, state.max_pieces
    )
    # Validated on a thread (as parse_as_chat): the event loop serves other streams meanwhile.
    shape = ChatCompletionRequest if chat else CompletionRequest
    req = await run_in_threadpool(parse_request, shape, body)
    job = await start_job(state, request, req, chat)
    meta = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": state.model_id,
    }
    prediction_tokens = None  # (tokens) for usage.completion_tokens_details
    if req.prediction is not None:
        prediction_tokens = len(job.drafter_options.get("reference_ids") or ())
    # The answer is read back into tool calls in the plan's format.
    tools = req.tool_plan(state.tool_template) if chat else None
    thinking = reasoning.for_request(state, job.prompt_ids, req) if chat else None
    if req.stream:
        # The response (200) begins when the job starts: one still queued when the server
        # shuts down gets its 503 as JSON, as one refused when admitted gets its 400.
        started, _ = await unless_disconnected(started_soon(job, state), job, request)
        if not started:
            return Response(status_code=499)
        logprobs = req.top_logprobs_count is not None
        chunks = ChunkEvents(
            meta,
            chat,
            state.fingerprint,
            logprobs,
            tools,
            req.choices,
            include_usage=req.include_usage,
            prediction_tokens=prediction_tokens,
            thinking=thinking,
        )
        return event_stream(chunks.events(job), state, chunks.keep_alive())
    finished, choices = await unless_disconnected(job.outcome(), job, request)
    if not finished:  # the client is gone; nobody reads this
        return Response(status_code=499)
    body = completion_body(
        meta, chat, choices, state.fingerprint, prediction_tokens, tools, thinking
    )
    return JSONResponse(body)
