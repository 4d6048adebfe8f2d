"""OpenAI's Responses API, ``POST /v1/responses``: text, function calls and structured output
(``text.format``), whole or streamed as its events.

A request is validated in its own shape (:class:`.protocol.ResponsesRequest`),
said again as a chat completions request and served by the same path (:func:`.serving.start_job`),
so tools go through the chat template's format or the generic one, and its grammar. The
answer is a ``response`` object whose ``output`` holds a thinking model's ``reasoning`` item
(its text as ``reasoning_text`` content, :mod:`..reasoning`), a ``message`` item (its
``output_text``) and ``function_call`` items; ``usage`` counts the prompt's tokens the prefix
cache held as ``input_tokens_details.cached_tokens``. A stream sends ``response.created`` and
``response.in_progress``, then per item ``response.output_item.added``, its deltas
(``response.reasoning_text.delta``, ``response.output_text.delta`` inside a
``content_part``, or ``response.function_call_arguments.delta``) and its ``.done`` events, then
``response.completed`` (``response.incomplete`` when ``max_output_tokens`` cut it). Errors are
OpenAI's JSON; once a stream has begun, an ``error`` event.
"""

from __future__ import annotations

import json
import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from .. import reasoning
from ..bodies import dump
from ..reading import Answer, read_choice
from ..reasoning import Thinking
from ..request_base import APIError
from ..serving import serve_as_chat
from ..streams import APIEvents, event_stream
from ..tools import ToolPlan
from . import bodies as R
from .protocol import ResponsesRequest


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


async def serve_responses(state, request: Request) -> Response:
    """``POST /v1/responses`` (see the module doc); an :class:`APIError` is the app's to answer."""
    asked, req, job, finished, choices = await serve_as_chat(state, request, ResponsesRequest)
    if not finished:  # the client is gone; nobody reads this
        return Response(status_code=499)
    tools = req.tool_plan(state.tool_template)
    thinking = reasoning.for_request(state, job.prompt_ids)
    shell, spaces = _shell(state.model_id, asked), asked.namespaces()
    if req.stream:
        return event_stream(ResponseEvents(shell, tools, spaces, thinking).events(job), state)
    answer = read_choice(choices[0], tools, thinking)
    return JSONResponse(dump(_finished(shell, output_items(answer, spaces), answer)))


def output_items(answer: Answer, spaces: dict[str, str]) -> list[R.OutputItem]:
    """A whole answer's output: a thinking model's reasoning, its message (an empty one where
    it has neither reasoning nor calls), its calls (in their ``namespace`` where ``spaces``
    names one); a stream sends the same items."""
    output: list[R.OutputItem] = [] if answer.reasoning is None else [_reasoning(answer.reasoning)]
    output += [_message(answer.content)] if answer.content or not (output or answer.calls) else []
    for call in answer.calls:
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        output.append(_call(call["id"], name, arguments, namespace=spaces.get(name)))
    return output


def _shell(model: str, asked: ResponsesRequest) -> R.ResponseObject:
    """The response object before its output: the request's settings said back."""
    choice = asked.tool_choice
    text_format = asked.text.format if asked.text is not None else None
    return R.ResponseObject(
        id=_id("resp"),
        object="response",
        created_at=int(time.time()),
        status="in_progress",
        error=None,
        incomplete_details=None,
        instructions=asked.instructions,
        max_output_tokens=asked.max_output_tokens,
        model=model,
        output=[],
        parallel_tool_calls=asked.parallel_tool_calls is not False,
        previous_response_id=None,
        temperature=1.0 if asked.temperature is None else asked.temperature,
        top_p=1.0 if asked.top_p is None else asked.top_p,
        tool_choice=choice.model_dump() if hasattr(choice, "model_dump") else choice or "auto",
        tools=[tool.model_dump(exclude_none=True) for tool in asked.tools or ()],
        text=R.ResponseText(
            format=text_format.model_dump(by_alias=True, exclude_none=True)
            if text_format is not None
            else {"type": "text"}
        ),
        store=False,
        usage=None,
    )


def _message(text: str, status: str = "completed") -> R.ResponseOutputMessage:
    part = R.ResponseOutputText(type="output_text", text=text, annotations=[])
    return R.ResponseOutputMessage(
        type="message", id=_id("msg"), status=status, role="assistant", content=[part]
    )


def _reasoning(text: str, status: str = "completed") -> R.ResponseReasoning:
    """A thinking model's reasoning as a ``reasoning`` item: its text as ``reasoning_text``
    content, no summary (:mod:`..reasoning`)."""
    part = R.ResponseReasoningText(type="reasoning_text", text=text)
    return R.ResponseReasoning(
        type="reasoning", id=_id("rs"), summary=[], content=[part], status=status
    )


def _call(
    call_id: str, name: str, arguments: str, status: str = "completed", namespace=None
) -> R.ResponseFunctionCall:
    """A ``function_call`` item; a namespace tool's (Codex's) says its ``namespace``."""
    call = R.ResponseFunctionCall(
        type="function_call",
        id=_id("fc"),
        call_id=call_id,
        name=name,
        arguments=arguments,
        status=status,
    )
    if namespace is not None:
        call.namespace = namespace
    return call


