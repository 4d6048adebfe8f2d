"""The OpenAI-compatible server: a real uvicorn server on 127.0.0.1 over a tiny model, driven by
the official ``openai`` client (and raw httpx/sockets for malformed requests and disconnects).

No test sleeps for a fixed time: waiting is polling a condition against a deadline, and slow
generations are made with a target whose forward passes wait for a ``threading.Event``.
"""

from __future__ import annotations

import json
import logging
import socket
import threading

import httpx
import openai
import pytest
from _server import CONTEXT, FIXED, MESSAGES, MODEL, RunningServer, tiny_lm, wait_until
from click.testing import CliRunner

from promptlookup.cli import main as cli_main
from promptlookup.errors import ModelLoadError
from promptlookup.server import ServerSettings, create_app


@pytest.fixture(scope="module")
def lm():
    return tiny_lm()


@pytest.fixture(scope="module")
def server(lm):
    with RunningServer(create_app(lm, ServerSettings(generation_options=FIXED))) as running:
        yield running


@pytest.fixture()
def gated():
    lm = tiny_lm(gated=True)
    with RunningServer(
        create_app(lm, ServerSettings(max_queue=1, generation_options=FIXED))
    ) as running:
        yield running, lm.target
        lm.target.gate.set()


def chat(client, **kwargs):
    return client.chat.completions.create(model=MODEL, messages=MESSAGES, **kwargs)


# -- answers ---------------------------------------------------------------------------------


def test_chat_completion_equals_library_greedy_output(server, lm):
    response = chat(server.client(), temperature=0, max_tokens=24)
    expected = lm.generate(MESSAGES, max_new_tokens=24, temperature=0)
    assert response.choices[0].message.content == expected.text
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].finish_reason == expected.finish_reason
    assert response.model == MODEL and response.object == "chat.completion"
    usage = response.usage
    assert usage.prompt_tokens == len(lm.encode(MESSAGES))
    assert usage.completion_tokens == len(expected.token_ids)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert set(usage.speculative) >= {"forward_passes", "drafted_tokens", "accepted_tokens"}
    assert usage.speculative["forward_passes"] <= usage.completion_tokens


def test_completion_takes_text_or_token_ids(server, lm):
    client = server.client()
    by_text = client.completions.create(
        model=MODEL, prompt="abcabcab", temperature=0, max_tokens=16
    )
    by_ids = client.completions.create(
        model=MODEL, prompt=lm.encode("abcabcab"), temperature=0, max_tokens=16
    )
    expected = lm.generate("abcabcab", max_new_tokens=16, temperature=0)
    assert by_text.choices[0].text == by_ids.choices[0].text == expected.text
    assert by_text.object == "text_completion"
    assert by_text.usage.completion_tokens == len(expected.token_ids)


