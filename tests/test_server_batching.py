"""Continuous batching in the server: concurrent requests share forward passes, and each
gets exactly the answer it gets alone; one client's disconnect changes no other answer."""

from __future__ import annotations

import json
import threading

import httpx
from _server import MODEL, RunningServer, tiny_lm, wait_until

from promptlookup.server import ServerSettings, create_app
from promptlookup.server.batch_worker import BatchWorker

PROMPTS = [
    "abcd abcd abcd",
    "xyz xyz xy",
    "hello hello hello he",
    "abab cdcd abab cd",
    "the cat the cat the",
    "qrs qrs qrs qrs",
]


class WidestPass:
    """Records the most sequences any forward pass carried."""

    def __init__(self, target) -> None:
        self.target, self.widest = target, 0
        real = target.forward_batch

        def forward_batch(caches, token_ids, keep):
            self.widest = max(self.widest, len(caches))
            return real(caches, token_ids, keep)

        target.forward_batch = forward_batch


def body(content: str, **extra) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 24,
        "temperature": 0,
        **extra,
    }


def answers_at_once(url: str, bodies: list[dict], sent=lambda: None) -> list[dict]:
    """Send every body at the same time; the answers in order (``sent()`` runs once every
    request is on its way)."""
    answers: list[dict | None] = [None] * len(bodies)

    def send(index: int) -> None:
        answers[index] = httpx.post(
            url + "/v1/chat/completions", json=bodies[index], timeout=60
        ).json()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    sent()
    for thread in threads:
        thread.join(60)
    return answers


def test_concurrent_requests_share_passes_and_get_their_one_by_one_answers():
    bodies = [body(p) for p in PROMPTS] + [body(PROMPTS[0], temperature=0.9, seed=7, n=3)]
    with RunningServer(create_app(tiny_lm(), ServerSettings(max_batch=1))) as alone:
        assert type(alone.worker) is BatchWorker  # one worker for every max_batch
        want = [
            httpx.post(alone.url + "/v1/chat/completions", json=b, timeout=60).json()
            for b in bodies
        ]
    lm = tiny_lm(gated=True)
    widest = WidestPass(lm.target)

    def all_queued() -> None:  # the first request's first pass waits until the rest queue
        wait_until(
            lambda: batched.worker.waiting + batched.worker.running == len(bodies),
            what="every request to be in",
        )
        lm.target.gate.set()

    # Prompts go in 5 tokens a step while others decode (--prefill-tokens): chunked, unchanged.
    with RunningServer(create_app(lm, ServerSettings(max_batch=4, prefill_tokens=5))) as batched:
        assert isinstance(batched.worker, BatchWorker)
        assert batched.worker.decoder.prefill_tokens == 5
        lm.target.gate.clear()
        got = answers_at_once(batched.url, bodies, all_queued)
        health = httpx.get(batched.url + "/health").json()
    assert widest.widest > 1  # requests did share forward passes
    for want_answer, got_answer in zip(want, got):
        assert [c["message"]["content"] for c in got_answer["choices"]] == [
            c["message"]["content"] for c in want_answer["choices"]
        ]
        assert got_answer["usage"]["completion_tokens"] == want_answer["usage"]["completion_tokens"]
    assert health["queue"]["max_batch"] == 4


def test_one_disconnecting_stream_changes_no_other_answer():
    lm = tiny_lm(gated=True)
    target, real, shared = lm.target, lm.target.forward_batch, threading.Event()

    def forward_batch(caches, token_ids, keep):  # the first pass of both waits at the gate
        if len(caches) == 2 and not shared.is_set():
            shared.set()
            target.gate.clear()
        return real(caches, token_ids, keep)

    target.forward_batch = forward_batch
    with RunningServer(create_app(lm, ServerSettings(max_batch=4))) as running:
        want = httpx.post(
            running.url + "/v1/chat/completions", json=body(PROMPTS[1]), timeout=60
        ).json()["choices"][0]["message"]["content"]
        target.gate.clear()  # the leaving request waits in its first pass ...
        client = httpx.Client(timeout=60)
        leaving = client.stream(
            "POST",
            running.url + "/v1/chat/completions",
            json=body(PROMPTS[0], max_tokens=400, stream=True),
        )
        response = leaving.__enter__()
        lines = response.iter_lines()
        next(lines)  # the first chunk: the request is in
        wait_until(target.blocked.is_set, what="the leaving request's first pass")
        staying: dict = {}
        thread = threading.Thread(
            target=lambda: staying.update(
                httpx.post(
                    running.url + "/v1/chat/completions", json=body(PROMPTS[1]), timeout=60
                ).json()
            )
        )
        thread.start()
        wait_until(lambda: running.worker.waiting == 1, what="the staying request to queue")
        target.gate.set()  # ... until the staying one has queued, so that both share passes
        wait_until(shared.is_set, what="a pass over both requests")
        wait_until(target.blocked.is_set, what="that pass at the gate")
        leaving.__exit__(None, None, None)
        client.close()
        wait_until(
            lambda: any(entry.job.cancelled.is_set() for entry in running.worker.jobs.values()),
            what="the disconnect to cancel the leaving request",
        )
        target.gate.set()
        thread.join(60)
        wait_until(lambda: running.worker.idle, what="the worker to become idle")
        assert running.worker.cancelled == 1
    assert staying["choices"][0]["message"]["content"] == want


