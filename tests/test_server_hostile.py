"""Several tenants at once (issue 52): one tenant sends hostile requests on all three APIs
(pathological and malformed schemas in tools and response formats, lone surrogates, tools and
items the server does not run, a body nested 100,000 deep) while another tenant's streams of
every API share the batch with the ones that are admitted. Every hostile request ends as a
2xx, or a 4xx of one line in its own API's error shape (an error event, once a stream has
begun); never a 5xx. The other tenant's streams end as they do alone, token for token."""

from __future__ import annotations

import json
import logging
import socket
import threading
import warnings

import httpx
import pytest
from _server import FIXED, GatedTarget, RunningServer, wait_until
from conftest import tiny_llama
from test_grammar_fuzz import PATHOLOGICAL
from test_server_tools import WEATHER, AsciiTokenizer

from promptlookup.backends.hf.target import TorchTarget
from promptlookup.generation import LanguageModel
from promptlookup.server import ServerSettings, create_app

ALICE, BOB = "alice-key", "bob-key"  # alice attacks, bob's streams must not notice


def gated_ascii_lm() -> LanguageModel:
    """test_server_tools' ascii model (a grammar can spell JSON with it), passes gated."""
    model = tiny_llama(vocab_size=AsciiTokenizer.vocab_size, seed=5, context=2048)
    target = GatedTarget(TorchTarget(model))
    return LanguageModel(target, AsciiTokenizer(), name="tiny", model=model)


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    warnings.filterwarnings("ignore", "tiny has no chat template", RuntimeWarning)
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(f"alice {ALICE}\nbob {BOB}\n")
    settings = ServerSettings(
        api_keys_file=str(keys), generation_options=FIXED, max_batch=32, max_queue=64
    )
    with RunningServer(create_app(gated_ascii_lm(), settings)) as server:
        yield server


def headers(path: str, key: str) -> dict:
    if path.startswith("/v1/messages"):
        return {"x-api-key": key, "anthropic-version": "2023-06-01"}
    return {"Authorization": f"Bearer {key}"}


def chat(**extra) -> tuple[str, dict]:
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    return "/v1/chat/completions", {
        "model": "tiny",
        "messages": messages,
        "max_tokens": 16,
        **extra,
    }


def messages(**extra) -> tuple[str, dict]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Weather in Oslo?"}]}
    return "/v1/messages", {**body, "max_tokens": 16, **extra}


def responses(**extra) -> tuple[str, dict]:
    return "/v1/responses", {"model": "tiny", "input": "Weather?", "max_output_tokens": 16, **extra}


def hostile() -> list[tuple[str, dict | str]]:
    """Alice's requests: (path, body; a string is sent as it is)."""
    requests: list[tuple[str, dict | str]] = []
    for i, schema in enumerate(PATHOLOGICAL):
        stream = i % 2 == 0
        function = {"name": "f", "parameters": schema}
        requests += [
            chat(tools=[{"type": "function", "function": function}], tool_choice="required",
                 stream=stream),
            chat(response_format={"type": "json_schema",
                                  "json_schema": {"name": "x", "schema": schema}}),
            messages(tools=[{"name": "f", "input_schema": schema}], tool_choice={"type": "any"},
                     stream=not stream),
            messages(output_config={"format": {"type": "json_schema", "schema": schema}}),
            responses(tools=[{"type": "function", **function}], tool_choice="required",
                      stream=stream),
            responses(text={"format": {"type": "json_schema", "name": "x", "schema": schema}},
                      stream=not stream),
        ]  # fmt: skip
    surrogate = (
        '{"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "\\ud800"}]}'
    )
    requests += [
        ("/v1/chat/completions", surrogate),
        ("/v1/messages", surrogate),
        ("/v1/chat/completions", "[" * 100_000 + "]" * 100_000),
        ("/v1/responses", '{"model": "tiny", "input": []}'),
        responses(tools=[{"type": "local_shell"}, {"type": "custom", "name": "c"}],
                  tool_choice={"type": "local_shell"}),
        messages(tools=[{"type": "bash_20250124", "name": "bash"}], stream=True,
                 tool_choice={"type": "tool", "name": "bash"}),
        chat(prediction={"type": "content", "content": "ab" * 60_000}),
        chat(tools=[{"type": "function", "function": {"name": "f", "description": "d" * 2**20}}]),
    ]  # fmt: skip
    return requests