def test_chat_stream_chunks_concatenate_to_the_answer(server):
    client = server.client()
    whole = chat(client, temperature=0, max_tokens=24).choices[0].message.content
    chunks = list(
        chat(
            client,
            temperature=0,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert len(finals) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert chunks[-1].usage.speculative["forward_passes"] >= 1
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_completion_stream_ends_with_done(server, lm):
    body = {
        "model": MODEL,
        "prompt": "abcabcab",
        "temperature": 0,
        "max_tokens": 16,
        "stream": True,
    }
    with httpx.stream("POST", server.url + "/v1/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        # Blank lines separate events; comments (keep-alives on a slow machine) are not events.
        events = [line for line in response.iter_lines() if line and not line.startswith(":")]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in events[:-1]]
    assert all("usage" not in c for c in chunks)  # no include_usage: no usage chunk
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == lm.generate("abcabcab", max_new_tokens=16, temperature=0).text


def test_sampling_with_seed_is_reproducible(server):
    client = server.client()
    first = chat(client, temperature=1.0, top_p=0.9, seed=7, max_tokens=16)
    again = chat(client, temperature=1.0, top_p=0.9, seed=7, max_tokens=16)
    assert first.choices[0].message.content == again.choices[0].message.content


def test_stop_string_ends_the_answer(server, lm):
    expected = lm.generate(MESSAGES, max_new_tokens=24, temperature=0).text
    assert len(expected) > 4
    stop = expected[3:5]
    response = chat(server.client(), temperature=0, max_tokens=24, stop=[stop])
    assert response.choices[0].message.content == expected[: expected.index(stop)]
    assert response.choices[0].finish_reason == "stop"


def test_one_stop_string_longer_than_four_characters_is_one_stop_sequence(server, lm):
    expected = lm.generate(MESSAGES, max_new_tokens=24, temperature=0).text
    stop = expected[3:9]
    assert len(stop) == 6
    response = chat(server.client(), temperature=0, max_tokens=24, stop=stop)
    assert response.choices[0].message.content == expected[: expected.index(stop)]
    assert response.choices[0].finish_reason == "stop"


def test_prediction_feeds_the_reference_drafter(server, lm):
    """The predicted output becomes draft material: with the true answer as prediction the
    drafts come from it and are accepted, and the answer itself does not change."""
    prompt = "the quick brown fox"
    expected = lm.generate(prompt, max_new_tokens=40, temperature=0, drafter="none")
    client = server.client()
    plain = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=40)
    predicted = client.completions.create(
        model=MODEL,
        prompt=prompt,
        temperature=0,
        max_tokens=40,
        extra_body={"prediction": {"type": "content", "content": expected.text}},
    )
    assert plain.choices[0].text == predicted.choices[0].text == expected.text
    stats = predicted.usage.speculative
    assert stats["accepted_tokens"] > plain.usage.speculative["accepted_tokens"]
    assert stats["forward_passes"] < predicted.usage.completion_tokens
    # Chat, with the prediction given as a list of text parts.
    answer = lm.generate(MESSAGES, max_new_tokens=40, temperature=0, drafter="none").text
    parts = [{"type": "text", "text": answer[:7]}, {"type": "text", "text": answer[7:]}]
    response = chat(
        client, temperature=0, max_tokens=40, prediction={"type": "content", "content": parts}
    )
    assert response.choices[0].message.content == answer
    assert response.usage.speculative["accepted_tokens"] > 0


def test_models_and_health(server):
    assert [m.id for m in server.client().models.list()] == [MODEL]
    health = httpx.get(server.url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


@pytest.mark.parametrize("aliases", [("claude-haiku", "gpt-4o"), ("*",)])
def test_a_model_alias_is_served_under_the_model_id(lm, aliases):
    """Agents send the model name they are set up with; --model-alias takes it (``*`` any)."""
    settings = ServerSettings(generation_options=FIXED, model_alias=aliases)
    with RunningServer(create_app(lm, settings)) as running:
        client = running.client()
        answer = client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2)
        assert answer.model == MODEL
        assert httpx.get(running.url + "/v1/models/claude-haiku").json()["id"] == MODEL
        if "*" not in aliases:
            with pytest.raises(openai.BadRequestError, match="does not exist"):
                client.chat.completions.create(model="gpt-5", messages=MESSAGES, max_tokens=2)


def test_without_max_tokens_the_answer_fits_the_context(server):
    response = server.client().completions.create(model=MODEL, prompt="ab" * 250, temperature=0)
    assert response.usage.prompt_tokens == 500
    assert response.usage.completion_tokens <= CONTEXT - 500


def test_max_tokens_beyond_the_context_is_a_ceiling_the_context_lowers(server):
    """Agents ask for more than a small model's context holds (Claude Code: 32,000): the
    answer ends where the context is full, as llama-server does, and says "length"."""
    response = server.client().completions.create(
        model=MODEL, prompt="ab" * 250, temperature=0, max_tokens=32_000, stop=None
    )
    assert response.usage.prompt_tokens == 500
    assert response.usage.completion_tokens == CONTEXT - 500
    assert response.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="leaves no room"):  # a full context
        server.client().completions.create(model=MODEL, prompt=[5] * CONTEXT, max_tokens=1)


# -- bad requests ----------------------------------------------------------------------------

GOOD = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4}


