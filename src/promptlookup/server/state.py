"""The server's state: the model (loaded in the background or given), its worker, settings,
and the uvicorn server class that starts a graceful shutdown."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Union

import uvicorn

from ..backends.base import BatchTarget
from ..batching import PREFILL_TOKENS, default_max_batch
from ..errors import PromptLookupError
from ..generation import LanguageModel
from .batch_worker import BatchWorker
from .schemas import APIError
from .worker import GenerationWorker, shutting_down

log = logging.getLogger("promptlookup.server")

ModelOrLoader = Union[LanguageModel, Callable[[], LanguageModel]]


class ServerState:
    """The model (once loaded), its worker, and the server's settings."""

    def __init__(
        self,
        model: ModelOrLoader,
        *,
        model_id,
        api_key,
        max_queue,
        max_body_bytes,
        default_max_tokens,
        drafter,
        drafter_options,
        generation_options,
        on_load_error,
        body_timeout,
        max_batch=None,
        prefill_tokens=None,
    ) -> None:
        self.loader = model if not isinstance(model, LanguageModel) else None
        self.lm: LanguageModel | None = model if isinstance(model, LanguageModel) else None
        self.model_id = model_id or (self.lm.name if self.lm is not None else "promptlookup")
        self._named = model_id is not None
        self.api_key = api_key
        self.max_queue = max_queue
        #: Sequences per forward pass (None: the default for the model and machine; 1: one
        #: generation at a time).
        self.max_batch = max_batch
        self.prefill_tokens = prefill_tokens or PREFILL_TOKENS  # while others decode
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.default_max_tokens = default_max_tokens
        self.drafter = drafter
        self.drafter_options = dict(drafter_options or {})
        self.generation_options = dict(generation_options or {})
        self.on_load_error = on_load_error
        self.worker: GenerationWorker | None = None
        self.status = "loading"
        self.load_error: str | None = None
        self.tokenizer_lock = threading.Lock()  # request threads encode one at a time
        self.fingerprint: str | None = None
        self.shutting_down = False

    def start(self) -> None:
        if self.lm is not None:
            self._ready(self.lm)
        else:
            threading.Thread(target=self._load, name="promptlookup-load", daemon=True).start()

    def _load(self) -> None:
        try:
            self._ready(self.loader())
        except Exception as exc:  # a PromptLookupError is one line; anything else gets its type
            self.load_error = (
                str(exc) if isinstance(exc, PromptLookupError) else f"{type(exc).__name__}: {exc}"
            )
            self.status = "failed"
            log.error("model loading failed: %s", self.load_error)
            if self.on_load_error is not None:
                self.on_load_error(self.load_error)

    def _ready(self, lm: LanguageModel) -> None:
        self.lm = lm
        if not self._named:
            self.model_id = lm.name
        self.fingerprint = fingerprint(lm)
        max_batch = self.max_batch
        if isinstance(lm.target, BatchTarget):
            max_batch = max_batch or default_max_batch(lm.target)
        else:  # a target that runs one sequence at a time (llama.cpp)
            max_batch = 1
        self.max_batch = max_batch
        self.worker = (
            BatchWorker(lm, self.max_queue, self.tokenizer_lock, max_batch, self.prefill_tokens)
            if max_batch > 1
            else GenerationWorker(lm, self.max_queue, tokenizer_lock=self.tokenizer_lock)
        )
        self.worker.start()
        self.status = "ready"
        if self.shutting_down:
            self.worker.shutdown()

    def begin_shutdown(self) -> None:
        """Stop taking requests and end the queued and running ones (see the module's
        *Shutdown*)."""
        self.shutting_down = True
        if self.worker is not None:
            self.worker.shutdown()

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()

    def ready_model(self) -> LanguageModel:
        if self.shutting_down:
            raise shutting_down()
        if self.status == "ready":
            return self.lm
        message = (
            "the model is still loading"
            if self.status == "loading"
            else f"the model failed to load: {self.load_error}"
        )
        raise APIError(
            503,
            message,
            type="server_error",
            code=f"model_{self.status}",
            headers={"Retry-After": "5"} if self.status == "loading" else None,
        )

    def model_card(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": 0, "owned_by": "promptlookup"}


def fingerprint(lm: LanguageModel) -> str:
    """OpenAI's ``system_fingerprint``: changes when the package version, the model or its
    dtype change (what can change outputs), not with the drafter (which cannot)."""
    import hashlib

    from .. import __version__

    dtype = getattr(getattr(lm, "model", None), "dtype", "")
    key = f"{__version__}|{lm.name}|{dtype}|{type(lm.target).__name__}"
    return "fp_" + hashlib.sha256(key.encode()).hexdigest()[:12]


class Server(uvicorn.Server):
    """uvicorn's server that tells the app when a shutdown begins (SIGTERM, SIGINT), before
    uvicorn waits for open connections: so that queued requests are answered and running
    streams end with an error event and ``[DONE]`` instead of being cut."""

    def handle_exit(self, sig, frame) -> None:
        state = getattr(getattr(self.config.app, "state", None), "server", None)
        if state is not None:
            state.begin_shutdown()
        super().handle_exit(sig, frame)
