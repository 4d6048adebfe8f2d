"""Keep-alives on idle streams (``--stream-keepalive``): a chunk of empty content on chat
completions (agents' idle timers count chunks, not comments), an SSE comment on completions
and the Responses API, Anthropic's ``ping`` event on Messages, while a request waits in the queue or its prompt is
prefilled; the official ``openai`` and ``anthropic`` clients read such streams unchanged.

No test sleeps: :func:`keep_alive` is driven by an :class:`asyncio.Queue` of "idle" ticks,
and through the server, generations are held at a gate (a target whose forward passes wait
for a ``threading.Event``) until keep-alives have gone out; the interval is then 10 ms, and
the test waits for what it needs (a ping line, a count), not for a time.
"""

from __future__ import annotations

import asyncio
import json
import threading
import warnings

import anthropic
import httpx
import pytest
from _server import FIXED, MESSAGES, MODEL, RunningServer, tiny_lm, wait_until

from promptlookup.server import ServerSettings, create_app
from promptlookup.server.streams import keep_alive

COMMENT = ": keep-alive"
INTERVAL = 0.01  # seconds; generations wait at the gate until the pings the test needs are out


# -- the wrapper ------------------------------------------------------------------------------


def test_keep_alive_pings_while_no_event_comes_and_closes_what_it_wraps():
    async def main():
        gate, ticks, closed = asyncio.Event(), asyncio.Queue(), []

        async def events():
            try:
                yield "a"
                await gate.wait()
                yield "b"
                await gate.wait()
                yield "c"
            finally:
                closed.append(True)

        pinged = []
        stream = keep_alive(events(), "PING", ticks.get, lambda: pinged.append(1))
        assert await anext(stream) == "a"
        ticks.put_nowait(None)  # the interval passes with no event: a ping
        assert await anext(stream) == "PING"
        ticks.put_nowait(None)
        assert await anext(stream) == "PING"
        gate.set()  # the event that was awaited across both pings comes
        assert await anext(stream) == "b"
        assert await anext(stream) == "c"
        with pytest.raises(StopAsyncIteration):
            await anext(stream)
        assert closed == [True] and len(pinged) == 2

        # Closed while an event is awaited (the client left): the wrapped stream ends too.
        gate.clear()
        stream = keep_alive(events(), "PING", ticks.get)
        assert await anext(stream) == "a"
        ticks.put_nowait(None)
        assert await anext(stream) == "PING"
        await stream.aclose()
        assert closed == [True, True]

    asyncio.run(main())


# -- through the server -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def lm():
    warnings.filterwarnings("ignore", "tiny has no chat template", RuntimeWarning)
    return tiny_lm(gated=True)


@pytest.fixture(scope="module")
def server(lm):
    settings = ServerSettings(generation_options=FIXED, stream_keepalive=INTERVAL, max_batch=1)
    with RunningServer(create_app(lm, settings)) as running:
        yield running
        lm.target.gate.set()


def keepalives(running) -> float:
    value = running.state.metrics.registry.get_sample_value(
        "promptlookup:stream_keepalives_total", {"model_name": MODEL}
    )
    return value or 0.0


def held(running, lm):
    """A context: the next forward passes wait at the gate; on exit, once at least two
    keep-alives more have gone out, they go on."""

    class Held:
        def __enter__(self):
            self.before = keepalives(running)
            lm.target.gate.clear()

        def __exit__(self, *exc):
            try:
                if exc[0] is None:
                    wait_until(lambda: keepalives(running) >= self.before + 2, what="keep-alives")
            finally:
                lm.target.gate.set()

    return Held()


BODIES = {
    "/v1/chat/completions": {"model": MODEL, "messages": MESSAGES, "max_tokens": 8},
    "/v1/completions": {"model": MODEL, "prompt": "abcd abcd", "max_tokens": 8},
    "/v1/messages": {"model": MODEL, "messages": MESSAGES, "max_tokens": 8},
    "/v1/responses": {"model": MODEL, "input": "abcd abcd abcd", "max_output_tokens": 8},
}
PINGS = {"/v1/messages": "event: ping"}