@pytest.mark.parametrize(
    "body, status, param, code",
    [
        (b"{not json", 400, None, "invalid_json"),
        (b"[1, 2]", 400, None, None),
        ({**GOOD, "max_token": 1}, 400, "max_token", None),  # a typo of max_tokens
        ({**GOOD, "model": "gpt-17"}, 400, "model", "model_not_found"),
        ({**GOOD, "max_tokens": 0}, 400, "max_tokens", None),
        ({**GOOD, "max_completion_tokens": -3}, 400, "max_completion_tokens", None),
        ({**GOOD, "temperature": -0.5}, 400, "temperature", None),
        ({**GOOD, "top_p": 0}, 400, "top_p", None),
        ({**GOOD, "n": 17}, 400, "n", None),
        ({**GOOD, "messages": []}, 400, "messages", None),
        ({**GOOD, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages", None),
        (
            {**GOOD, "messages": [{"role": "user", "content": "a" * 600}]},
            400,
            "messages",
            "context_length_exceeded",
        ),
        ({**GOOD, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", None),
        ({**GOOD, "stop": "a" * 1001}, 400, "stop", None),
        ({**GOOD, "stop": ["ab", "a" * 1001]}, 400, "stop", None),
    ],
    ids=[
        "malformed-json",
        "not-an-object",
        "misspelt-field",
        "unknown-model",
        "max-tokens-0",
        "max-completion-tokens-negative",
        "negative-temperature",
        "top-p-0",
        "n-17",
        "no-messages",
        "unknown-role",
        "prompt-beyond-context",
        "five-stop-strings",
        "stop-string-too-long",
        "listed-stop-string-too-long",
    ],
)
def test_bad_chat_request_is_a_400_with_openai_error_json(server, body, status, param, code):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(
        server.url + "/v1/chat/completions",
        content=content,
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    assert (error["param"], error["code"]) == (param, code)


@pytest.mark.parametrize(
    "content, says",
    [
        ([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}],
         "messages.0.content.0.type: only text content is supported (the model reads text), "
         "not 'image_url'"),
        ([{"type": "text"}], "messages.0.content.0.text: Field required"),
        (5, "messages.0.content: Input should be a valid string"),
    ],
    ids=["image-part", "text-part-without-text", "a-number"],
)  # fmt: skip
def test_a_bad_content_part_is_named_without_the_unions_member_names(server, content, says):
    body = {**GOOD, "messages": [{"role": "user", "content": content}]}
    response = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == says


class CountingTokenizer:
    """A tokenizer that records the length of every text it is given."""

    def __init__(self, inner) -> None:
        self.inner, self.lengths = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, text, **kwargs):
        self.lengths.append(len(text))
        return self.inner(text, **kwargs)

    def apply_chat_template(self, messages, **kwargs):
        self.lengths.append(sum(len(m["content"]) for m in messages))
        return self.inner.apply_chat_template(messages, **kwargs)


def test_a_megabyte_prompt_is_refused_without_tokenizing_it():
    counted = tiny_lm()
    counted.tokenizer = CountingTokenizer(counted.tokenizer)
    word = "a" * (1 << 20)  # one word: the slowest kind of text to tokenize
    with RunningServer(create_app(counted)) as running:
        for path, body in [
            ("/v1/completions", {"model": MODEL, "prompt": word}),
            ("/v1/chat/completions", {**GOOD, "messages": [{"role": "user", "content": word}]}),
            (
                "/v1/completions",
                {
                    "model": MODEL,
                    "prompt": "ab",
                    "prediction": {"type": "content", "content": word},
                },
            ),
        ]:
            response = httpx.post(running.url + path, json=body, timeout=30)
            assert response.status_code == 400, response.text
            message = response.json()["error"]["message"]
            assert "\n" not in message and "characters" in message
        ok = httpx.post(running.url + "/v1/completions", json={"model": MODEL, "prompt": "ab"})
        assert ok.status_code == 200
    assert counted.tokenizer.lengths and max(counted.tokenizer.lengths) < 1000


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"prompt": [5, 99]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": "a", "echo": True}, "echo"),
        ({"prompt": "a", "best_of": 3}, "best_of"),
    ],
)
def test_bad_completion_request_is_a_400(server, extra, param):
    response = httpx.post(server.url + "/v1/completions", json={"model": MODEL, **extra})
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_openai_client_sees_bad_requests_as_bad_request_errors(server):
    with pytest.raises(openai.BadRequestError) as info:
        server.client().chat.completions.create(model="gpt-17", messages=MESSAGES)
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        chat(server.client(), n=17)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_body_over_4_mib_is_a_413(server, chunked):
    big = json.dumps({**GOOD, "messages": [{"role": "user", "content": "a" * (5 << 20)}]}).encode()
    content = iter([big[i : i + 65536] for i in range(0, len(big), 65536)]) if chunked else big
    try:
        response = httpx.post(
            server.url + "/v1/chat/completions",
            content=content,
            headers={"Content-Type": "application/json"},
        )
    except httpx.WriteError:  # the server may close the connection before reading it all
        pytest.fail("the server closed the connection instead of answering 413")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_max_body_bytes_is_a_setting_and_an_option_ofserve_completions(lm):
    with RunningServer(create_app(lm, ServerSettings(max_body_bytes=200))) as running:
        small = httpx.post(running.url + "/v1/chat/completions", json=GOOD)
        assert small.status_code == 200
        padded = {**GOOD, "user": "x" * 200}
        large = httpx.post(running.url + "/v1/chat/completions", json=padded)
        assert large.status_code == 413 and "200 bytes" in large.json()["error"]["message"]
    help_text = CliRunner().invoke(cli_main, ["serve", "--help"]).output
    assert "--max-body-bytes" in help_text and "4194304" in help_text
    refused = CliRunner().invoke(cli_main, ["serve", "--max-body-bytes", "0"])
    assert refused.exit_code == 2 and "--max-body-bytes" in refused.output


def test_settings_are_checked_like_the_options():
    from promptlookup.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="--max-queue"):
        ServerSettings(max_queue=0)
    with pytest.raises(InvalidParameterError, match="--log-level"):
        ServerSettings(log_level="loud")


