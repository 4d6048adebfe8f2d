"""Anthropic's Messages API, ``POST /v1/messages``: text, ``tool_use`` and ``tool_result``
blocks, and its streaming events.

A request is validated in Anthropic's shape (:class:`.protocol.MessagesRequest`),
then said again as a chat completions request (its ``as_chat``) and served by the same path
(:func:`.serving.start_job`), so tools go through the chat template's format or the generic
one, and its grammar (:mod:`.tool_template`, :mod:`.tools`). The
answer is written back as content blocks (a thinking model's reasoning first, in a
``thinking`` block, :mod:`..reasoning`); a stream is ``message_start``, per block
``content_block_start``/``content_block_delta`` (``text_delta``, ``input_json_delta``, or
a thinking block's ``thinking_delta`` then ``signature_delta``)/``content_block_stop``, then
``message_delta`` (stop reason, output tokens) and ``message_stop``. Errors are Anthropic's JSON,
``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import json
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from .. import reasoning
from ..bodies import dump
from ..reading import Answer, read_choice
from ..reasoning import Thinking
from ..request_base import APIError, read_json
from ..serving import count_tokens, in_own_terms, parse_as_chat, serve_as_chat
from ..streams import APIEvents, event_stream
from ..tools import ToolPlan
from .bodies import (
    AnthropicError,
    AnthropicErrorDetail,
    AnthropicMessage,
    ContentBlock,
    MessageTokenCount,
    MessageUsage,
    OutputTextBlock,
    OutputThinkingBlock,
    OutputToolUseBlock,
)
from .protocol import MessagesRequest

#: Anthropic's error type for each status.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def error_body(error: APIError) -> dict:
    kind = ERROR_TYPES.get(error.status, "api_error")
    return dump(
        AnthropicError(type="error", error=AnthropicErrorDetail(type=kind, message=error.message))
    )


async def serve_messages(state, request: Request) -> Response:
    """``POST /v1/messages`` (see the module doc)."""
    try:
        _, req, job, finished, choices = await serve_as_chat(state, request, MessagesRequest)
    except APIError as error:
        return JSONResponse(error_body(error), error.status, headers=error.headers)
    if not finished:  # the client is gone; nobody reads this
        return Response(status_code=499)
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    tools = req.tool_plan(state.tool_template)
    thinking = reasoning.for_request(state, job.prompt_ids)
    if req.stream:
        prompt, cache = job.prompt_ids, state.prefix_cache
        # The prompt tokens the prefix cache holds as the stream begins (its prefill to come).
        tenant = getattr(request.state, "tenant", None)
        cached = cache.held(prompt[:-1], tenant) if cache is not None else 0
        writer = EventWriter(message_id, state.model_id, len(prompt), tools, cached, thinking)
        return event_stream(writer.events(job), state, PING)
    answer = read_choice(choices[0], tools, thinking)
    reason = STOP_REASONS.get(answer.finish_reason, "end_turn")
    message = _message(message_id, state.model_id, _blocks(answer), reason, _usage(answer))
    return JSONResponse(dump(message))


def _blocks(answer: Answer) -> list[ContentBlock]:
    """The answer's content: a thinking model's reasoning, its text (an empty one where it
    has neither reasoning nor calls), its calls; a stream sends the same blocks."""
    blocks: list[ContentBlock] = [] if answer.reasoning is None else [_thinking(answer.reasoning)]
    blocks += [_text(answer.content)] if answer.content or not (blocks or answer.calls) else []
    for call in answer.calls:
        function = call["function"]
        arguments = json.loads(function["arguments"])
        blocks.append(_tool_use(call["id"], function["name"], arguments))
    return blocks


def _text(text: str) -> OutputTextBlock:
    return OutputTextBlock(type="text", text=text)


def _tool_use(call_id: str, name: str, arguments: dict) -> OutputToolUseBlock:
    return OutputToolUseBlock(type="tool_use", id=call_id, name=name, input=arguments)


def _message(
    message_id: str, model: str, blocks: list, reason, usage: MessageUsage
) -> AnthropicMessage:
    return AnthropicMessage(
        id=message_id,
        type="message",
        role="assistant",
        model=model,
        content=blocks,
        stop_reason=reason,
        stop_sequence=None,
        usage=usage,
    )


#: The ``signature`` of a thinking block: nothing is signed here (and a signature sent back
#: is not checked).
SIGNATURE = ""


def _thinking(text: str) -> OutputThinkingBlock:
    """A thinking model's reasoning as a ``thinking`` block (:mod:`..reasoning`)."""
    return OutputThinkingBlock(type="thinking", thinking=text, signature=SIGNATURE)


