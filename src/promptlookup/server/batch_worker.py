"""The generation worker: one thread steps a :class:`~promptlookup.batching.BatchDecoder`, so
that up to ``max_batch`` sequences share every forward pass. It is the server's one worker, for
every ``max_batch`` (1 included) and every target (one that runs a sequence at a time, as
llama.cpp's, through :class:`~promptlookup.batching.SerialTarget`, with ``max_batch`` 1).

It takes its jobs from :class:`~promptlookup.server.worker.GenerationWorker`'s queue, with its
capacity (429 beyond ``max_queue`` waiting jobs), shutdown and event protocol, and these
policies:

- *Admission*: at every step boundary, waiting jobs move into the batch in arrival order while
  their sequences fit (a job with ``n > 1`` brings its n sequences together: sequence ``i``
  seeded with ``seed + i``, as one by one); a job whose ``n`` exceeds ``max_batch`` runs alone.
- *Streaming*: each sequence's text deltas go to its own job as its tokens are accepted.
- *Cancellation*: a job's disconnect ends its sequences before the next step; no other
  sequence's tokens change (each is computed as alone).
- *Isolation*: no tenant can end another's generation. An invalid request fails alone, before
  it joins. An exception raised by one sequence's own work (its grammar, drafter, logits
  processing, text) ends that sequence's job alone with a 400 of one line (:func:`job_error`),
  the others go on with the same tokens. Only a failing forward pass, which every sequence of
  the step shares, ends the step's jobs (a 500 that says so); the worker goes on with a fresh
  batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..batching import PREFILL_TOKENS, BatchDecoder, BatchSequence
from ..errors import GrammarError, PromptLookupError
from ..generation import TextAssembler
from ..machine import return_freed_memory
from .request_base import APIError
from .shown import ShownTokens
from .worker import Choice, GenerationJob, GenerationWorker, TokenInfo, shutting_down

log = logging.getLogger("promptlookup.server")
#: Seconds without a request after which the worker returns freed memory to the system.
IDLE_SECONDS = 1.0
#: Prompt tokens in one forward pass from which freed memory goes back after it: a long
#: prompt's chunks free tens of MiB of transients each, which the heap (see ``_run``) would
#: keep and, chunk after chunk, grow (a 24,000-token prompt to Gemma 3 270M: 839 MiB peak
#: against 794 given back); giving them back costs a chunk's page faults, ~1% of its pass.
RETURN_AFTER_PROMPT_TOKENS = 256


@dataclass(eq=False)
class _Running:
    """A job in the batch: its sequences, their texts, and the choices finished so far."""

    job: GenerationJob
    texts: dict[BatchSequence, tuple[int, TextAssembler]]
    choices: dict[int, Choice] = field(default_factory=dict)
    infos: dict[int, list[TokenInfo]] = field(default_factory=dict)
    shown: dict[int, ShownTokens] = field(default_factory=dict)


class BatchWorker(GenerationWorker):
    """Runs queued jobs with continuous batching (see the module doc)."""

    def __init__(
        self,
        lm,
        max_queue: int = 16,
        tokenizer_lock=None,
        max_batch: int = 8,
        prefill_tokens: int = PREFILL_TOKENS,
    ) -> None:
        super().__init__(lm, max_queue, tokenizer_lock)
        self.max_batch, self.prefill_tokens = max_batch, prefill_tokens
        self.decoder = self._new_decoder()
        self.jobs: dict[BatchSequence, _Running] = {}  # each running sequence's job
        self._names: dict[int, str] = {}  # token texts for logprobs

    @property
    def running(self) -> int:
        return len({id(entry) for entry in self.jobs.values()})

    @property
    def idle(self) -> bool:
        return not self.jobs and not self._waiting

    def _run(self) -> None:
        # Blocks under 64 MiB (sequences' caches, logits) reuse freed heap memory while the
        # server is busy, not a fresh map each (page faults: ~50 ms of a 2,000-token cache).
        return_freed_memory(map_from=64 << 20)
        returned = True  # whether freed memory went back since the last step
        while True:
            with self._cond:
                # Idle: after IDLE_SECONDS with no request, what the last requests held goes
                # back (not at once: a conversation's next turn, sent as soon as the last one
                # ended, would wait for it, and its cache would be mapped afresh).
                if not returned and not self._cond.wait_for(self._has_work, IDLE_SECONDS):
                    self._cond.release()
                    try:
                        return_freed_memory()
                    finally:
                        self._cond.acquire()
                    returned = True
                self._cond.wait_for(self._has_work)
                returned = False
                if self._stopping and not self.jobs:
                    return
                self._admit()
            if not self.jobs:
                continue
            try:
                events = self.decoder.step()
                if self.decoder.prompt_tokens_fed >= RETURN_AFTER_PROMPT_TOKENS:
                    return_freed_memory(collect=False)
            except Exception as exc:  # the shared forward pass failed: its jobs end
                log.exception("a forward pass failed; every request in it ends")
                self._fail_all(
                    APIError(
                        500,
                        f"the forward pass this request shared with others failed "
                        f"({type(exc).__name__}); retry",
                        type="server_error",
                        code="forward_pass_failed",
                    )
                )
                continue
            for sequence, new_tokens in events:
                running = self.jobs.get(sequence)
                try:
                    self._deliver(sequence, new_tokens)
                except Exception as exc:  # this sequence's text: its job alone ends
                    sequence.fail(exc)
                    self._end_failed(sequence, running)

    def _has_work(self) -> bool:
        return bool(self._waiting or self.jobs or self._stopping)

    def _admit(self) -> None:
        """Move waiting jobs into the batch while their sequences fit (under the lock)."""
        while self._waiting:
            job = self._waiting[0]
            room = self.max_batch - len(self.jobs)
            if job.n > room and (self.jobs or job.n <= self.max_batch):
                return  # it waits for room (a job larger than the batch runs alone)
            self._waiting.popleft()
            if job.cancelled.is_set():
                self.cancelled += 1
                job.end_cancelled()
                continue
            try:
                running = _Running(job, {})
                for index in range(job.n):
                    sequence, text = self.lm.batch_sequence(job.prompt_ids, **job.options(index))
                    running.texts[sequence] = (index, text)
                    self.decoder.add(sequence)  # checked first (the target can run it)
            except Exception as exc:  # the request's fault: it fails alone, before it joins
                self.failed += 1
                for sequence in running.texts:
                    sequence.cancel()  # the job's sequences already queued leave unrun
                invalid = isinstance(exc, PromptLookupError)
                job.emit("error", APIError(400, str(exc)) if invalid else job_error(exc))
                continue
            job.emit("started")  # a stream's response begins now (GenerationJob.started)
            for sequence in running.texts:
                self.jobs[sequence] = running
            self.current = job  # the latest admitted, for GenerationWorker.shutdown

    def _deliver(self, sequence: BatchSequence, new_tokens: list[int]) -> None:
        """Send a sequence's new text to its job; end the job when its last sequence ends."""
        running = self.jobs.get(sequence)
        if running is None:
            return
        if sequence.error is not None:
            self._end_failed(sequence)
            return
        job, (index, text) = running.job, running.texts[sequence]
        infos = running.infos.setdefault(index, [])
        shown = running.shown.setdefault(
            index, ShownTokens(self.lm.tokenizer, self.lm.eos_token_ids)
        )
        for token, piece in text.add_step(sequence, new_tokens):  # up to a stop string
            if job.wants_deltas and job.logprobs is not None:  # else counted at the end
                shown.add([token], piece)
            self._send(running, index, piece, sequence, shown.shown)
        if not sequence.done:
            return
        del self.jobs[sequence]
        if sequence.finish_reason != "cancelled":
            piece = text.flush()
            result = text.result(sequence.stats, sequence.prompt_ids)
            reported = shown.reported(result)
            self._send(running, index, piece, sequence, reported)
            logprobs = infos if job.logprobs is not None else None
            choice = Choice(index, result, logprobs, reported)
            running.choices[index] = choice
            job.emit("choice", choice)
        if any(entry is running for entry in self.jobs.values()):
            return  # the job's other sequences go on
        if not self.jobs:
            self.current = None
        if job.cancelled.is_set() or len(running.choices) < job.n:
            self.cancelled += 1
            job.end_cancelled()
            return
        self.completed += 1
        self._job_seconds = 0.8 * self._job_seconds + 0.2 * max(
            c.result.stats.seconds for c in running.choices.values()
        )
        job.emit("done", [running.choices[i] for i in range(job.n)])

    def _send(
        self, running: _Running, index: int, piece: str, sequence: BatchSequence, upto: int
    ) -> None:
        """Stream ``piece`` and the logprobs of the tokens before ``upto`` not yet sent (the
        reported ones whose text is shown: see :mod:`.shown`)."""
        infos = running.infos[index]
        new = self._token_infos(sequence.stats.logprobs[len(infos) : upto], self._names)
        infos += new
        if running.job.wants_deltas and (piece or new):
            running.job.emit("delta", (index, piece, new))

    def _end_failed(self, sequence: BatchSequence, running: _Running | None = None) -> None:
        """End the job of a sequence whose own step raised (see the module doc): its error,
        its other sequences cancelled; every other job goes on."""
        running = running or self.jobs.get(sequence)
        if running is None:
            return
        error = sequence.error
        if not isinstance(error, PromptLookupError):
            log.error("one request's generation failed", exc_info=error)
        for other, entry in list(self.jobs.items()):
            if entry is running:
                other.cancel()  # it leaves the batch before the next step, unrun
                del self.jobs[other]
        if not self.jobs:
            self.current = None
        self.failed += 1
        running.job.emit("error", job_error(error))

    def _fail_all(self, error: APIError) -> None:
        """End every running job with ``error`` and start a fresh batch."""
        for running in {id(entry): entry for entry in self.jobs.values()}.values():
            self.failed += 1
            running.job.emit("error", error)
        self.jobs.clear()
        self.decoder = self._new_decoder()

    def _new_decoder(self) -> BatchDecoder:
        return BatchDecoder(
            self.lm.target,
            self.lm.policy,
            max_batch=self.max_batch,
            prefill_tokens=self.prefill_tokens,
        )

    def shutdown(self, reason: APIError | None = None) -> None:
        """Refuse new jobs; end the waiting ones and every running one with ``reason``
        (default: the server is shutting down)."""
        reason = reason or shutting_down()
        super().shutdown(reason)
        for running in list(self.jobs.values()):
            running.job.cancel(running.job.reason or reason)
        with self._cond:
            self._cond.notify_all()


def job_error(error: BaseException) -> APIError:
    """The 400 of a job whose sequence's own step raised ``error``: one readable line, with
    nothing of the grammar engine's internal state."""
    if isinstance(error, GrammarError):
        return APIError(
            400,
            "the request's grammar (its response_format or tools) allows no continuation "
            "the model can generate here; check its schema",
            code="grammar_failed",
        )
    if isinstance(error, PromptLookupError):
        line = (str(error).splitlines() or [""])[0][:300]
        return APIError(400, line or type(error).__name__)
    return APIError(
        400,
        f"generating this request's answer failed ({type(error).__name__})",
        code="generation_failed",
    )