def test_unknown_path_is_a_404_with_openai_error_json(server):
    response = httpx.get(server.url + "/v1/engines")
    assert response.status_code == 404 and "message" in response.json()["error"]


# -- API key ---------------------------------------------------------------------------------


def test_api_key_is_required_on_v1_but_not_on_health(lm):
    with RunningServer(create_app(lm, ServerSettings(api_key="s3cret"))) as running:
        with pytest.raises(openai.AuthenticationError):
            chat(running.client(api_key="wrong"), max_tokens=2)
        missing = httpx.get(running.url + "/v1/models")
        assert missing.status_code == 401
        assert missing.json()["error"]["code"] == "invalid_api_key"
        basic = httpx.get(running.url + "/v1/models", headers={"Authorization": "Basic s3cret"})
        assert basic.status_code == 401
        assert chat(running.client(api_key="s3cret"), max_tokens=2).choices
        assert httpx.get(running.url + "/health").status_code == 200


def test_under_an_api_key_unknown_v1_paths_need_the_key_too(lm):
    with RunningServer(create_app(lm, ServerSettings(api_key="s3cret"))) as running:
        for method, path in [
            ("GET", "/v1/engines"),
            ("POST", "/v1/models"),
            ("DELETE", "/v1/chat/completions"),
            ("GET", "/v1"),
        ]:
            response = httpx.request(method, running.url + path)
            assert response.status_code == 401, (method, path)
            assert response.json()["error"]["code"] == "invalid_api_key"
        key = {"Authorization": "Bearer s3cret"}
        assert httpx.get(running.url + "/v1/engines", headers=key).status_code == 404
        assert httpx.post(running.url + "/v1/models", headers=key).status_code == 405
        assert httpx.get(running.url + "/nowhere").status_code == 404  # outside /v1: no key


# -- load and cancellation -------------------------------------------------------------------


def test_full_queue_answers_429_instead_of_waiting(gated):
    running, target = gated  # one generation runs, max_queue=1 may wait
    client, outcomes = running.client(), {}

    def request(name):
        try:
            outcomes[name] = chat(client, temperature=0, max_tokens=8)
        except Exception as exc:  # reported by the asserts below
            outcomes[name] = exc

    target.gate.clear()
    first = threading.Thread(target=request, args=("first",))
    first.start()
    wait_until(target.blocked.is_set, what="the first generation to start")
    second = threading.Thread(target=request, args=("second",))
    second.start()
    wait_until(lambda: running.worker.waiting == 1, what="the second request to queue")
    with pytest.raises(openai.RateLimitError) as info:
        chat(client, max_tokens=8)
    assert info.value.status_code == 429 and info.value.code == "queue_full"
    assert 1 <= int(info.value.response.headers["retry-after"]) <= 60  # from recent jobs' times
    target.gate.set()
    first.join(60)
    second.join(60)
    assert all(isinstance(outcomes[n], openai.types.chat.ChatCompletion) for n in outcomes)
    assert len(outcomes) == 2


def _cancel_while_blocked(running, target, disconnect) -> None:
    """With a generation blocked inside a forward pass, ``disconnect()``; then check the job is
    cancelled, no further forward pass starts, and the worker is free for the next request."""
    job = wait_until(lambda: running.worker.current, what="the generation to start")
    wait_until(target.blocked.is_set, what="a forward pass at the gate")
    disconnect()
    wait_until(job.cancelled.is_set, what="the disconnect to cancel the job")
    calls = target.forward_calls
    target.gate.set()  # let the forward pass in progress finish
    wait_until(lambda: running.worker.idle, what="the worker to become idle")
    assert target.forward_calls == calls  # stopped within the decoding step under way
    assert running.worker.cancelled == 1
    after = chat(running.client(), temperature=0, max_tokens=4)
    assert after.choices[0].message.content is not None


