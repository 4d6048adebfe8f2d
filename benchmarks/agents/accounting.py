"""What one request and its answer amount to, read from their bodies without keeping any of
their text: the API, the counts of messages and tools, the ids of the tool results the agent
sends back, and from the answer its usage (prompt, cached and generated tokens), the tool calls
the model made and the error's one line. Pure functions over bytes, for the proxy."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

#: Generation endpoints by API; a request to one of them is a model turn.
TURN_PATHS = {
    "/v1/chat/completions": "chat",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
}
#: How long an error line may be in the records (the server's own text, never the agent's).
ERROR_CHARS = 300


def answered(record: dict) -> bool:
    """Whether a proxy record of a generation endpoint is a model turn answered: status 200,
    and the answer read to the end or its final event (its finish reason, stop reason or
    status) read before the client left (Codex closes a stream once it has
    ``response.completed``, before the server ends it)."""
    finished = (record.get("answer") or {}).get("finish") is not None
    return record.get("status") == 200 and (finished or not record.get("client_closed"))


def api_of(path: str) -> str | None:
    """The API of a generation endpoint (``chat``, ``messages``, ``responses``), else None."""
    return TURN_PATHS.get(path.split("?", 1)[0].rstrip("/"))


@dataclass
class RequestShape:
    """A request body's shape: sizes and kinds, no text."""

    model: str | None = None
    stream: bool = False
    messages: int = 0  # messages (chat, Messages) or input items (Responses)
    tools: int = 0
    tool_types: dict[str, int] = field(default_factory=dict)  # "function": 12, "web_search": 1
    tool_result_ids: list[str] = field(default_factory=list)  # results the agent sends back
    tool_errors: int = 0  # results the agent marked as errors (Messages' is_error)
    body_bytes: int = 0


def request_shape(api: str | None, body: bytes) -> RequestShape:
    """Read ``body`` (JSON) of a request to ``api``; an unreadable body gives a bare shape."""
    shape = RequestShape(body_bytes=len(body))
    try:
        data = json.loads(body) if body else {}
    except (ValueError, UnicodeDecodeError):
        return shape
    if not isinstance(data, dict):
        return shape
    shape.model = data.get("model") if isinstance(data.get("model"), str) else None
    shape.stream = data.get("stream") is True
    tools = data.get("tools") if isinstance(data.get("tools"), list) else []
    shape.tools = len(tools)
    shape.tool_types = dict(
        Counter(str(t.get("type", "function")) for t in tools if isinstance(t, dict))
    )
    items = data.get("input" if api == "responses" else "messages")
    items = items if isinstance(items, list) else []
    shape.messages = len(items)
    for item in (i for i in items if isinstance(i, dict)):
        if api == "chat" and item.get("role") == "tool":
            shape.tool_result_ids.append(str(item.get("tool_call_id")))
        elif api == "responses" and str(item.get("type", "")).endswith("_call_output"):
            shape.tool_result_ids.append(str(item.get("call_id")))
        elif api == "messages" and isinstance(item.get("content"), list):
            for block in item["content"]:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    shape.tool_result_ids.append(str(block.get("tool_use_id")))
                    shape.tool_errors += block.get("is_error") is True
    return shape


@dataclass
class AnswerShape:
    """An answer's usage, tool calls and error, no text."""

    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    tool_calls: dict[str, str] = field(default_factory=dict)  # call id -> tool name
    finish: str | None = None
    error: str | None = None
    events: int = 0  # server-sent events (a stream)
    keepalives: int = 0  # SSE comments and ping events: the server saying it is working


def _usage(api: str | None, usage: dict, answer: AnswerShape) -> None:
    """Fold one usage object of ``api``'s shape into ``answer`` (later values win)."""
    if not isinstance(usage, dict):
        return
    if api == "messages":
        read = usage.get("cache_read_input_tokens")
        fresh = usage.get("input_tokens")
        if isinstance(fresh, int):
            made = usage.get("cache_creation_input_tokens") or 0
            answer.prompt_tokens = fresh + (read or 0) + made
        if isinstance(read, int):
            answer.cached_tokens = read
        if isinstance(usage.get("output_tokens"), int):
            answer.completion_tokens = usage["output_tokens"]
        return
    prompt_key, done_key, details_key = (
        ("input_tokens", "output_tokens", "input_tokens_details")
        if api == "responses"
        else ("prompt_tokens", "completion_tokens", "prompt_tokens_details")
    )
    if isinstance(usage.get(prompt_key), int):
        answer.prompt_tokens = usage[prompt_key]
    if isinstance(usage.get(done_key), int):
        answer.completion_tokens = usage[done_key]
    details = usage.get(details_key)
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        answer.cached_tokens = details["cached_tokens"]


