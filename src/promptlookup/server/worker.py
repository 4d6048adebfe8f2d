"""The generation worker: one thread runs one generation at a time (the target keeps one KV
cache, so it is single-stream), fed by a bounded queue.

Policies:

- *Capacity*: one running job plus at most ``max_queue`` waiting ones. A request beyond that
  is refused at once (:class:`QueueFull`, HTTP 429, with :meth:`GenerationWorker.retry_after`
  estimated from recent jobs' durations) instead of growing the queue.
- *Cancellation*: :meth:`GenerationJob.cancel` (the client went away) stops the generation
  before its next forward pass (the loop's ``should_stop``); a job cancelled while waiting
  leaves the queue at once, freeing its slot.
- *n sequences*: a job with ``n > 1`` generates them one after another; with a ``seed``,
  sequence ``i`` uses ``seed + i`` (so sequence 0 equals the same request with ``n=1``).
- *Shutdown*: :meth:`GenerationWorker.shutdown` refuses new jobs, answers the waiting ones
  with its error and ends the running one with it before its next forward pass.
- *Isolation*: an exception in one generation reaches that job only (a
  :class:`~promptlookup.errors.PromptLookupError` as a 400, anything else as a 500 with the
  traceback logged); the worker goes on with the next job.

Jobs talk to the asyncio side through ``events``, an :class:`asyncio.Queue` filled from the
worker thread with ``(kind, value)`` pairs: ``("delta", (index, text, logprobs))`` (only for
streaming jobs), ``("choice", Choice)`` as each sequence ends, then exactly one of
``("done", [Choice, ...])``, ``("error", APIError)`` or ``("cancelled", None)``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import threading
from contextlib import nullcontext
from dataclasses import dataclass, field

from ..drafters import DrafterSpec
from ..errors import PromptLookupError
from ..generation import GenerationResult, LanguageModel
from ..sampling import TokenLogprob
from .schemas import APIError
from .shown import ShownTokens

log = logging.getLogger("promptlookup.server")

#: What a logprob of -inf (a token filtered out by top-k/top-p) is reported as, as OpenAI does.
FLOOR_LOGPROB = -9999.0


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
    """One request's generation: its inputs, and the channel its events come back on.
    Create it on the event loop that will read ``events``."""

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: dict  # temperature, top_k, top_p, repetition_penalty, seed, stop
    drafter: DrafterSpec = "prompt-lookup"
    drafter_options: dict = field(default_factory=dict)
    generation_options: dict = field(default_factory=dict)  # more LanguageModel.stream arguments
    n: int = 1
    logprobs: int | None = None  # alternatives per token; None: no logprobs
    wants_deltas: bool = False
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: Why the job was ended when not by its own client (server shutdown); None otherwise.
    reason: APIError | None = None

    def __post_init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._withdraw = None  # set by the worker that queues the job

    def sampling_of(self, index: int) -> dict:
        """Sequence ``index``'s sampling arguments: with a ``seed``, ``seed + index``."""
        sampling = dict(self.sampling)
        if sampling.get("seed") is not None:
            sampling["seed"] += index
        return sampling

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
        raise APIError(503, "the generation was cancelled", type="server_error", code="cancelled")


class GenerationWorker:
    """Runs queued :class:`GenerationJob` s one by one on a daemon thread."""

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

    def _next(self) -> GenerationJob | None:
        with self._cond:
            while not self._waiting and not self._stopping:
                self._cond.wait()
            if not self._waiting:
                return None
            self.current = self._waiting.popleft()
            return self.current

    def _run(self) -> None:
        while (job := self._next()) is not None:
            try:
                self._generate(job)
            except BaseException:  # pragma: no cover - _generate reports everything itself
                log.exception("generation worker: unexpected failure")
                job.emit("error", APIError(500, "internal error", type="server_error"))
            finally:
                self.current = None

    def _generate(self, job: GenerationJob) -> None:
        if job.cancelled.is_set():
            self.cancelled += 1
            job.end_cancelled()
            return
        job.emit("started")  # a stream's response begins now (see GenerationJob.started)
        choices: list[Choice] = []
        try:
            for index in range(job.n):
                choice = self._sequence(job, index)
                if choice is None:
                    break
                choices.append(choice)
                job.emit("choice", choice)
        except PromptLookupError as exc:
            self.failed += 1
            job.emit("error", APIError(400, str(exc)))
            return
        except Exception as exc:
            self.failed += 1
            log.exception("generation failed")
            job.emit(
                "error",
                APIError(
                    500, f"generation failed: {type(exc).__name__}: {exc}", type="server_error"
                ),
            )
            return
        if job.cancelled.is_set():  # also when cancelled during the last step, which ended it
            self.cancelled += 1
            job.end_cancelled()
            return
        self.completed += 1
        seconds = sum(c.result.stats.seconds for c in choices)
        self._job_seconds = 0.8 * self._job_seconds + 0.2 * seconds
        job.emit("done", choices)

    def _sequence(self, job: GenerationJob, index: int) -> Choice | None:
        """Generate sequence ``index`` of ``job`` (None if the job was cancelled)."""
        stream = self.lm.stream(
            job.prompt_ids,
            max_new_tokens=job.max_new_tokens,
            drafter=job.drafter,
            should_stop=job.cancelled.is_set,
            logprobs=job.logprobs,
            **job.sampling_of(index),
            **job.generation_options,
            **job.drafter_options,
        )
        names: dict[int, str] = {}
        infos: list[TokenInfo] = []
        shown = ShownTokens(self.lm.tokenizer, self.lm.eos_token_ids)
        with stream:
            for piece in stream:
                if job.cancelled.is_set():
                    return None
                if job.wants_deltas:
                    entries = stream.stats.logprobs
                    shown.add((e.token_id for e in entries[len(shown) :]), piece)
                    new = self._token_infos(entries[len(infos) : shown.shown], names)
                    infos += new
                    job.emit("delta", (index, piece, new))
        if job.cancelled.is_set():
            return None
        reported = shown.reported(stream.result)
        rest = self._token_infos(stream.stats.logprobs[len(infos) : reported], names)
        infos += rest
        if job.wants_deltas and rest:
            job.emit("delta", (index, "", rest))
        logprobs = infos if job.logprobs is not None else None
        return Choice(index, stream.result, logprobs, reported)

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