def test_streaming_client_disconnect_cancels_the_generation(gated):
    running, target = gated
    target.gate.clear()
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 300, "stream": True}
    client = httpx.Client(timeout=60)
    stream = client.stream("POST", running.url + "/v1/chat/completions", json=body)
    response = stream.__enter__()
    lines = response.iter_lines()  # (discarding a half-read iterator would close the connection)
    first = next(lines)
    assert json.loads(first.removeprefix("data: "))["choices"][0]["delta"]["role"] == "assistant"

    def disconnect():
        stream.__exit__(None, None, None)
        client.close()

    _cancel_while_blocked(running, target, disconnect)


def test_non_streaming_client_disconnect_cancels_the_generation(gated):
    running, target = gated
    target.gate.clear()
    body = json.dumps({"model": MODEL, "messages": MESSAGES, "max_tokens": 300}).encode()
    sock = socket.create_connection(("127.0.0.1", running.port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    _cancel_while_blocked(running, target, sock.close)


def test_a_failing_generation_is_a_500_and_the_server_goes_on(gated):
    running, target = gated
    client = running.client()
    target.fail = True
    with pytest.raises(openai.InternalServerError) as info:
        chat(client, max_tokens=8)
    # The forward pass failed: it says so, with nothing of the exception's own text.
    assert info.value.status_code == 500 and "forward pass" in info.value.message
    assert "injected failure" not in info.value.message
    with pytest.raises(openai.APIError, match="forward pass"):  # after the stream began
        list(chat(client, max_tokens=8, stream=True))
    target.fail = False
    assert chat(client, temperature=0, max_tokens=4).choices[0].finish_reason in ("stop", "length")
    assert running.worker.failed == 2


# -- model loading ---------------------------------------------------------------------------


def test_health_is_503_until_the_background_load_finishes():
    release = threading.Event()

    def load():
        release.wait(60)
        return tiny_lm()

    with RunningServer(create_app(load, ServerSettings(model_id=MODEL))) as running:
        loading = httpx.get(running.url + "/health")
        assert loading.status_code == 503 and loading.json()["status"] == "loading"
        early = httpx.get(running.url + "/v1/models")
        assert early.status_code == 503 and early.json()["error"]["code"] == "model_loading"
        assert early.headers["retry-after"] == "5"  # seconds to wait before trying again
        release.set()
        wait_until(
            lambda: httpx.get(running.url + "/health").status_code == 200, what="the model to load"
        )
        assert chat(running.client(), max_tokens=3).usage.completion_tokens >= 1


def test_a_failed_load_is_reported_by_health():
    failures = []

    def load():
        raise ModelLoadError("corrupt.gguf: cannot load GGUF")

    app = create_app(load, ServerSettings(model_id=MODEL), on_load_error=failures.append)
    with RunningServer(app) as running:
        wait_until(lambda: failures, what="the load to fail")
        health = httpx.get(running.url + "/health")
        assert health.status_code == 503
        assert health.json()["status"] == "failed" and "corrupt.gguf" in health.json()["error"]
    assert failures == ["corrupt.gguf: cannot load GGUF"]


# -- command line ----------------------------------------------------------------------------


def test_serve_help_documents_the_endpoints():
    result = CliRunner().invoke(cli_main, ["serve", "--help"])
    assert result.exit_code == 0
    for text in ("/v1/chat/completions", "/health", "--api-key", "--max-queue", "127.0.0.1"):
        assert text in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "/no/such/model.gguf"], "no such model"),
        (["--drafter", "sorcery"], "unknown drafter"),
    ],
)
def test_serve_rejects_bad_settings_before_listening(args, message):
    result = CliRunner().invoke(cli_main, ["serve", *args])
    assert result.exit_code == 1 and message in result.output


# -- the real default model ------------------------------------------------------------------


@pytest.mark.slow
def test_default_model_answers_like_the_library_and_drafts_from_the_prediction(default_lm):
    messages = [{"role": "user", "content": "Repeat exactly: alpha beta gamma delta epsilon"}]
    expected = default_lm.generate(messages, max_new_tokens=16, temperature=0, drafter="none")
    with RunningServer(create_app(default_lm, ServerSettings(generation_options=FIXED))) as running:
        response = running.client().chat.completions.create(
            model=default_lm.name,
            messages=messages,
            temperature=0,
            max_tokens=16,
            prediction={"type": "content", "content": expected.text},
        )
    assert response.choices[0].message.content == expected.text
    assert response.usage.speculative["accepted_tokens"] > 0


