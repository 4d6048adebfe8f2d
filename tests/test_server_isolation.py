"""No tenant can hurt another: a request whose own step fails while it shares the batch with
others (its grammar, or any exception in its sequence's work) ends alone, with a 400 of one
line in its own API's shape, and every other request gets exactly its answer alone. One test
per path: chat completions streamed and whole, Anthropic's Messages and OpenAI's Responses
streamed."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from _server import MODEL, RunningServer, tiny_lm, wait_until

from promptlookup.drafters.base import Draft
from promptlookup.errors import GrammarError
from promptlookup.server import ServerSettings, create_app

OTHERS = ["abcd abcd abcd", "xyz xyz xy", "the cat the cat the"]
POISONED = "hello hello hello he"
#: How the test double tells the poisoned request from the others: its token budget.
POISONED_MAX_TOKENS = 23
#: The poisoned sequence's step fails at its third token: the batch holds every request then.
FAILS_AT = 3
#: What the failing step says: engine internals, which must not reach the client.
INTERNALS = "parser state: stack=[#12 <json-object> ...]"


class FailingGrammar:
    """A grammar state that allows every token and raises ``error`` when its sequence takes
    its ``at``-th token (a test double of :class:`promptlookup.grammar.GrammarState`)."""

    def __init__(self, at: int, error: Exception) -> None:
        self.at, self.error, self.taken = at, error, 0

    def draft(self, drafter, tokens, room: int, forced_only: bool = False) -> Draft:
        return Draft() if forced_only else Draft.of(drafter.propose(tokens, room)).cut(room)

    def mask_(self, row):
        return row

    def advance(self, token: int) -> None:
        self.taken += 1
        if self.taken == self.at:
            raise self.error

    def rollback(self, count: int) -> None:
        self.taken -= count


def poisoned_lm(error: Exception):
    """The tiny model, its passes gated, whose request with ``POISONED_MAX_TOKENS`` fails at
    token ``FAILS_AT`` with ``error``; ``lm.shared`` records the most sequences in a pass
    with the poisoned one."""
    lm = tiny_lm(gated=True)
    real_sequence, real_forward = lm.batch_sequence, lm.target.forward_batch
    lm.shared, poisoned = 0, []

    def batch_sequence(prompt, **options):
        sequence, text = real_sequence(prompt, **options)
        if options["max_new_tokens"] == POISONED_MAX_TOKENS:
            sequence.grammar = FailingGrammar(FAILS_AT, error)
            poisoned.append(sequence)
        return sequence, text

    def forward_batch(caches, token_ids, logits_to_keep):
        if any(sequence.cache is cache for sequence in poisoned for cache in caches):
            lm.shared = max(lm.shared, len(caches))
        return real_forward(caches, token_ids, logits_to_keep)

    lm.batch_sequence, lm.target.forward_batch = batch_sequence, forward_batch
    return lm


def chat_body(content: str, **extra) -> dict:
    messages = [{"role": "user", "content": content}]
    return {"model": MODEL, "messages": messages, "max_tokens": 24, "temperature": 0, **extra}


#: Each path's poisoned request: (endpoint, body).
POISONED_REQUESTS = {
    "chat-stream": ("/v1/chat/completions", chat_body(POISONED, stream=True)),
    "chat": ("/v1/chat/completions", chat_body(POISONED)),
    "anthropic-stream": ("/v1/messages", chat_body(POISONED, stream=True)),
    "responses-stream": (
        "/v1/responses",
        {"model": MODEL, "input": POISONED, "temperature": 0, "stream": True},
    ),
}


def answer(url: str, content: str) -> str:
    reply = httpx.post(url + "/v1/chat/completions", json=chat_body(content), timeout=60)
    return reply.json()["choices"][0]["message"]["content"]


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """``(event name or None, data)`` of a server-sent event stream."""
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        events.append((fields.get("event"), fields.get("data", "")))
    return events


def poisoned_error(path: str, response: httpx.Response) -> dict:
    """The poisoned request's error object, in its own API's shape."""
    if path == "chat":
        assert response.status_code == 400
        return response.json()["error"]
    assert response.status_code == 200  # the stream began before the failure
    events = sse_events(response.text)
    (data,) = [data for event, data in events if event == "error"]
    body = json.loads(data)
    if path == "chat-stream":
        assert events[-1] == (None, "[DONE]")
        return body["error"]
    if path == "anthropic-stream":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        return body["error"]
    assert body["type"] == "error"  # Responses: the error event's own fields
    return body


@pytest.mark.parametrize(
    ("path", "error", "says"),
    [
        ("chat-stream", GrammarError(f"the grammar refused token 7: {INTERNALS}"), "grammar"),
        ("chat", RuntimeError(INTERNALS), "RuntimeError"),
        ("anthropic-stream", GrammarError(f"the grammar refused token 7: {INTERNALS}"), "grammar"),
        ("responses-stream", KeyError(INTERNALS), "KeyError"),
    ],
)
def test_one_failing_sequence_ends_alone_and_the_batch_goes_on(path, error, says):
    lm = poisoned_lm(error)
    with RunningServer(create_app(lm, ServerSettings(max_batch=4))) as running:
        alone = [answer(running.url, content) for content in OTHERS]  # each one by one
        endpoint, poisoned = POISONED_REQUESTS[path]
        poisoned = {**poisoned, "max_tokens": POISONED_MAX_TOKENS}
        if path == "responses-stream":
            poisoned = {**poisoned, "max_output_tokens": poisoned.pop("max_tokens")}
        replies: dict = {}
        sends = [
            lambda: replies.update(
                bad=httpx.post(running.url + endpoint, json=poisoned, timeout=60)
            )
        ] + [
            lambda i=i: replies.update({i: answer(running.url, OTHERS[i])})
            for i in range(len(OTHERS))
        ]
        lm.target.gate.clear()  # the first request's first pass waits until all are in
        threads = [threading.Thread(target=send) for send in sends]
        for thread in threads:
            thread.start()
        wait_until(
            lambda: running.worker.waiting + running.worker.running == len(sends),
            what="every request to be in",
        )
        lm.target.gate.set()
        for thread in threads:
            thread.join(60)
        failed, completed = running.worker.failed, running.worker.completed
    # The poisoned request shared passes with the others (all of them unless one ended first).
    assert lm.shared >= len(sends) - 1
    assert [replies[i] for i in range(len(OTHERS))] == alone  # every other answer unchanged
    assert (failed, completed) == (1, 2 * len(OTHERS))
    message = poisoned_error(path, replies["bad"])["message"]
    assert says in message and "\n" not in message and INTERNALS not in message
