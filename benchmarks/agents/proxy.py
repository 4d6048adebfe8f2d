"""A recording proxy in front of the server under test: it forwards every request unchanged
(streams byte for byte, as they arrive) and appends one JSON line per request to a file: the
agent it came from, path, status, seconds to the first byte and to the end, the request's shape
and the answer's usage and tool calls (:mod:`.accounting`), never the bodies' text."""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from .accounting import (
    ERROR_CHARS,
    AnswerShape,
    EventReader,
    answer_shape,
    answered,
    api_of,
    request_shape,
)

#: Headers that belong to one connection, not to the request (RFC 9110 7.6.1), and the ones
#: the proxy sets itself.
HOP_HEADERS = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "host",
    "content-length",
    "accept-encoding",  # so that answers come back readable (uncompressed)
}


class Recorder:
    """The records of one run, appended to ``path`` (JSON lines) and kept in memory; ``agent``
    labels the requests that arrive from now on."""

    def __init__(self, path: Path) -> None:
        self.path, self.agent, self.records = Path(path), "", []
        self.lock = threading.Condition()
        self.started = time.monotonic()

    def add(self, record: dict) -> None:
        """Append ``record`` (its ``agent`` label taken when the request arrived)."""
        with self.lock:
            record = {"agent": record.pop("agent"), "seq": len(self.records), **record}
            self.records.append(record)
            with self.path.open("a") as out:
                out.write(json.dumps(record) + "\n")
            self.lock.notify_all()

    def wait(self, count: int, timeout: float = 60.0) -> bool:
        """Block until ``count`` records are in (a request's record follows its answer)."""
        with self.lock:
            return self.lock.wait_for(lambda: len(self.records) >= count, timeout)

    def turns(self, agent: str) -> int:
        """Model turns ``agent`` has completed so far: answers of a generation endpoint
        (:func:`.accounting.answered`; refused requests are not turns)."""
        with self.lock:
            return sum(1 for r in self.records if r["agent"] == agent and r["api"] and answered(r))


class ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream: tuple[str, int]
    recorder: Recorder
    timeout_s: float = 1800.0

    def log_message(self, format, *args):  # the records say it all
        pass

    def do_GET(self):
        self._forward()

    do_POST = do_PUT = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers
                pass
            return body
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _forward(self) -> None:
        started = time.monotonic()
        path, api = self.path, api_of(self.path)
        body = self._body()
        shape = request_shape(api, body) if api else None
        record = {
            "agent": self.recorder.agent,
            "method": self.command,
            "path": path.split("?", 1)[0],
            "api": api,
            "t": round(started - self.recorder.started, 3),
            "request": None if shape is None else vars(shape),
        }
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
        upstream = http.client.HTTPConnection(*self.upstream, timeout=self.timeout_s)
        done, left = threading.Event(), threading.Event()
        try:
            upstream.connect()
            # Watch the client from the start: it may leave while the request waits or prefills.
            watcher = threading.Thread(target=self._watch, args=(upstream, done, left))
            watcher.daemon = True
            watcher.start()
            upstream.request(self.command, path, body=body or None, headers=headers)
            response = upstream.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            done.set()
            upstream.close()
            if left.is_set():  # nginx's 499: the client closed the request before any answer
                record.update(status=499, error="the client left before the answer began")
            else:
                record.update(status=502, error=f"upstream: {exc}"[:ERROR_CHARS])
                self._reply_plain(502, f"proxy: upstream unreachable ({exc})")
            record.update(seconds=round(time.monotonic() - started, 3), client_closed=left.is_set())
            self.recorder.add(record)
            return
        try:
            answer, first, closed = self._relay(api, response, done)
        finally:
            done.set()
            upstream.close()  # a client that left cancels the generation upstream too
        closed = closed or left.is_set()
        ended = time.monotonic()
        record.update(
            status=response.status,
            # What the server says it ignored (field paths and tool types, no text).
            ignored={
                k.lower(): v[:ERROR_CHARS]
                for k, v in response.getheaders()
                if k.lower().startswith("x-promptlookup-ignored")
            },
            first_byte_s=None if first is None else round(first - started, 3),
            seconds=round(ended - started, 3),
            client_closed=closed,
            answer=vars(answer),
        )
        self.recorder.add(record)

    def _watch(self, upstream, done: threading.Event, left: threading.Event) -> None:
        """Close the upstream connection as soon as the client leaves, even while nothing is
        sent (a long prefill), as the server would see it without the proxy."""
        while not done.is_set():
            try:
                readable, _, _ = select.select([self.connection], [], [], 0.25)
            except (OSError, ValueError):
                return  # the connection is already closed: the answer is over
            if not readable or done.is_set():
                continue
            try:
                if self.connection.recv(1, socket.MSG_PEEK):
                    return  # the client sent more (a pipelined request): not a departure
            except OSError:
                pass
            if done.is_set():
                return  # the answer was complete: the client left after it
            left.set()
            try:
                upstream.sock.shutdown(socket.SHUT_RDWR)
            except (OSError, AttributeError):
                pass
            return

    def _relay(self, api, response, done) -> tuple[AnswerShape, float | None, bool]:
        """Send ``response`` on as it arrives; read its events on the way. ``done`` is set
        before the last piece goes out: a client that leaves after it has not left early."""
        content_type = response.getheader("Content-Type", "")
        streaming = "text/event-stream" in content_type
        self.send_response_only(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in HOP_HEADERS:
                self.send_header(key, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        answer, reader, whole, first, closed = AnswerShape(), None, b"", None, False
        if streaming:
            reader = EventReader(api, answer)
        while True:
            try:
                chunk = response.read1(65536) if self.command != "HEAD" else b""
            except (OSError, http.client.HTTPException):
                chunk, closed = b"", True  # the upstream closed (or the client left)
            if chunk and first is None:
                first = time.monotonic()
            if reader is not None:
                reader.feed(chunk)
            else:
                whole += chunk
            if not chunk:
                done.set()
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunk else b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                closed = True
                break
            if not chunk:
                break
        if reader is not None:
            reader.close()
            if response.status >= 400 and answer.error is None:
                answer.error = f"HTTP {response.status}"
        else:
            answer = answer_shape(api, response.status, content_type, whole)
        return answer, first, closed

    def _reply_plain(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True


def start_proxy(upstream: tuple[str, int], recorder: Recorder, port: int = 0):
    """Listen on 127.0.0.1:``port`` (0: a free one) in a thread; returns the server, whose
    ``server_address[1]`` is the port and ``shutdown()`` stops it."""
    handler = type("Handler", (ProxyHandler,), {"upstream": upstream, "recorder": recorder})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
