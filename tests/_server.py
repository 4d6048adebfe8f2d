"""Helpers of the server tests: a real uvicorn server on 127.0.0.1 over a tiny model, targets
that block (for load and cancellation) or are row-invariant (for exact logprobs)."""

from __future__ import annotations

import threading
import time

import openai
import pytest
import torch
from conftest import TinyTokenizer, tiny_llama

from promptlookup.backends.hf.target import TorchTarget
from promptlookup.generation import LanguageModel
from promptlookup.server import Server

MODEL = "tiny"
CONTEXT = 512  # tiny_llama's max_position_embeddings
MESSAGES = [{"role": "user", "content": "abcd abcd abcd"}]
# Drafting decisions that do not depend on timing, so statistics are reproducible.
FIXED = {"speculation": "fixed"}


def wait_until(condition, timeout: float = 30.0, what: str = "condition"):
    """Poll ``condition()`` until it is truthy (returned) or the deadline passes (fail)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.005)
    pytest.fail(f"timed out waiting for {what}")


class GatedTarget:
    """A target whose forward passes wait until ``gate`` is set, and can be made to fail."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.gate.set()
        self.blocked = threading.Event()  # set while a forward pass waits at the gate
        self.forward_calls = 0
        self.fail = False

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, token_ids):
        self._pass()
        return self.inner.forward(token_ids)

    def forward_batch(self, caches, token_ids, keep):
        self._pass()
        return self.inner.forward_batch(caches, token_ids, keep)

    def _pass(self) -> None:
        self.forward_calls += 1
        if self.fail:
            raise RuntimeError("injected failure")
        if not self.gate.is_set():
            self.blocked.set()
            if not self.gate.wait(timeout=60):
                raise RuntimeError("the test never opened the gate")
            self.blocked.clear()


class RowByRowTarget:
    """A target whose multi-token passes are one-token passes in a row: row-invariant by
    construction, so a verification row is bit for bit what plain decoding computes."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, token_ids):
        return torch.cat([self.inner.forward([token]) for token in token_ids])


class ShortContextTarget:
    """A target that claims a short context, so that every request stays small (fuzzing)."""

    def __init__(self, inner, max_context: int) -> None:
        self.inner = inner
        self.max_context = max_context

    def __getattr__(self, name):
        return getattr(self.inner, name)


def tiny_lm(
    gated: bool = False, row_by_row: bool = False, max_context: int | None = None
) -> LanguageModel:
    model = tiny_llama()
    target = TorchTarget(model)
    if row_by_row:
        target = RowByRowTarget(target)
    if gated:
        target = GatedTarget(target)
    if max_context is not None:
        target = ShortContextTarget(target, max_context)
    return LanguageModel(target, TinyTokenizer(32), name=MODEL, model=model)


class RunningServer:
    """uvicorn serving ``app`` on a free loopback port, in a background thread."""

    def __init__(self, app) -> None:
        self.app = app
        self.server = Server.for_app(
            app, host="127.0.0.1", port=0, log_level="warning", access_log=False
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> RunningServer:
        self.thread.start()
        wait_until(lambda: self.server.started, what="server start")
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    @property
    def state(self):
        return self.app.state.server

    @property
    def worker(self):
        return self.state.worker

    def client(self, api_key: str = "unused") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=60)
