"""Server-sent events, one skeleton for every API: the encoding (:func:`sse`), keep-alives
while a job has nothing to send (:func:`keep_alive`, :func:`event_stream`), and the loop over
a job's events whose pieces each API writes in its own shape (:class:`APIEvents`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from fastapi.responses import StreamingResponse

from .request_base import APIError
from .tools import stream_pieces
from .worker import GenerationJob

if TYPE_CHECKING:
    from .state import ServerState


#: What an idle stream sends (an SSE comment, which clients skip): see ``--stream-keepalive``.
KEEP_ALIVE = ": keep-alive\n\n"


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def sse_error(error: APIError) -> str:
    return f"event: error\ndata: {json.dumps(error.body())}\n\n"


def event_stream(events, state: ServerState, ping: str = KEEP_ALIVE) -> StreamingResponse:
    """Server-sent ``events`` as the response, with ``ping`` (an SSE comment by default;
    Anthropic's ping event for its API) whenever no event has gone out for
    ``--stream-keepalive`` seconds (:func:`keep_alive`)."""
    seconds = state.settings.stream_keepalive
    if seconds:
        metrics = state.metrics
        events = keep_alive(events, ping, lambda: asyncio.sleep(seconds), metrics.kept_alive)
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def keep_alive(
    events: AsyncIterator[str],
    ping: str,
    idle: Callable[[], Awaitable],
    sent_ping: Callable[[], None] = lambda: None,
) -> AsyncIterator[str]:
    """``events``, and ``ping`` each time ``idle()`` (a new one after every event or ping:
    a timer, or in tests anything awaitable) ends before the next event comes. The next
    event is awaited across pings (never cancelled for one); when the stream is closed (the
    client left), ``events`` is closed too, so that its ``finally`` runs."""
    waiting = None  # the task getting the next event
    try:
        while True:
            waiting = waiting or asyncio.ensure_future(anext(events))
            timer = asyncio.ensure_future(idle())
            try:
                await asyncio.wait({waiting, timer}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                timer.cancel()
            if not waiting.done():
                sent_ping()
                yield ping
                continue
            try:
                event = waiting.result()
            except StopAsyncIteration:
                return
            waiting = None
            yield event
    finally:
        if waiting is not None and not waiting.done():
            waiting.cancel()  # raises CancelledError inside events, which ends it
            await asyncio.wait({waiting})
        await events.aclose()


class APIEvents:
    """One streamed answer in another API's events (:mod:`.anthropic.serving`, :mod:`.responses.serving`):
    the job's text deltas read through the request's tool format (``stream``, None without
    tools) into text, call and argument pieces, each a subclass's events. Subclasses write
    ``start``, ``text``, ``call``, ``arguments``, ``finish`` (the choice, its finish reason as
    the whole answer's), ``end`` and ``error``; and ``reasoning`` where ``splitter`` is set
    (a thinking model's reasoning, read apart first)."""

    stream = None  # a .tools.ToolStream where the request has tools
    splitter = None  # a .reasoning.ReasoningSplitter where the answer's reasoning is apart

    def feed(self, delta: str) -> str:
        """The events for a text delta of the answer: its reasoning (a subclass's
        ``reasoning``, :mod:`.reasoning`), then its text and calls."""
        events = ""
        if self.splitter is not None:
            thought, delta = self.splitter.feed(delta)
            events += self.reasoning(thought) if thought else ""
        for kind, *value in stream_pieces(self.stream, delta):
            events += getattr(self, kind)(*value)
        return events

    def held(self) -> str:
        """The events for the text the reasoning splitter held back, once the answer ends."""
        if self.splitter is None:
            return ""
        thought, text = self.splitter.finish()
        events = self.reasoning(thought) if thought else ""
        return events + "".join(getattr(self, k)(*v) for k, *v in stream_pieces(self.stream, text))

    def reason(self, choice) -> str:
        """The choice's finish reason, as the whole answer's (calls cut are ``length``)."""
        reason = choice.result.finish_reason
        return reason if self.stream is None else self.stream.finish_reason(reason)

    async def events(self, job: GenerationJob):
        try:
            yield self.start()
            while True:
                kind, value = await job.events.get()
                if kind == "started":  # a stream begun while its job was queued
                    continue
                if kind == "delta":
                    if events := self.feed(value[1]):
                        yield events
                elif kind == "choice":
                    yield self.held() + self.finish(value)
                elif kind == "done":
                    if events := self.end():
                        yield events
                    break
                else:
                    cancelled = APIError(503, "the generation was cancelled")
                    yield self.error(value if kind == "error" else cancelled)
                    break
        finally:
            job.cancel()  # no effect once the job has ended