# -- numbers and types checked at the edge ---------------------------------------------------


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"seed": 2**64}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"temperature": 1e-38}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": "1"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"temperature": 1, "repetition_penalty": 1e-40}, "repetition_penalty"),
        ({"temperature": 0, "repetition_penalty": 1e-40}, "repetition_penalty"),
        ({"repetition_penalty": 1e40}, "repetition_penalty"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": "8"}, "max_tokens"),
        ({"max_tokens": 2**40}, "max_tokens"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.0}, "top_k"),
        ({"logprobs": 0}, "logprobs"),
        ({"stream": "yes"}, "stream"),
        ({"n": True}, "n"),
        ({"presence_penalty": 3}, "presence_penalty"),
    ],
)
def test_numbers_that_would_reach_torch_out_of_range_or_mistyped_are_400s(server, extra, param):
    response = httpx.post(server.url + "/v1/chat/completions", json={**GOOD, **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_the_extreme_legal_numbers_generate(server):
    for extra in (
        {"seed": 2**63 - 1, "temperature": 2},
        {"seed": -(2**63)},
        {"temperature": 1e-4, "repetition_penalty": 0.01},
        {"temperature": 0, "repetition_penalty": 100},
    ):
        response = httpx.post(
            server.url + "/v1/chat/completions", json={**GOOD, "max_tokens": 4, **extra}
        )
        assert response.status_code == 200, (extra, response.text)


def test_a_model_is_retrieved_by_its_id_and_an_unknown_id_is_a_404(server):
    client = server.client()
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-17")
    assert info.value.code == "model_not_found"


def test_usage_counts_the_prediction_tokens_as_openai_does(server, lm):
    """accepted: reported completion tokens that were accepted drafts from the prediction;
    rejected: the prediction's other tokens (the tiny tokenizer: one token per character)."""
    answer = chat(server.client(), temperature=0, max_tokens=24).choices[0].message.content

    def usage(prediction: str, **extra) -> dict:
        body = {**GOOD, "max_tokens": 24, "temperature": 0, **extra}
        body["prediction"] = {"type": "content", "content": prediction}
        return httpx.post(server.url + "/v1/chat/completions", json=body).json()["usage"]

    whole = usage(answer)
    details = whole["completion_tokens_details"]
    assert 0 < details["accepted_prediction_tokens"] <= whole["completion_tokens"]
    assert details["accepted_prediction_tokens"] <= whole["speculative"]["accepted_tokens"]
    assert (
        details["rejected_prediction_tokens"] == len(answer) - details["accepted_prediction_tokens"]
    )
    # An empty prediction drafts nothing of its own: nothing accepted or rejected from it,
    # whatever the prompt's drafts did.
    empty = usage("")
    assert empty["completion_tokens_details"]["accepted_prediction_tokens"] == 0
    assert empty["completion_tokens_details"]["rejected_prediction_tokens"] == 0
    # A stop string cuts the answer: only the reported tokens count.
    stop = answer[len(answer) // 2 : len(answer) // 2 + 2]
    cut = usage(answer, stop=[stop])
    accepted = cut["completion_tokens_details"]["accepted_prediction_tokens"]
    assert cut["completion_tokens"] < whole["completion_tokens"]
    assert accepted <= cut["completion_tokens"]
    assert cut["completion_tokens_details"]["rejected_prediction_tokens"] == len(answer) - accepted


def test_a_body_that_stops_arriving_is_a_408_and_frees_the_connection(lm):
    import socket
    from urllib.parse import urlparse

    with RunningServer(create_app(lm, ServerSettings(body_timeout=0.5))) as running:
        address = urlparse(running.url)
        with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
            head = (
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
            )
            sock.sendall(head + b'{"model": "tiny", "messages": [' + b" " * 150)  # then silence
            parts = []  # the answer may come in several segments; the server then closes
            while part := sock.recv(65536):
                parts.append(part)
            answer = b"".join(parts).decode()
        assert answer.startswith("HTTP/1.1 408")
        assert '"code":"request_timeout"' in answer.replace(" ", "")
        assert chat(running.client(), max_tokens=2).choices  # the server goes on


def _closed_by_the_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (reading what it sends)."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    return True


def test_a_connection_that_never_completes_its_request_head_is_closed(lm):
    with RunningServer(create_app(lm, ServerSettings(header_timeout=0.2))) as running:
        with socket.create_connection(("127.0.0.1", running.port)) as silent:
            assert _closed_by_the_server(silent, within=10)
        with socket.create_connection(("127.0.0.1", running.port)) as partial:
            partial.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # no more
            assert _closed_by_the_server(partial, within=10)
        with socket.create_connection(("127.0.0.1", running.port)) as kept:
            kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # a whole request
            kept.settimeout(10)
            head, _, body = kept.recv(65536).partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            kept.sendall(b"GET /health HTTP/1.1\r\n")  # the next head, never finished
            assert _closed_by_the_server(kept, within=3)  # before uvicorn's 5 s keep-alive
        assert chat(running.client(), max_tokens=2).choices  # the server goes on


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: x\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=["request-line", "content-length", "chunk-size"],
)
def test_malformed_http_gets_openai_error_json(server, request_bytes):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request_bytes)
        parts = []
        while part := sock.recv(65536):  # the server answers, then closes
            parts.append(part)
    head, _, body = b"".join(parts).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_http_request"


def test_a_client_that_leaves_mid_body_is_one_log_line(server, caplog):
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="promptlookup.server")

    def about_this_client():  # (other tests' connections may be logged meanwhile)
        return [r for r in caplog.records if f":{port}" in r.getMessage() or r.exc_info]

    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            port = sock.getsockname()[1]
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
                b'{"model": "tiny", "messages": ['
            )  # then it leaves
        wait_until(about_this_client, what="the departure to be logged")
        assert chat(server.client(), max_tokens=2).choices  # the server goes on
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    (record,) = about_this_client()
    assert record.levelno == logging.INFO and record.exc_info is None
    assert "\n" not in record.getMessage()
    assert "left before sending its whole request body" in record.getMessage()


