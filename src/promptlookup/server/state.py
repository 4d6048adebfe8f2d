"""The server's state: the model (loaded in the background or given), its worker, settings,
and the uvicorn server class that starts a graceful shutdown."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Union

import uvicorn

from .. import cache_files
from ..backends.base import BatchTarget
from ..batching import PREFILL_TOKENS, default_max_batch
from ..drafters import TenantIndexes
from ..errors import InvalidParameterError, PromptLookupError
from ..generation import LanguageModel
from ..prefix_cache import DEFAULT_MIB, DEFAULT_MIB_WITH_DISK, PrefixCache
from .batch_worker import BatchWorker
from .bodies import ModelCard
from .connection import http_protocol
from .metrics import Metrics
from .reasoning import ThinkFormat
from .reasoning import detect as detect_reasoning
from .request_base import APIError
from .settings import ServerSettings
from .tenants import Tenants
from .tool_template import TemplateFormat, detect
from .worker import GenerationWorker, shutting_down

log = logging.getLogger("promptlookup.server")

ModelOrLoader = Union[LanguageModel, Callable[[], LanguageModel]]


class ServerState:
    """The model (once loaded), its worker, and the server's settings."""

    def __init__(
        self,
        model: ModelOrLoader,
        settings: ServerSettings,
        on_load_error: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.loader = model if not isinstance(model, LanguageModel) else None
        self.lm: LanguageModel | None = model if isinstance(model, LanguageModel) else None
        self.model_id = settings.model_id or (
            self.lm.name if self.lm is not None else "promptlookup"
        )
        #: Sequences per forward pass, resolved when the model is ready (1: one generation at
        #: a time).
        self.max_batch = settings.max_batch
        self.on_load_error = on_load_error
        self.worker: GenerationWorker | None = None
        self.status = "loading"
        self.load_error: str | None = None
        self.tokenizer_lock = threading.Lock()  # request threads encode one at a time
        #: The API keys and their tenants (``--api-key``, ``--api-keys-file``).
        self.tenants = Tenants.of(settings.api_key, settings.api_keys_file)
        #: The cross-request indexes by tenant, per ``--cross-request``.
        self.cross_request = TenantIndexes(settings.cross_request, settings.cross_request_tokens)
        #: Keys and values of recent sequences (``--prefix-cache-mib``; None: off, or a
        #: target where reuse would not be exact), made when the model is ready.
        self.prefix_cache: PrefixCache | None = None
        self.fingerprint: str | None = None
        #: How the chat template writes tool calls (None: it does not, or the model is not
        #: loaded yet; tools then go through the generic format, :mod:`.tools`).
        self.tool_template: TemplateFormat | None = None
        #: How the chat template marks a thinking model's reasoning (None: it does not, or
        #: --reasoning-format none: answers are all text), :mod:`.reasoning`.
        self.reasoning: ThinkFormat | None = None
        #: Characters beyond which a text cannot fit the context, however it tokenizes.
        self.max_text_chars = 0
        #: Pieces of a prompt a request body may have (:func:`.request_base.prompt_pieces`).
        self.max_pieces = 0
        self.shutting_down = False
        #: The Prometheus metrics of ``GET /metrics``, this server's own.
        self.metrics = Metrics(self)

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
        if self.settings.model_id is None:
            self.model_id = lm.name
        self.fingerprint = fingerprint(lm)
        self.tool_template = detect(lm.tokenizer, lm.eos_token_ids)
        self.reasoning = detect_reasoning(lm.tokenizer, self.settings.reasoning_format)
        self.max_text_chars = lm.target.max_context * longest_token_chars(lm.tokenizer)
        self.max_pieces = lm.target.max_context
        max_batch = self.max_batch
        if isinstance(lm.target, BatchTarget):
            max_batch = max_batch or default_max_batch(lm.target)
        else:  # a target that runs one sequence at a time (llama.cpp)
            max_batch = 1
        self.max_batch = max_batch
        if PrefixCache.applies(lm.target):
            self.prefix_cache = prefix_cache(self.settings)
            if (cache := self.prefix_cache) is not None:
                cache.prepare(lm.target)
                disk = "memory only" if cache.disk is None else f"and {cache.disk.directory}"
                log.info("prefix cache: %d MiB in memory %s", cache.budget_bytes >> 20, disk)
        queue, prefill = self.settings.max_queue, self.settings.prefill_tokens or PREFILL_TOKENS
        # One worker for every max_batch and target (see .batch_worker).
        self.worker = BatchWorker(lm, queue, self.tokenizer_lock, max_batch, prefill)
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
        if self.prefix_cache is not None:  # the last answers' blocks, for the next process
            self.prefix_cache.flush()

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

    def serves(self, name: str) -> bool:
        """Whether a request's ``model`` names this server's model (its id or an alias)."""
        aliases = self.settings.model_alias
        return name == self.model_id or name in aliases or "*" in aliases

    def model_card(self) -> ModelCard:
        return ModelCard(id=self.model_id, object="model", created=0, owned_by="promptlookup")


#: The most characters one token is assumed to stand for when the vocabulary cannot be read.
MAX_TOKEN_CHARS = 128


def longest_token_chars(tokenizer, chunk: int = 4096) -> int:
    """The most characters any one token of ``tokenizer`` stands for: its vocabulary's longest
    entry (written with at least one character per character it stands for, in byte-level BPE
    and SentencePiece vocabularies), so that a text of more than ``context x this`` characters
    has more tokens than the context holds. Read ``chunk`` tokens at a time: the whole
    vocabulary as one dict (``get_vocab``) is 50 MiB of Python objects for Gemma 3's 262,144
    tokens, and the heap kept 28 of them."""
    try:
        size = len(tokenizer)
        longest = 0
        for start in range(0, size, chunk):
            tokens = tokenizer.convert_ids_to_tokens(list(range(start, min(start + chunk, size))))
            longest = max(longest, *(len(token) for token in tokens if token is not None), 0)
    except (AttributeError, NotImplementedError, TypeError):
        return MAX_TOKEN_CHARS
    return longest or MAX_TOKEN_CHARS


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

    @classmethod
    def for_app(cls, app, **config) -> Server:
        """The server for an app of :func:`~promptlookup.server.create_app`, listening where
        its settings say; ``config``: more (or other) :class:`uvicorn.Config` arguments."""
        settings: ServerSettings = app.state.server.settings
        options = {
            "host": settings.host,
            "port": settings.port,
            "log_level": settings.log_level,
            "timeout_graceful_shutdown": 5,
            "http": http_protocol(settings.header_timeout),
            **config,
        }
        return cls(uvicorn.Config(app, **options))

    def handle_exit(self, sig, frame) -> None:
        state = getattr(getattr(self.config.app, "state", None), "server", None)
        if state is not None:
            state.begin_shutdown()
        super().handle_exit(sig, frame)


def prefix_cache(settings: ServerSettings) -> PrefixCache | None:
    """The server's prefix cache from its settings (see ``--prefix-cache-dir``): None when
    ``--prefix-cache-mib 0``; the default folder, where it cannot be made, left out with a
    warning (memory only, at memory's budget without a disk tier)."""
    mib, folder = settings.prefix_cache_mib, settings.prefix_cache_dir
    if mib == 0:
        return None
    directory = {"auto": cache_files.prefix_cache_folder(), "none": None}.get(folder, folder)
    shared = settings.prefix_cache_scope == "global"
    if directory is not None:
        memory = DEFAULT_MIB_WITH_DISK if mib is None else mib
        try:
            return PrefixCache(
                memory, shared=shared, directory=directory, disk_mib=settings.prefix_cache_disk_mib
            )
        except InvalidParameterError as error:
            if folder != "auto":
                raise
            log.warning("%s: the prefix cache keeps its blocks in memory only", error)
    return PrefixCache(DEFAULT_MIB if mib is None else mib, shared=shared)