def _error_line(data: dict) -> str | None:
    error = data.get("error", data)
    if isinstance(error, dict):
        error = error.get("message") or error.get("type")
    if error is None and "detail" in data:  # FastAPI's shape
        error = data["detail"]
    return None if error is None else str(error)[:ERROR_CHARS]


def fold_object(api: str | None, data: dict, answer: AnswerShape) -> None:
    """Fold one JSON object (a whole answer, or one stream event) into ``answer``."""
    kind = data.get("type")
    if kind == "error" or (kind is None and "error" in data) or kind == "response.failed":
        answer.error = _error_line(data.get("response", data) if kind else data)
    if kind == "ping":
        answer.keepalives += 1
    # Chat completions: a whole answer or a chunk.
    for choice in data.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        message = choice.get("message") or choice.get("delta") or {}
        for call in message.get("tool_calls") or []:
            if isinstance(call, dict) and call.get("id"):
                name = (call.get("function") or {}).get("name")
                answer.tool_calls[str(call["id"])] = str(name)
        if choice.get("finish_reason"):
            answer.finish = str(choice["finish_reason"])
    if "usage" in data and data["usage"]:
        _usage(api, data["usage"], answer)
    timings = data.get("timings")  # llama-server's own account of the prompt cache
    if isinstance(timings, dict) and answer.cached_tokens is None and "cache_n" in timings:
        answer.cached_tokens = timings["cache_n"]
    # Messages: a whole answer's content, or a stream's events.
    blocks = list(data.get("content") or []) if kind == "message" else []
    if kind == "content_block_start":
        blocks.append(data.get("content_block") or {})
    for block in blocks:
        if isinstance(block, dict) and block.get("type") in ("tool_use", "server_tool_use"):
            answer.tool_calls[str(block.get("id"))] = str(block.get("name"))
    if kind == "message" and data.get("stop_reason"):
        answer.finish = str(data["stop_reason"])
    if kind == "message_start":
        _usage(api, (data.get("message") or {}).get("usage"), answer)
    if kind == "message_delta":
        _usage(api, data.get("usage") or {}, answer)
        answer.finish = (data.get("delta") or {}).get("stop_reason") or answer.finish
    # Responses: a whole response, or its stream's events.
    if kind == "response" or kind in ("response.completed", "response.incomplete"):
        response = data if kind == "response" else data.get("response") or {}
        _usage(api, response.get("usage"), answer)
        answer.finish = str(response.get("status")) if response.get("status") else answer.finish
        for item in response.get("output") or []:
            _response_item(item, answer)
    if kind in ("response.output_item.added", "response.output_item.done"):
        _response_item(data.get("item") or {}, answer)
    if kind is None and data.get("object") == "response":
        fold_object(api, {**data, "type": "response"}, answer)


def _response_item(item: dict, answer: AnswerShape) -> None:
    if isinstance(item, dict) and str(item.get("type", "")).endswith("_call"):
        call_id = item.get("call_id") or item.get("id")
        answer.tool_calls[str(call_id)] = str(item.get("name") or item.get("type"))


def answer_shape(api: str | None, status: int, content_type: str, body: bytes) -> AnswerShape:
    """Read a whole answer: JSON, or server-sent events (``text/event-stream``)."""
    answer = AnswerShape()
    if "text/event-stream" in content_type:
        reader = EventReader(api, answer)
        reader.feed(body)
        reader.close()
    else:
        try:
            data = json.loads(body) if body else None
        except (ValueError, UnicodeDecodeError):
            data = None
        if isinstance(data, dict):
            fold_object(api, data, answer)
    if status >= 400 and answer.error is None:
        answer.error = body[:ERROR_CHARS].decode("utf-8", "replace") or f"HTTP {status}"
    return answer


class EventReader:
    """Server-sent events fed in pieces as they arrive, each event folded into an answer."""

    def __init__(self, api: str | None, answer: AnswerShape) -> None:
        self.api, self.answer, self.pending = api, answer, b""

    def feed(self, data: bytes) -> None:
        self.pending += data.replace(b"\r\n", b"\n")
        while b"\n\n" in self.pending:
            event, self.pending = self.pending.split(b"\n\n", 1)
            self._event(event)

    def close(self) -> None:
        if self.pending.strip():
            self._event(self.pending)
        self.pending = b""

    def _event(self, event: bytes) -> None:
        lines = event.decode("utf-8", "replace").split("\n")
        if lines and all(line.startswith(":") for line in lines if line):
            self.answer.keepalives += 1  # a comment: a keep-alive
            return
        payload = "\n".join(line[5:].lstrip() for line in lines if line.startswith("data:"))
        if not payload or payload == "[DONE]":
            return
        self.answer.events += 1
        try:
            data = json.loads(payload)
        except ValueError:
            return
        if isinstance(data, dict):
            fold_object(self.api, data, self.answer)