def test_a_streamed_batched_answer_concatenates_to_the_non_streamed_one():
    lm = tiny_lm()
    with RunningServer(create_app(lm, ServerSettings(max_batch=3))) as running:
        plain = answers_at_once(running.url, [body(p) for p in PROMPTS[:3]])
        with httpx.stream(
            "POST",
            running.url + "/v1/chat/completions",
            json=body(PROMPTS[2], stream=True, logprobs=True, top_logprobs=2),
            timeout=60,
        ) as response:
            chunks = [
                json.loads(line.removeprefix("data: "))
                for line in response.iter_lines()
                if line.startswith("data: {")
            ]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == plain[2]["choices"][0]["message"]["content"]
    tokens = [
        entry
        for c in chunks
        if c["choices"] and c["choices"][0].get("logprobs")
        for entry in c["choices"][0]["logprobs"]["content"]
    ]
    assert "".join(entry["token"] for entry in tokens) == text


def test_shutdown_ends_every_running_job_of_the_batch_with_server_shutting_down():
    """On SIGTERM the server calls ``worker.shutdown()`` without a reason: each job of the
    batch ends with the shutdown's (``server_shutting_down``), not with "cancelled" (only the
    latest admitted job used to get it)."""
    import asyncio

    from promptlookup.server.batch_worker import _Running
    from promptlookup.server.worker import GenerationJob

    worker = BatchWorker(tiny_lm(), max_batch=3)

    async def jobs() -> list[GenerationJob]:  # jobs are made on the event loop they report to
        return [GenerationJob([1, 2, 3], 8) for _ in range(3)]

    running = [_Running(job, {}) for job in asyncio.run(jobs())]
    worker.jobs = {object(): entry for entry in running}  # three sequences in the batch
    worker.current = running[-1].job
    worker.shutdown()
    for entry in running:
        assert entry.job.cancelled.is_set()
        assert entry.job.reason is not None and entry.job.reason.code == "server_shutting_down"


def test_a_target_of_one_sequence_at_a_time_is_served_by_the_same_worker():
    """llama.cpp's kind of target (no forward_batch) runs on the one worker too, a batch of
    one (batching.SerialTarget): the answers are the batch-capable target's."""
    from test_batching import PlainTarget

    from promptlookup.generation import LanguageModel

    bodies = [body(p) for p in PROMPTS[:3]] + [body(PROMPTS[0], temperature=0.9, seed=7, n=2)]
    with RunningServer(create_app(tiny_lm(), ServerSettings(max_batch=1))) as batching:
        want = [
            httpx.post(batching.url + "/v1/chat/completions", json=b, timeout=60).json()
            for b in bodies
        ]
    lm = tiny_lm()
    plain = LanguageModel(PlainTarget(lm.target), lm.tokenizer, name=MODEL, model=lm.model)
    with RunningServer(create_app(plain, ServerSettings())) as serial:
        assert isinstance(serial.worker, BatchWorker) and serial.worker.max_batch == 1
        got = answers_at_once(serial.url, bodies)  # queued, then one at a time
    for want_answer, got_answer in zip(want, got):
        assert [c["message"]["content"] for c in got_answer["choices"]] == [
            c["message"]["content"] for c in want_answer["choices"]
        ]


def test_freed_memory_goes_back_after_a_pass_with_a_long_prompts_chunk(monkeypatch):
    """A long prompt's chunks free tens of MiB each, which the heap would keep and grow: the
    worker gives freed memory back after a pass that carried at least
    ``RETURN_AFTER_PROMPT_TOKENS`` prompt tokens (without collecting Python's garbage), and
    not after decoding steps."""
    from promptlookup.server import batch_worker

    given_back = []
    monkeypatch.setattr(batch_worker, "RETURN_AFTER_PROMPT_TOKENS", 12)
    monkeypatch.setattr(
        batch_worker, "return_freed_memory", lambda **options: given_back.append(options)
    )
    with RunningServer(create_app(tiny_lm(), ServerSettings(max_batch=2))) as running:
        short = httpx.post(running.url + "/v1/chat/completions", json=body("ab"), timeout=60)
        assert short.status_code == 200
        assert {"collect": False} not in given_back
        long = httpx.post(running.url + "/v1/chat/completions", json=body(PROMPTS[2] * 3))
        assert long.status_code == 200
    assert given_back.count({"collect": False}) == 1  # its one chunk, no decoding step
