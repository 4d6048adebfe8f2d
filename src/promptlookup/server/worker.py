"""The generation worker: one thread runs one generation at a time (the target keeps one KV
cache, so it is single-stream), fed by a bounded queue.

Policies:

- *Capacity*: one running generation plus at most ``max_queue`` waiting ones. A request beyond
  that is refused at once (:class:`QueueFull`, HTTP 429) instead of growing the queue; a
  waiting job whose client left holds no slot (it is dropped when the slot is needed).
- *Cancellation*: :meth:`GenerationJob.cancel` (the client went away) stops the generation
  within one decoding step: the flag is checked before every draft, i.e. before every forward
  pass, and after every text delta. A job cancelled while still waiting never starts.
- *Isolation*: an exception in one generation reaches that job only (a
  :class:`~promptlookup.errors.PromptLookupError` as a 400, anything else as a 500 with the
  traceback logged); the worker goes on with the next job.

Jobs talk to the asyncio side through ``events``, an :class:`asyncio.Queue` filled from the
worker thread with ``(kind, value)`` pairs: ``("delta", text)`` (only for streaming jobs),
then exactly one of ``("done", GenerationResult)``, ``("error", APIError)`` or
``("cancelled", None)``.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Sequence

from ..drafters import DrafterSpec, NoDrafter
from ..errors import PromptLookupError
from ..generation import GenerationResult, LanguageModel
from .schemas import APIError

log = logging.getLogger("promptlookup.server")


class QueueFull(Exception):
    """Every queue slot is taken; the request should be answered with 429."""


class GenerationCancelled(Exception):
    """Raised inside the decoding loop (from the drafter) when a job is cancelled."""


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
    wants_deltas: bool = False
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.loop = asyncio.get_running_loop()

    def cancel(self) -> None:
        self.cancelled.set()

    def emit(self, kind: str, value=None) -> None:
        """Send an event from the worker thread (dropped if the event loop is gone)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the loop was closed: nobody is listening any more
            pass

    async def outcome(self) -> GenerationResult:
        """Wait for the end of the job: its result, or raise its :class:`APIError`."""
        while True:
            kind, value = await self.events.get()
            if kind == "done":
                return value
            if kind == "error":
                raise value
            if kind == "cancelled":
                raise APIError(503, "the generation was cancelled", type="server_error",
                               code="cancelled")


class CancelCheck:
    """A drafter that never drafts but raises :class:`GenerationCancelled` once the job is
    cancelled. Put first in a chain, it is asked before every forward pass of the loop."""

    def __init__(self, cancelled: threading.Event) -> None:
        self._cancelled = cancelled

    def propose(self, tokens: Sequence[int], max_tokens: int) -> list[int]:
        if self._cancelled.is_set():
            raise GenerationCancelled()
        return []

    def update(self, draft: Sequence[int], num_accepted: int) -> None:
        pass


class CancellableNoDrafter(CancelCheck, NoDrafter):
    """Plain decoding that can be cancelled (still a NoDrafter, for models that cannot crop)."""


def cancellable(spec: DrafterSpec, cancelled: threading.Event) -> DrafterSpec:
    """``spec`` as a chain led by a :class:`CancelCheck` (the model's own ``stream`` builds the
    rest with its tokenizer, device and sampler); ``"none"`` as a cancellable plain decoder."""
    if spec is None or spec == "none":
        return CancellableNoDrafter(cancelled)
    return [CancelCheck(cancelled), spec]


class GenerationWorker:
    """Runs queued :class:`GenerationJob` s one by one on a daemon thread."""

    def __init__(self, lm: LanguageModel, max_queue: int = 16) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.lm = lm
        self.max_queue = max_queue
        self._queue: queue.Queue[GenerationJob | None] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self._stopping = False
        #: The job being generated, None when idle.
        self.current: GenerationJob | None = None
        self.completed = self.cancelled = self.failed = 0

    @property
    def waiting(self) -> int:
        """Jobs in the queue whose clients still wait, not counting the running one."""
        with self._queue.mutex:
            return sum(1 for job in self._queue.queue
                       if job is not None and not job.cancelled.is_set())

    @property
    def idle(self) -> bool:
        return self.current is None and self._queue.empty()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="promptlookup-generation",
                                        daemon=True)
        self._thread.start()

    def submit(self, job: GenerationJob) -> None:
        """Queue ``job``, or raise :class:`QueueFull` when ``max_queue`` jobs already wait
        (jobs whose clients left while waiting hold no slot: they are dropped first)."""
        if self._stopping:
            raise APIError(503, "the server is shutting down", type="server_error")
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            if not self._drop_cancelled():
                raise QueueFull() from None
            self._queue.put_nowait(job)

    def _drop_cancelled(self) -> int:
        """Take the cancelled jobs out of the queue (each told so); how many there were."""
        with self._queue.mutex:
            waiting = self._queue.queue
            gone = [job for job in waiting if job is not None and job.cancelled.is_set()]
            for job in gone:
                waiting.remove(job)
                self._queue.unfinished_tasks -= 1
            if gone:
                self._queue.not_full.notify(len(gone))
        for job in gone:
            self.cancelled += 1
            job.emit("cancelled")
        return len(gone)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the running job, fail the waiting ones, and end the thread."""
        self._stopping = True
        if self.current is not None:
            self.current.cancel()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.emit("error", APIError(503, "the server is shutting down", type="server_error"))
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            self.current = job
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
            job.emit("cancelled")
            return
        try:
            stream = self.lm.stream(job.prompt_ids, max_new_tokens=job.max_new_tokens,
                                    drafter=cancellable(job.drafter, job.cancelled),
                                    **job.sampling, **job.generation_options,
                                    **job.drafter_options)
            with stream:
                for piece in stream:
                    if job.cancelled.is_set():
                        raise GenerationCancelled()
                    if job.wants_deltas:
                        job.emit("delta", piece)
        except GenerationCancelled:
            self.cancelled += 1
            job.emit("cancelled")
        except PromptLookupError as exc:
            self.failed += 1
            job.emit("error", APIError(400, str(exc)))
        except Exception as exc:
            self.failed += 1
            log.exception("generation failed")
            job.emit("error", APIError(500, f"generation failed: {type(exc).__name__}: {exc}",
                                       type="server_error"))
        else:
            if job.cancelled.is_set():  # cancelled during the last step, which then ended it
                self.cancelled += 1
                job.emit("cancelled")
                return
            self.completed += 1
            job.emit("done", stream.result)