def test_a_queued_request_whose_client_left_frees_its_slot(gated):
    running, target = gated  # one generation runs, max_queue=1 may wait
    target.gate.clear()
    results = {}
    first = threading.Thread(
        target=lambda: results.update(first=chat(running.client(), temperature=0, max_tokens=4))
    )
    first.start()
    wait_until(target.blocked.is_set, what="the first generation to start")
    body = json.dumps({"model": MODEL, "messages": MESSAGES, "max_tokens": 4}).encode()
    sock = socket.create_connection(("127.0.0.1", running.port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    wait_until(lambda: running.worker.waiting == 1, what="the second request to queue")
    sock.close()  # its client leaves while it waits
    wait_until(lambda: running.worker.waiting == 0, what="the disconnect to cancel it")
    third = threading.Thread(
        target=lambda: results.update(third=chat(running.client(), temperature=0, max_tokens=4))
    )
    third.start()  # takes the slot the second left: no 429
    wait_until(lambda: running.worker.waiting == 1, what="the third request to queue")
    target.gate.set()
    first.join(60)
    third.join(60)
    assert set(results) == {"first", "third"} and running.worker.cancelled == 1


def test_sigterm_ends_the_running_stream_with_an_error_event_and_answers_the_queued(gated):
    import signal

    running, target = gated  # one generation runs, max_queue=1 may wait
    target.gate.clear()
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 300, "stream": True}
    lines, queued = [], {}

    def stream():
        with httpx.stream(
            "POST", running.url + "/v1/chat/completions", json=body, timeout=60
        ) as response:
            lines.extend(response.iter_lines())

    def waiting():  # a streamed request still queued gets its 503 as JSON, not a 200
        queued["response"] = httpx.post(
            running.url + "/v1/chat/completions",
            timeout=60,
            json={"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "stream": True},
        )

    first = threading.Thread(target=stream)
    first.start()
    wait_until(target.blocked.is_set, what="the stream's generation to start")
    second = threading.Thread(target=waiting)
    second.start()
    wait_until(lambda: running.worker.waiting == 1, what="the second request to queue")
    running.server.handle_exit(signal.SIGTERM, None)  # what uvicorn does on SIGTERM
    second.join(60)
    target.gate.set()
    first.join(60)
    assert queued["response"].status_code == 503
    assert queued["response"].json()["error"]["code"] == "server_shutting_down"
    events = [line for line in lines if line]  # blank lines separate server-sent events
    assert "event: error" in events and events[-1] == "data: [DONE]"
    assert "server_shutting_down" in events[events.index("event: error") + 1]


def test_long_texts_are_tokenized_a_chunk_at_a_time_and_only_up_to_the_context():
    """A prediction (or prompt) of 60,000 characters, under the character limit, is refused
    after its first chunk: never tokenized whole while other requests wait for the tokenizer,
    and a prediction is bounded in tokens by the context (the tiny tokenizer: one token per
    character, a context of 512)."""
    from conftest import TinyTokenizer

    from promptlookup.generation import LanguageModel
    from promptlookup.server.texts import CHUNK, chunks

    pieces = []

    class Spy(TinyTokenizer):
        def __call__(self, text, add_special_tokens=True):
            pieces.append(len(text))
            return super().__call__(text, add_special_tokens)

    tiny = tiny_lm()
    lm = LanguageModel(tiny.target, Spy(32), name=MODEL, model=tiny.model)
    long, short = "abcd " * 12_000, "abcd " * 40
    assert "".join(chunks(long)) == long and max(map(len, chunks(long))) <= CHUNK

    def ask(**body) -> httpx.Response:
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, **body}
        return httpx.post(running.url + "/v1/chat/completions", json=body, timeout=60)

    with RunningServer(create_app(lm)) as running:
        assert len(long) < running.state.max_text_chars  # the character check lets it in
        answer = ask(prediction={"type": "content", "content": long})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "prediction"
        assert len(pieces) == 1 and pieces[0] <= CHUNK  # one chunk: enough to refuse
        pieces.clear()
        answer = ask(messages=[{"role": "user", "content": long}])
        assert answer.status_code == 400
        assert answer.json()["error"]["code"] == "context_length_exceeded"
        assert len(pieces) == 1 and pieces[0] <= CHUNK
        # A prediction within the context is tokenized whole and drafted from.
        assert ask(prediction={"type": "content", "content": short}).status_code == 200


def test_a_client_that_half_closes_after_its_request_has_gone():
    """Documented (docs/server.md): a client that shuts down its sending side after a
    complete request is taken to have left, as uvicorn reports the end of its input as a
    disconnect; its generation is cancelled and nothing is sent."""
    with RunningServer(create_app(tiny_lm(gated=True))) as running:
        target = running.state.lm.target
        target.gate.clear()
        body = json.dumps({"model": MODEL, "messages": MESSAGES, "max_tokens": 50}).encode()
        with socket.create_connection(("127.0.0.1", running.port), timeout=30) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
            )
            wait_until(target.blocked.is_set, what="the generation to start")
            job = running.worker.current
            sock.shutdown(socket.SHUT_WR)  # half-close: the request is complete
            wait_until(job.cancelled.is_set, what="the end of input to cancel the job")
            target.gate.set()
            wait_until(lambda: running.worker.cancelled == 1, what="the generation to end")
            assert sock.recv(1024) == b""  # no answer: the connection is closed


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_the_longest_token_is_read_in_chunks_as_the_whole_vocabulary_says(default_lm, chunk):
    from promptlookup.server.state import longest_token_chars

    tokenizer = default_lm.tokenizer
    assert longest_token_chars(tokenizer, chunk) == max(map(len, tokenizer.get_vocab()))