def is_ping(path: str, line: str) -> bool:
    """Whether ``line`` is ``path``'s keep-alive: chat's a chunk whose only delta is empty
    content (no role: not the first chunk), the others' a line of their own."""
    if path != "/v1/chat/completions":
        return line == PINGS.get(path, COMMENT)
    if not line.startswith("data: {"):
        return False
    choices = json.loads(line[6:]).get("choices")
    return (
        bool(choices)
        and choices[0]["delta"] == {"content": ""}
        and not choices[0].get("finish_reason")
    )


def raw_stream(running, lm, path: str) -> list[str]:
    """The lines of a stream from ``path`` whose prefill waits at the gate until a ping line
    has come; the ping is checked to come after the API's first event."""
    lm.target.gate.clear()
    lines = []
    try:
        body = {**BODIES[path], "stream": True, "temperature": 0}
        with httpx.stream("POST", running.url + path, json=body, timeout=60) as response:
            assert response.status_code == 200
            read = response.iter_lines()
            for line in read:
                lines.append(line)
                if is_ping(path, line):
                    lm.target.gate.set()  # a ping came while the prefill waited
                    break
            lines += list(read)
    finally:
        lm.target.gate.set()
    return lines


def events_of(lines: list[str]) -> list[dict]:
    """The JSON of every ``data:`` line (all must parse), checking the SSE framing."""
    assert all(line == "" or line.startswith(("data: ", "event: ", ": ")) for line in lines), lines
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


@pytest.mark.parametrize("path", list(BODIES))
def test_an_idle_stream_gets_keep_alives_after_its_first_event(server, lm, path):
    lines = raw_stream(server, lm, path)
    first = next(i for i, line in enumerate(lines) if is_ping(path, line))
    events = events_of(lines)
    assert events
    if path != "/v1/completions":  # the API's first event goes out when the stream opens
        assert first > 0 and lines[0].startswith(("data: {", "event: "))
    if path == "/v1/messages":
        assert lines[0] == "event: message_start"
        assert lines[first + 1] == 'data: {"type": "ping"}'
        assert events[-1]["type"] == "message_stop"
    elif path == "/v1/responses":
        assert events[0]["type"] == "response.created"
        assert events[-1]["type"] in ("response.completed", "response.incomplete")
    else:
        assert [line for line in lines if line][-1] == "data: [DONE]"


#: Each API's text of a stream's events.
TEXTS = {
    "/v1/chat/completions": lambda events: "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]
    ),
    "/v1/completions": lambda events: "".join(e["choices"][0]["text"] for e in events),
    "/v1/messages": lambda events: "".join(
        e["delta"]["text"] for e in events if e["type"] == "content_block_delta"
    ),
    "/v1/responses": lambda events: "".join(
        e["delta"] for e in events if e["type"] == "response.output_text.delta"
    ),
}


@pytest.mark.parametrize("path", list(BODIES))
def test_a_stream_waiting_in_the_queue_begins_with_keep_alives(server, lm, path):
    """With one generation at a time, a second stream waits in the queue: after the interval
    its response begins (200) and keep-alives flow until it leaves the queue (its job's
    "started" event then passes unseen); its text is the one it streams alone."""
    body = {**BODIES[path], "temperature": 0, "stream": True}
    alone = httpx.post(server.url + path, json=body, timeout=60)
    lm.target.gate.clear()
    first = threading.Thread(
        target=httpx.post,
        args=(server.url + "/v1/completions",),
        kwargs={"json": BODIES["/v1/completions"], "timeout": 60},
    )
    first.start()
    try:
        wait_until(lm.target.blocked.is_set, what="the first generation at the gate")
        lines = []
        with httpx.stream("POST", server.url + path, json=body, timeout=60) as response:
            assert response.status_code == 200
            assert server.worker.waiting == 1  # it began while still queued
            read = response.iter_lines()
            for line in read:
                lines.append(line)
                if is_ping(path, line):
                    lm.target.gate.set()
                    break
            lines += list(read)
    finally:
        lm.target.gate.set()
        first.join(60)
    events = events_of(lines)
    assert not any(e.get("type") == "error" or "error" in e for e in events), events
    assert TEXTS[path](events) == TEXTS[path](events_of(alone.text.splitlines()))
    assert TEXTS[path](events)  # an answer, not an empty stream


