"""The server's jobs and their queue: a :class:`GenerationJob` is one request's typed inputs and
the channel its events come back on; :class:`GenerationWorker` holds the bounded queue that one
worker thread takes them from (the one that runs them, for every ``max_batch`` and every
target, is :class:`~promptlookup.server.batch_worker.BatchWorker`).

Policies:

- *Capacity*: the running jobs plus at most ``max_queue`` waiting ones. A request beyond that
  is refused at once (:class:`QueueFull`, HTTP 429, with :meth:`GenerationWorker.retry_after`
  estimated from recent jobs' durations) instead of growing the queue.
- *Cancellation*: :meth:`GenerationJob.cancel` (the client went away) ends the job's
  sequences before their next forward pass; a job cancelled while waiting leaves the queue at
  once, freeing its slot.
- *n sequences*: with a ``seed``, sequence ``i`` of a job uses ``seed + i`` (so sequence 0
  equals the same request with ``n=1``).
- *Shutdown*: :meth:`GenerationWorker.shutdown` refuses new jobs, answers the waiting ones
  with its error and ends the running ones with it before their next forward pass.

Jobs talk to the asyncio side through ``events``, an :class:`asyncio.Queue` filled from the
worker thread with ``(kind, value)`` pairs: ``("started", None)``, ``("delta", (index, text,
logprobs))`` (only for streaming jobs), ``("choice", Choice)`` as each sequence ends, then
exactly one of ``("done", [Choice, ...])``, ``("error", APIError)`` or ``("cancelled", None)``.

Adding a request field: the request model (:mod:`.openai.protocol`) reads it, :func:`.serving._prepare`
sets the :class:`GenerationJob` field, and :meth:`GenerationJob.options` hands it to the
sequence; no other stop.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import threading
from contextlib import nullcontext
from dataclasses import dataclass, field

from ..drafters import DrafterSpec
from ..generation import GenerationResult, LanguageModel
from ..grammar import Grammar
from ..limits import SamplingParams
from ..prefix_cache import PrefixCache
from ..sampling import TokenLogprob
from .request_base import APIError

log = logging.getLogger("promptlookup.server")

#: What a logprob of -inf (a token filtered out by top-k/top-p) is reported as, as OpenAI does.
FLOOR_LOGPROB = -9999.0


def cancelled() -> APIError:
    """What a job's ``"cancelled"`` event is answered with (a whole answer's 503, a stream's
    error event)."""
    return APIError(503, "the generation was cancelled", type="server_error", code="cancelled")


class QueueFull(Exception):
    """Every queue slot is taken; the request should be answered with 429."""


@dataclass(frozen=True)
class TokenInfo:
    """A token's logprob as the API reports it: its text and up to N alternatives."""

    text: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass
class Choice:
    """One finished sequence of a job."""

    index: int
    result: GenerationResult
    logprobs: list[TokenInfo] | None = None
    #: The tokens the answer reports (see :mod:`.shown`): ``usage.completion_tokens``.
    tokens: int = 0


@dataclass(eq=False)
class GenerationJob:
    """One request's generation: its typed inputs, from the request to its sequences
    (:meth:`options`), and the channel its events come back on (bound to the event loop that
    reads ``events`` when made there, else by :meth:`bind`)."""

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    drafter: DrafterSpec = "prompt-lookup"
    drafter_options: dict = field(default_factory=dict)  # make_drafter's options
    speculation: str = "adaptive"
    #: Whose acceptance history and prefix cache entries the job uses (its API key's).
    tenant: str | None = None
    prefix_cache: PrefixCache | bool = False
    grammar: Grammar | None = None
    n: int = 1
    logprobs: int | None = None  # alternatives per token; None: no logprobs
    wants_deltas: bool = False
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: Why the job was ended when not by its own client (server shutdown); None otherwise.
    reason: APIError | None = None

    def __post_init__(self) -> None:
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # made on a thread (the request's preparation): bound later
            self.loop = None
        self._withdraw = None  # set by the worker that queues the job

    def bind(self, loop: asyncio.AbstractEventLoop) -> GenerationJob:
        """Report to ``loop`` (the one that reads ``events``)."""
        self.loop = loop
        return self

    def options(self, index: int) -> dict:
        """Sequence ``index``'s keyword arguments for
        :meth:`~promptlookup.LanguageModel.batch_sequence` (with a ``seed``, ``seed +
        index``)."""
        sampling = self.sampling
        if sampling.seed is not None:
            sampling = dataclasses.replace(sampling, seed=sampling.seed + index)
        return {
            "max_new_tokens": self.max_new_tokens,
            **sampling.as_kwargs(),
            "stop": list(self.stop),
            "drafter": self.drafter,
            "speculation": self.speculation,
            "should_stop": self.cancelled.is_set,
            "logprobs": self.logprobs,
            "prefix_cache": self.prefix_cache,
            "tenant": self.tenant,
            "grammar": self.grammar,
            **self.drafter_options,
        }

    def cancel(self, reason: APIError | None = None) -> None:
        if reason is not None and self.reason is None and not self.cancelled.is_set():
            self.reason = reason
        self.cancelled.set()
        if self._withdraw is not None:
            self._withdraw(self)

    def emit(self, kind: str, value=None) -> None:
        """Send an event from the worker thread (dropped if the event loop is gone)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the loop was closed: nobody is listening any more
            pass

    def end_cancelled(self) -> None:
        if self.reason is not None:
            self.emit("error", self.reason)
        else:
            self.emit("cancelled")

    async def outcome(self) -> list[Choice]:
        """Wait for the end of the job: its choices, or raise its :class:`APIError`."""
        while True:
            kind, value = await self.events.get()
            if kind == "done":
                return value
            _raise_if_ended(kind, value)

    async def started(self) -> None:
        """Wait until a worker starts the job (it leaves the queue), or raise the
        :class:`APIError` that ended it first (a 503 at shutdown, a 400 it was refused with):
        a stream's response (200) begins only then."""
        while (event := await self.events.get())[0] != "started":
            _raise_if_ended(*event)