def _usage(answer: Answer) -> MessageUsage:
    """Anthropic's counts: the prompt tokens the prefix cache held are
    ``cache_read_input_tokens``, the others ``input_tokens`` (their sum is the prompt)."""
    return MessageUsage(
        input_tokens=answer.prompt_tokens - answer.cached_tokens,
        cache_read_input_tokens=answer.cached_tokens,
        output_tokens=answer.output_tokens,
    )


async def count_message_tokens(state, request: Request) -> Response:
    """``POST /v1/messages/count_tokens``: ``{"input_tokens": n}``, the prompt a
    ``/v1/messages`` request of the same body would have (system, messages, tools), nothing
    generated; ``max_tokens`` is not needed."""
    try:
        settings = state.settings
        body = await read_json(
            request, settings.max_body_bytes, settings.body_timeout, state.max_pieces
        )
        if isinstance(body, dict):
            body = {"max_tokens": 1, **body, "stream": False}
        try:
            _, req = await run_in_threadpool(parse_as_chat, MessagesRequest, body)
            count = MessageTokenCount(input_tokens=await count_tokens(state, req))
        except APIError as error:
            raise in_own_terms(error, MessagesRequest) from None
        return JSONResponse(dump(count))
    except APIError as error:
        return JSONResponse(error_body(error), error.status, headers=error.headers)


def _event(kind: str, data: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


#: Anthropic's keep-alive event, which may come anywhere after ``message_start`` (the first
#: event, sent when the stream opens): see ``--stream-keepalive``.
PING = _event("ping", {})


class EventWriter(APIEvents):
    """The events of one streamed message: content blocks opened and closed as the answer's
    text and tool calls come (:class:`.reading.ToolStream` reads the tool format)."""

    def __init__(
        self,
        message_id: str,
        model: str,
        prompt_tokens: int,
        tools: ToolPlan | None,
        cached: int = 0,
        thinking: Thinking | None = None,
    ) -> None:
        """``cached``: how many of the prompt's tokens the prefix cache holds; ``thinking``:
        the answer's reasoning is apart, in a ``thinking`` block."""
        usage = MessageUsage(
            input_tokens=prompt_tokens - cached, cache_read_input_tokens=cached, output_tokens=0
        )
        self.message = dump(_message(message_id, model, [], None, usage))
        super().__init__(tools, 1, thinking)
        self.index, self.open = -1, None  # the current block's index and type

    def _start(self, block: ContentBlock) -> str:
        events = self._stop()
        self.index, self.open = self.index + 1, block.type
        data = {"index": self.index, "content_block": dump(block)}
        return events + _event("content_block_start", data)

    def _stop(self) -> str:
        if self.open is None:
            return ""
        events = ""
        if self.open == "thinking":  # its signature last, as Anthropic streams it
            events = self._delta({"type": "signature_delta", "signature": SIGNATURE})
        self.open = None
        return events + _event("content_block_stop", {"index": self.index})

    def _delta(self, delta: dict) -> str:
        return _event("content_block_delta", {"index": self.index, "delta": delta})

    def reasoning(self, piece: str) -> str:
        events = "" if self.open == "thinking" else self._start(_thinking(""))
        return events + (
            self._delta({"type": "thinking_delta", "thinking": piece}) if piece else ""
        )

    def text(self, piece: str) -> str:
        events = "" if self.open == "text" else self._start(_text(""))
        return events + self._delta({"type": "text_delta", "text": piece})

    def call(self, call_id: str, name: str) -> str:
        return self._start(_tool_use(call_id, name, {}))

    def arguments(self, piece: str) -> str:
        return self._delta({"type": "input_json_delta", "partial_json": piece})

    def start(self) -> str:
        return _event("message_start", {"message": self.message})

    def finish(self, index: int, answer: Answer) -> str:
        # An empty answer (no reasoning, text or calls) still has its text block.
        events = self._start(_text("")) if self.index < 0 else ""
        reason = STOP_REASONS.get(answer.finish_reason, "end_turn")
        delta = {"stop_reason": reason, "stop_sequence": None}
        data = {"delta": delta, "usage": dump(_usage(answer))}
        return events + self._stop() + _event("message_delta", data)

    def end(self, choices) -> str:
        return _event("message_stop", {})

    def error(self, error: APIError) -> str:
        return _event("error", {"error": error_body(error)["error"]})
