"""Server-sent events, one skeleton for every API: the encoding (:func:`sse`), keep-alives
while a job has nothing to send (:func:`keep_alive`, :func:`event_stream`), and the loop over
a job's events whose pieces each API writes in its own shape (:class:`APIEvents`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from fastapi.responses import StreamingResponse

from .reading import ToolStream, read_choice, stream_pieces
from .reasoning import Thinking
from .request_base import APIError
from .tools import ToolPlan
from .worker import GenerationJob, cancelled

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
    Anthropic's ping event for its API, an empty chat completions chunk for chat) whenever no
    event has gone out for ``--stream-keepalive`` seconds (:func:`keep_alive`)."""
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
    """One streamed answer in an API's events, one loop (:meth:`events`) over a job's events
    for every API (:mod:`.openai.answers`, :mod:`.anthropic.serving`,
    :mod:`.responses.serving`), whose hooks each API writes in its own shape:

    - ``start()``: the events that open the stream (sent at once);
    - ``delta(index, text, infos)``: a text delta of choice ``index`` (with its tokens'
      logprobs, ``infos``; ``text`` None: the choice has ended, and what was held back goes
      out); by default read into pieces (:meth:`pieces`), each a hook of its own:
      ``reasoning(piece)`` (a thinking model's, :mod:`.reasoning`), ``text(piece)``,
      ``call(id, name)`` and ``arguments(piece)``. A new kind of piece is a new hook of that
      name;
    - ``finish(index, answer)``: a choice has ended (:func:`.reading.read_choice`: its finish
      reason as the whole answer's, its token counts);
    - ``end(choices)``: the job is done; ``error(error)``: it ended with an
      :class:`APIError` (a cancelled job with :func:`.worker.cancelled`'s);
    - ``last``: what follows the last event (OpenAI's ``data: [DONE]``).

    Each hook returns the events' text (empty: nothing to send)."""

    last = ""

    def __init__(self, plan: ToolPlan | None, n: int = 1, thinking: Thinking | None = None) -> None:
        """``plan``: how the request may call tools (None: all text); ``n``: its choices;
        ``thinking``: the answer's reasoning is read apart (None: there is none)."""
        self.plan, self.thinking = plan, thinking
        self.streams = [ToolStream(plan.template) if plan else None for _ in range(n)]
        self.splitters = [thinking.splitter() if thinking else None for _ in range(n)]
        self.reasoned = [False] * n  # whether choice i's reasoning has begun in the stream

    def pieces(self, index: int, text: str | None) -> list[tuple[str, ...]]:
        """Choice ``index``'s text delta as the pieces a streaming API sends, in order: its
        reasoning first (``("reasoning", piece)``), then its text and calls
        (:func:`.reading.stream_pieces`). ``text`` None: the choice has ended, and the text
        the reasoning splitter held back is given out as it stands. An answer that begins
        with reasoning has a reasoning piece as soon as it does, an empty one where nothing
        is between the markers yet, so that its reasoning's block or item is there even if
        it stays empty, as in the whole answer (:func:`.reading.read_choice`)."""
        splitter, pieces = self.splitters[index], []
        if splitter is not None:
            thought, text = splitter.feed(text) if text is not None else splitter.finish()
            if thought or (splitter.reasoned and not self.reasoned[index]):
                pieces.append(("reasoning", thought))
                self.reasoned[index] = True
        return pieces + stream_pieces(self.streams[index], text or "")

    def delta(self, index: int, text: str | None, infos) -> str:
        return "".join(getattr(self, kind)(*value) for kind, *value in self.pieces(index, text))

    def end(self, choices: list) -> str:
        return ""

    async def events(self, job: GenerationJob):
        """The stream's events. If the client disconnects, Starlette cancels this generator;
        its ``finally`` cancels the job."""
        try:
            if events := self.start():
                yield events
            while True:
                kind, value = await job.events.get()
                if kind == "started":  # a stream begun while its job was queued
                    continue
                if kind == "delta":
                    events = self.delta(*value)
                elif kind == "choice":
                    # what was held back (a marker's beginning), then the end
                    answer = read_choice(value, self.plan, self.thinking)
                    events = self.delta(value.index, None, None) + self.finish(value.index, answer)
                elif kind == "done":
                    events = self.end(value)
                else:
                    events = self.error(value if kind == "error" else cancelled())
                if events:
                    yield events
                if kind not in ("delta", "choice"):
                    break
            if self.last:
                yield self.last
        finally:
            job.cancel()  # no effect once the job has ended