def _finished(shell: R.ResponseObject, output: list, answer: Answer) -> R.ResponseObject:
    """The response once its answer is in: ``incomplete`` when ``max_output_tokens`` cut it."""
    cut = answer.finish_reason == "length"
    usage = R.ResponseUsage(
        input_tokens=answer.prompt_tokens,
        input_tokens_details=R.InputTokensDetails(cached_tokens=answer.cached_tokens),
        output_tokens=answer.output_tokens,
        output_tokens_details=R.OutputTokensDetails(reasoning_tokens=0),
        total_tokens=answer.prompt_tokens + answer.output_tokens,
    )
    incomplete = R.IncompleteDetails(reason="max_output_tokens") if cut else None
    return shell.model_copy(
        update={
            "status": "incomplete" if cut else "completed",
            "incomplete_details": incomplete,
            "output": output,
            "usage": usage,
        }
    )


class ResponseEvents(APIEvents):
    """The events of one streamed response: output items opened and closed as the answer's
    text and calls come (:class:`.reading.ToolStream` reads the tool format)."""

    def __init__(
        self,
        shell: R.ResponseObject,
        tools: ToolPlan | None,
        spaces: dict[str, str],
        thinking: Thinking | None = None,
    ) -> None:
        super().__init__(tools, 1, thinking)
        self.shell, self.spaces = shell, spaces
        self.items: list[R.OutputItem] = []
        self.number = 0  # the next event's sequence_number

    def _event(self, kind: str, data: dict) -> str:
        data = {"type": kind, **data, "sequence_number": self.number}
        self.number += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def _where(self) -> dict:
        return {"item_id": self.items[-1].id, "output_index": len(self.items) - 1}

    def _open(self, item: R.OutputItem) -> str:
        events = self._close()
        self.items.append(item)
        data = {"output_index": len(self.items) - 1, "item": dump(item)}
        events += self._event("response.output_item.added", data)
        if item.type == "message":
            part = dump(item.content[0])
            data = {**self._where(), "content_index": 0, "part": part}
            events += self._event("response.content_part.added", data)
        return events

    def _close(self) -> str:
        """The ``.done`` events of the open item, if any."""
        if not self.items or self.items[-1].status == "completed":
            return ""
        item, where = self.items[-1], self._where()
        item.status = "completed"
        if item.type == "message":
            part = item.content[0]
            data = {**where, "content_index": 0, "text": part.text}
            events = self._event("response.output_text.done", data)
            data = {**where, "content_index": 0, "part": dump(part)}
            events += self._event("response.content_part.done", data)
        elif item.type == "reasoning":
            data = {**where, "content_index": 0, "text": item.content[0].text}
            events = self._event("response.reasoning_text.done", data)
        else:
            data = {**where, "arguments": item.arguments}
            events = self._event("response.function_call_arguments.done", data)
        data = {"output_index": where["output_index"], "item": dump(item)}
        return events + self._event("response.output_item.done", data)

    def reasoning(self, piece: str) -> str:
        last = self.items[-1] if self.items else None
        opened = last is not None and last.type == "reasoning" and last.status != "completed"
        events = "" if opened else self._open(_reasoning("", status="in_progress"))
        self.items[-1].content[0].text += piece
        data = {**self._where(), "content_index": 0, "delta": piece}
        return events + (self._event("response.reasoning_text.delta", data) if piece else "")

    def text(self, piece: str) -> str:
        last = self.items[-1] if self.items else None
        opened = last is not None and last.type == "message" and last.status != "completed"
        events = "" if opened else self._open(_message("", status="in_progress"))
        self.items[-1].content[0].text += piece
        data = {**self._where(), "content_index": 0, "delta": piece}
        return events + self._event("response.output_text.delta", data)

    def call(self, call_id: str, name: str) -> str:
        return self._open(_call(call_id, name, "", "in_progress", self.spaces.get(name)))

    def arguments(self, piece: str) -> str:
        self.items[-1].arguments += piece
        data = {**self._where(), "delta": piece}
        return self._event("response.function_call_arguments.delta", data)

    def start(self) -> str:
        shell = dump(self.shell)
        created = self._event("response.created", {"response": shell})
        return created + self._event("response.in_progress", {"response": shell})

    def finish(self, index: int, answer: Answer) -> str:
        # An empty answer (no reasoning, text or calls) still has its message.
        events = self._open(_message("", status="in_progress")) if not self.items else ""
        events += self._close()
        done = _finished(self.shell, self.items, answer)
        name = "response.incomplete" if done.status == "incomplete" else "response.completed"
        return events + self._event(name, {"response": dump(done)})

    def error(self, error: APIError) -> str:
        body = {"code": error.code, "message": error.message, "param": error.param}
        return self._event("error", body)