def test_serve_answers_to_the_model_name_it_was_given_as_well_as_the_files(monkeypatch):
    """``promptlookup serve --model NAME``: requests for NAME are served, not only for the
    model file's own name (the served id)."""
    import promptlookup.server.app as app_module
    from promptlookup.models import default_gguf_path

    seen = {}

    def create_app(load, settings, **options):
        seen["settings"] = settings
        raise SystemExit(0)  # no server started

    monkeypatch.setattr(app_module, "create_app", create_app)
    path = str(default_gguf_path())
    assert CliRunner().invoke(cli_main, ["serve", "--model", path]).exit_code == 0
    settings = seen["settings"]
    assert settings.model_id == "SmolLM2-135M-Instruct.Q4_1" and path in settings.model_alias
    assert CliRunner().invoke(cli_main, ["serve"]).exit_code == 0
    assert seen["settings"].model_alias == ()


def test_a_chunk_of_ids_without_tokens_leaves_the_longest_token_as_it_was():
    from promptlookup.server.state import longest_token_chars

    class Gaps:  # ids 1 and 2 stand for nothing
        def __len__(self):
            return 4

        def convert_ids_to_tokens(self, ids):
            return [None if i in (1, 2) else "ab" * (i + 1) for i in ids]

    assert [longest_token_chars(Gaps(), chunk) for chunk in (1, 2, 4)] == [8, 8, 8]