def _raise_if_ended(kind: str, value) -> None:
    """Raise the :class:`APIError` of a job's ``"error"`` or ``"cancelled"`` event."""
    if kind == "error":
        raise value
    if kind == "cancelled":
        raise cancelled()


class GenerationWorker:
    """The queue of :class:`GenerationJob` s and its policies (see the module doc); a
    subclass's ``_run`` takes them from it on a daemon thread."""

    def __init__(
        self, lm: LanguageModel, max_queue: int = 16, tokenizer_lock: threading.Lock | None = None
    ) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.lm = lm
        self.max_queue = max_queue
        self._tokenizer_lock = tokenizer_lock or nullcontext()
        self._waiting: collections.deque[GenerationJob] = collections.deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._job_seconds = 1.0  # a moving average of recent jobs' durations
        #: The job being generated, None when idle.
        self.current: GenerationJob | None = None
        self.completed = self.cancelled = self.failed = 0

    @property
    def waiting(self) -> int:
        """Jobs in the queue, not counting the running one."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Jobs being generated."""
        return int(self.current is not None)

    @property
    def idle(self) -> bool:
        return self.current is None and not self._waiting

    def retry_after(self) -> int:
        """Seconds after which a refused request may find room: the queue's expected drain
        time from recent jobs' durations, 1 to 60."""
        return max(1, min(60, math.ceil(self._job_seconds * (self.waiting + 1))))

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name="promptlookup-generation", daemon=True
        )
        self._thread.start()

    def submit(self, job: GenerationJob) -> None:
        """Queue ``job``, or raise :class:`QueueFull` when ``max_queue`` jobs already wait."""
        with self._cond:
            if self._stopping:
                raise shutting_down()
            if len(self._waiting) >= self.max_queue:
                raise QueueFull()
            job._withdraw = self._withdraw
            self._waiting.append(job)
            self._cond.notify()

    def _withdraw(self, job: GenerationJob) -> None:
        """Take a cancelled job out of the queue (if it is still there) and end it."""
        with self._cond:
            if job not in self._waiting:
                return
            self._waiting.remove(job)
        self.cancelled += 1
        job.end_cancelled()

    def shutdown(self, reason: APIError | None = None) -> None:
        """Refuse new jobs; end the waiting ones and the running one with ``reason``."""
        reason = reason or shutting_down()
        with self._cond:
            self._stopping = True
            waiting = list(self._waiting)
            self._waiting.clear()
            self._cond.notify_all()
        for job in waiting:
            job.reason = reason
            job.emit("error", reason)
        current = self.current
        if current is not None:
            current.cancel(reason)

    def stop(self, timeout: float = 10.0) -> None:
        """:meth:`shutdown`, then wait for the thread to end."""
        self.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        """The worker thread's loop (a subclass's)."""
        raise NotImplementedError

    def _token_infos(self, entries: list[TokenLogprob], names: dict[int, str]) -> list[TokenInfo]:
        """The API's view of loop logprobs: token texts, and finite numbers."""

        def name(token_id: int) -> str:
            if token_id not in names:
                with self._tokenizer_lock:
                    names[token_id] = self.lm.tokenizer.decode([token_id])
            return names[token_id]

        def finite(value: float) -> float:
            return value if math.isfinite(value) else FLOOR_LOGPROB

        return [
            TokenInfo(
                name(e.token_id), finite(e.logprob), tuple((name(t), finite(lp)) for t, lp in e.top)
            )
            for e in entries
        ]


def shutting_down() -> APIError:
    return APIError(
        503,
        "the server is shutting down; retry against another instance or later",
        type="server_error",
        code="server_shutting_down",
        headers={"Retry-After": "5"},
    )
