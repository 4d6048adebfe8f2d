"""The HTTP connection: uvicorn's h11 protocol with a deadline for each request head, and
OpenAI's error JSON for a request that is not valid HTTP.

uvicorn closes an idle connection between requests (``timeout_keep_alive``) but sets no limit
on a request head that is never completed, so one client could hold connections (and file
descriptors) without end. Here a connection must deliver each complete head within
``header_timeout`` seconds: counted from the connection's start for the first request, and
from the first byte of the next one on a kept-alive connection (the idle time before it is
uvicorn's keep-alive timeout). A connection past its deadline is closed.

Malformed framing (a bad request line or header, a broken chunked body, a head over h11's
size limit) gets a 400 in the same JSON as every other error, where uvicorn wrote plain text;
the connection is then closed, and a request already handed to the app (a broken body after
a whole head) is told its client has gone, so that the app's own answer (a 401, say) is not
sent after the 400.
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .request_base import APIError


class HeadDeadlineProtocol(H11Protocol):
    """:class:`H11Protocol` that closes a connection whose request head is late, and answers
    malformed HTTP with OpenAI's error JSON."""

    #: Seconds a request head may take (set by :func:`http_protocol`).
    header_timeout: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # a head begun, not yet complete
            self._await_head()
        else:
            self._head_arrived()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_arrived()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        if self._head_deadline is None and not self.transport.is_closing():
            self._head_deadline = self.loop.call_later(self.header_timeout, self._head_late)

    def _head_arrived(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_late(self) -> None:
        self._head_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.logger.info(
                "closed a connection whose request head took over %g s", self.header_timeout
            )
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        # The request's app, already started (its head was whole), may still answer: it is told
        # the client has gone, so that its answer is not sent after this one (which h11
        # refuses: a traceback in the log). One whose answer has begun: the connection closes.
        cycle = self.cycle
        if cycle is not None:
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started:
                self.transport.close()
                return
        body = json.dumps(
            APIError(400, f"{msg} (malformed HTTP)", code="invalid_http_request").body()
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        for event in (h11.Response(status_code=400, headers=headers), h11.Data(data=body)):
            self.transport.write(self.conn.send(event))
        self.transport.write(self.conn.send(h11.EndOfMessage()))
        self.transport.close()


def http_protocol(header_timeout: float) -> type[HeadDeadlineProtocol]:
    """The protocol class for uvicorn's ``http`` setting, with this head deadline."""
    return type("HeadDeadlineProtocol", (HeadDeadlineProtocol,), {"header_timeout": header_timeout})