def test_the_official_clients_read_streams_with_keep_alives(server, lm):
    """openai (chat completions, completions, Responses) and anthropic (Messages) parse the
    streams, pings included, into the answers the same requests get whole."""
    client = server.client()
    want = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0
    )
    with held(server, lm):
        chunks = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0, stream=True
        )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.choices[0].message.content

    whole = client.completions.create(model=MODEL, prompt="abcd abcd", max_tokens=8, temperature=0)
    with held(server, lm):
        pieces = client.completions.create(
            model=MODEL, prompt="abcd abcd", max_tokens=8, temperature=0, stream=True
        )
    assert "".join(p.choices[0].text for p in pieces if p.choices) == whole.choices[0].text

    request = dict(model=MODEL, input="abcd abcd abcd", max_output_tokens=8, temperature=0)
    whole = client.responses.create(**request)
    with held(server, lm):
        events = client.responses.create(**request, stream=True)
    done = [e for e in events if e.type in ("response.completed", "response.incomplete")]
    assert len(done) == 1 and done[0].response.output_text == whole.output_text

    messages = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    request = dict(model=MODEL, max_tokens=8, messages=MESSAGES, extra_body={"temperature": 0})
    whole = messages.messages.create(**request)
    with held(server, lm):
        stream = messages.messages.stream(**request).__enter__()
    try:
        final = stream.get_final_message()
    finally:
        stream.close()
    assert [b.text for b in final.content] == [b.text for b in whole.content]


def test_no_keep_alives_when_turned_off(lm):
    settings = ServerSettings(generation_options=FIXED, stream_keepalive=0)
    with RunningServer(create_app(lm, settings)) as running:
        body = {**BODIES["/v1/chat/completions"], "stream": True}
        lines = httpx.post(running.url + "/v1/chat/completions", json=body, timeout=60)
        assert COMMENT not in lines.text.splitlines() and "data: [DONE]" in lines.text
        assert not any(is_ping(path, line) for path in BODIES for line in lines.text.splitlines())
        assert running.state.metrics.registry.get_sample_value(
            "promptlookup:stream_keepalives_total", {"model_name": MODEL}
        ) in (None, 0.0)


def test_a_queued_stream_that_began_ends_with_an_error_event_at_shutdown():
    """A stream that began while queued has sent its 200: the server's shutdown reaches it as
    an error event (code ``server_shutting_down``) and ``[DONE]``, not as a 503."""
    import signal

    lm = tiny_lm(gated=True)
    settings = ServerSettings(generation_options=FIXED, stream_keepalive=INTERVAL, max_batch=1)
    with RunningServer(create_app(lm, settings)) as running:
        lm.target.gate.clear()
        body = {**BODIES["/v1/chat/completions"], "temperature": 0}
        first = threading.Thread(
            target=httpx.post,
            args=(running.url + "/v1/chat/completions",),
            kwargs={"json": body, "timeout": 60},
        )
        first.start()
        try:
            wait_until(lm.target.blocked.is_set, what="the first generation at the gate")
            lines = []
            with httpx.stream(
                "POST",
                running.url + "/v1/chat/completions",
                json={**body, "stream": True},
                timeout=60,
            ) as response:
                assert response.status_code == 200 and running.worker.waiting == 1
                read = response.iter_lines()
                for line in read:
                    lines.append(line)
                    if is_ping("/v1/chat/completions", line):
                        running.server.handle_exit(signal.SIGTERM, None)  # uvicorn's SIGTERM
                        break
                lines += list(read)
        finally:
            lm.target.gate.set()
            first.join(60)
    events = [line for line in lines if line and not is_ping("/v1/chat/completions", line)]
    assert events[-1] == "data: [DONE]" and "event: error" in events
    assert json.loads(events[events.index("event: error") + 1][6:])["error"]["code"] == (
        "server_shutting_down"
    )