def send(running, path: str, body: dict | str, key: str) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    sent = {**headers(path, key), "Content-Type": "application/json"}
    return httpx.post(running.url + path, content=content, headers=sent, timeout=120)


def check_refusal(path: str, response: httpx.Response) -> None:
    """A 2xx, or a 4xx of one line in the API's shape; a stream's error event of one line."""
    assert response.status_code < 500, (path, response.text)
    anthropic = path.startswith("/v1/messages")
    if response.status_code >= 400:
        body = response.json()
        if anthropic:
            assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        else:
            assert set(body["error"]) == {"message", "type", "param", "code"}, body
        message = body["error"]["message"]
        assert message and "\n" not in message, body
        return
    if "text/event-stream" in response.headers.get("content-type", ""):
        for block in response.text.split("\n\n"):
            if block.startswith("event: error"):
                data = json.loads(block.split("data: ", 1)[1])
                message = (data.get("error") or data).get("message")
                assert message and "\n" not in message, block


#: Bob's streams, one per API, one of them under a grammar.
VICTIMS = [
    chat(stream=True, max_tokens=40, temperature=0),
    chat(stream=True, max_tokens=40, temperature=0, response_format={
        "type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}}),
    messages(stream=True, max_tokens=40, temperature=0),
    responses(stream=True, max_output_tokens=40, temperature=0),
]  # fmt: skip


def ending(path: str, text: str) -> tuple[str, str]:
    """A stream's text and how it ended (its last event's data)."""
    data = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    if path == "/v1/chat/completions":
        said = "".join(c["choices"][0]["delta"].get("content") or "" for c in data if c["choices"])
        assert text.rstrip().endswith("data: [DONE]"), text
        return said, next(c["choices"][0]["finish_reason"] for c in data[::-1] if c["choices"])
    if path == "/v1/messages":
        said = "".join(
            e["delta"].get("text", "") for e in data if e["type"] == "content_block_delta"
        )
        return said, next(e for e in data if e["type"] == "message_delta")["delta"]["stop_reason"]
    said = "".join(e["delta"] for e in data if e["type"] == "response.output_text.delta")
    return said, data[-1]["type"]


def test_one_tenants_hostile_requests_end_no_stream_of_another(running):
    attacks = hostile()
    # Alone: each hostile request's answer (never a 5xx), and whether it reached the worker.
    joined = 0
    for path, body in attacks:
        before = running.worker.completed + running.worker.failed + running.worker.cancelled
        check_refusal(path, send(running, path, body, ALICE))
        joined += (
            running.worker.completed + running.worker.failed + running.worker.cancelled > before
        )
    assert joined > 0  # some share the batch, not all are refused before it
    alone = [ending(path, send(running, path, body, BOB).text) for path, body in VICTIMS]
    # Together: Bob's streams and Alice's requests in one batch, passes held until all are in.
    replies: dict = {}
    running.state.lm.target.gate.clear()
    try:
        bobs = [
            threading.Thread(target=lambda i=i, p=p, b=b: replies.update({i: send(running, p, b, BOB)}))
            for i, (p, b) in enumerate(VICTIMS)
        ]  # fmt: skip
        alices = [
            threading.Thread(target=lambda j=j, p=p, b=b: replies.update({("a", j): (p, send(running, p, b, ALICE))}))
            for j, (p, b) in enumerate(attacks)
        ]  # fmt: skip
        for thread in bobs + alices:
            thread.start()
        total = len(VICTIMS) + joined
        wait_until(lambda: running.worker.waiting + running.worker.running == total, what="all in")
    finally:
        running.state.lm.target.gate.set()
    for thread in bobs + alices:
        thread.join(120)
    for j in range(len(attacks)):
        check_refusal(*replies[("a", j)])
    together = [ending(path, replies[i].text) for i, (path, _) in enumerate(VICTIMS)]
    assert together == alone
    assert all(said for said, _ in alone)


#: Per API: a body of ``n`` pieces (messages, items, blocks, tools or token ids), each one
#: that validation would refuse (no role, no type, an unknown id): the count comes first.
PIECES = {
    "/v1/chat/completions": lambda n: {"model": "tiny", "messages": [{}] * n},
    "/v1/completions": lambda n: {"model": "tiny", "prompt": [-1] * n},
    "/v1/messages": lambda n: {"model": "tiny", "max_tokens": 1,
                               "messages": [{"role": "user", "content": [{}] * (n - 1)}]},
    "/v1/messages/count_tokens": lambda n: {"model": "tiny", "messages": [{}] * n},
    "/v1/responses": lambda n: {"model": "tiny", "input": [{"role": "user"}] * (n // 2),
                                "tools": [{}] * (n - n // 2)},
    "/tokenize": lambda n: {"messages": [{"role": "user", "content": [{}]}] * ((n + 1) // 2)},
    "/detokenize": lambda n: {"tokens": [-1] * n},
}  # fmt: skip


@pytest.mark.parametrize("path", list(PIECES))
def test_a_body_of_more_pieces_than_the_context_is_a_400_before_it_is_validated(running, path):
    """A 4 MiB body of 100,000 empty messages held the event loop (every other stream) for
    seconds while it was validated; more pieces than the context has tokens are refused
    first, counted in microseconds each."""
    context = running.state.lm.target.max_context
    over = send(running, path, PIECES[path](context + 1), ALICE)
    check_refusal(path, over)
    assert over.status_code == 400
    error = over.json()["error"]
    assert error["message"].startswith(f"This model's maximum context length is {context} tokens")
    assert f"more than {context} messages, items, content parts" in error["message"]
    if not path.startswith("/v1/messages"):
        assert error["code"] == "context_length_exceeded"
        # The field where the count passed the context's.
        said = {"/v1/completions": "prompt", "/v1/responses": "tools", "/detokenize": "tokens"}
        assert error["param"] == said.get(path, "messages")
    at_most = send(running, path, PIECES[path](context), ALICE)  # validated: another 400
    assert at_most.status_code == 400 and "more than" not in at_most.text, at_most.text


#: A whole head, then a chunked body that is not one: uvicorn refuses it after the app began.
BROKEN_BODY = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    b"Content-Type: application/json\r\n\r\nzz\r\n"
)


@pytest.mark.parametrize("key", [None, ALICE], ids=["no-key", "key"])
def test_a_broken_body_after_a_whole_head_is_one_400_and_no_traceback(running, caplog, key):
    """Without a key the app answers 401 at once, beside uvicorn's 400 for the body: that
    second answer used to raise inside h11 (a traceback logged as an internal error)."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="promptlookup.server")
    head = BROKEN_BODY if key is None else BROKEN_BODY.replace(
        b"Host: x\r\n", b"Host: x\r\nAuthorization: Bearer " + key.encode() + b"\r\n")  # fmt: skip
    try:
        with socket.create_connection(("127.0.0.1", running.port), timeout=10) as sock:
            sock.sendall(head)
            parts = []
            while part := sock.recv(65536):  # the server answers, then closes
                parts.append(part)
        answer = send(running, *chat(max_tokens=2), ALICE)  # the server goes on
        assert answer.status_code == 200, answer.text
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    status, _, body = b"".join(parts).partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 400"), status
    assert json.loads(body)["error"]["code"] == "invalid_http_request"
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
