"""OpenAI's chat completions and completions, ``POST /v1/chat/completions`` and
``POST /v1/completions``: a request (:mod:`.protocol`) becomes a job (:func:`..serving.start_job`),
its answer OpenAI's body or chunks (:mod:`.answers`)."""

from __future__ import annotations

import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from .. import reasoning
from ..reasoning import Thinking
from ..request_base import APIError, parse_request, read_json
from ..serving import start_job, started_soon, unless_disconnected
from ..state import ServerState
from ..streams import event_stream, sse, sse_error
from ..tools import ToolPlan, ToolStream
from ..worker import GenerationJob
from .answers import ChunkWriter, completion_body
from .protocol import ChatCompletionRequest, CompletionRequest


async def serve_completions(state: ServerState, request: Request, chat: bool) -> Response:
    settings = state.settings
    body = await read_json(request, settings.max_body_bytes, settings.body_timeout)
    req = parse_request(ChatCompletionRequest if chat else CompletionRequest, body)
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
        writer = ChunkWriter(meta, chat, state.fingerprint, req.top_logprobs_count is not None)
        events = chunk_events(
            job, writer, req.choices, req.include_usage, prediction_tokens, tools, thinking
        )
        return event_stream(events, state)
    finished, choices = await unless_disconnected(job.outcome(), job, request)
    if not finished:  # the client is gone; nobody reads this
        return Response(status_code=499)
    body = completion_body(
        meta, chat, choices, state.fingerprint, prediction_tokens, tools, thinking
    )
    return JSONResponse(body)


async def chunk_events(
    job: GenerationJob,
    writer: ChunkWriter,
    n: int,
    include_usage: bool,
    prediction_tokens,
    tools: ToolPlan | None = None,
    thinking: Thinking | None = None,
):
    """The stream's server-sent events (with ``tools``, each choice's text read into content
    and tool call deltas as it comes, :class:`.tools.ToolStream`; with ``thinking``, its
    reasoning first, as ``reasoning_content`` deltas). If the client disconnects,
    Starlette cancels this generator; its ``finally`` cancels the job."""
    streams = [ToolStream(tools.template) for _ in range(n)] if tools else None
    splitters = [thinking.splitter() for _ in range(n)] if thinking else None
    try:
        if writer.chat:
            for index in range(n):
                yield sse(writer.role(index))
        while True:
            kind, value = await job.events.get()
            if kind == "started":  # a stream begun while its job was queued
                continue
            if kind == "delta":
                index, text, infos = value
                if splitters is not None:  # the reasoning apart (.reasoning)
                    thought, text = splitters[index].feed(text)
                    if thought:
                        yield sse(writer.reasoning(index, thought, None if text else infos))
                        infos = infos if text else None
                calls = []
                if streams is not None:
                    text, calls = streams[index].feed(text)
                if calls and text:  # the text before a call, then the call
                    yield sse(writer.delta(index, text, None))
                if calls:
                    yield sse(writer.tool_calls(index, calls, infos))
                elif text or infos:
                    yield sse(writer.delta(index, text, infos))
            elif kind == "choice":
                if splitters is not None:  # what the splitter held back, as it stands
                    thought, text = splitters[value.index].finish()
                    if thought:
                        yield sse(writer.reasoning(value.index, thought))
                    if streams is not None and text:
                        text, _ = streams[value.index].feed(text)  # (no call: too short)
                    if text:
                        yield sse(writer.delta(value.index, text, None))
                finish_reason = value.result.finish_reason
                if streams is not None:
                    finish_reason = streams[value.index].finish_reason(finish_reason)
                yield sse(writer.finish(value.index, finish_reason))
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
