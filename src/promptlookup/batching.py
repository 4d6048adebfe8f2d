"""Continuous batching: the decoding loop of :mod:`promptlookup.loop` over many sequences at
once, every step verifying all their drafts in **one** forward pass.

Each :meth:`BatchDecoder.step` first *admits* waiting sequences while fewer than
``max_batch`` run (sequences join and leave only at step boundaries; one with a prefix cache
starts from the keys and values of its prompt's longest cached prefix,
:mod:`promptlookup.prefix_cache`, so only the rest of its prompt is fed), then runs the steps of
the loop (numbered as in :mod:`promptlookup.loop` and ``docs/design.md``) for all of them:

1. *Draft*: every sequence whose prompt is in its cache drafts, as it would alone (not on
   its first step, whose pass ends its prompt: its first token comes sooner).
2. *Decide*: the policy sets all draft lengths jointly, from the cost of the whole pass and
   each sequence's own acceptance (:meth:`~promptlookup.policy.SpeculationPolicy.decide`),
   each draft first cut to the target's ``max_draft`` where it has one (a bound on a pass's
   logits: :attr:`~promptlookup.backends.hf.target.TorchTarget.max_draft`).
3. *One forward pass* over every sequence's new tokens: the next chunk of a joining sequence's
   prompt, or a running sequence's last token and its draft.
4. *Verify*: each sequence keeps its accepted tokens and its bonus token, chosen by its own
   chooser, and ends at EOS, its token budget or its ``should_stop`` (the step of a single
   stream: :meth:`~promptlookup.loop.DecodingSequence.accept`).
5. *Crop* each cache back to its accepted tokens; finished sequences leave. A sequence's
   keys and values go to its prefix cache after its first pass (its prompt) and when it ends.

Isolation: an exception raised by one sequence's own work (its prefix, draft, verification,
grammar or logits processors) ends that sequence alone (``finish_reason`` ``"error"``, the
exception in its ``error``); only a failing forward pass, shared by all, raises from a step.

Exactness: a :class:`~promptlookup.backends.base.BatchTarget` with ``row_invariant`` computes
each sequence's rows bit for bit as a pass over that sequence alone would, so a sequence's
tokens (greedy, or sampled with its own seeded generator) do not depend on what else shares
its passes, nor on the draft lengths chosen for it.

Prefill policy (time to first token against inter-token latency): while other sequences are
decoding, a step carries at most ``prefill_tokens`` prompt tokens (oldest joiner first), so
a long prompt delays each running sequence's next step by about one pass over that many
tokens rather than by a whole prefill (``promptlookup serve --prefill-tokens``; more lifts
throughput, since every step also carries the running sequences' drafts); with nobody
decoding, prompts go in whole chunks of the target's ``prefill_chunk`` tokens
(:data:`~promptlookup.backends.base.PREFILL_CHUNK` by default). A prompt's last
chunk and its last token make the pass that yields its first token (no draft beside them).

Memory: each sequence holds its own KV cache, ``2 * layers * kv_heads * head_dim`` values per
token, with capacity rounded up to 64 tokens and doubling as it grows (SmolLM2-135M in
float32: 46 KB per token, so 8 sequences of 2,048 tokens take about 0.75 GB); a prefix cache
holds its budget besides, in the buffers of finished sequences that it took over (a joining
sequence takes its prefix's buffers over where nobody else uses them, else copies it).
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from .backends.base import PREFILL_CHUNK, BatchTarget, Target
from .calibration import calibrate_alone
from .drafters.base import Draft, NoDrafter
from .errors import InvalidParameterError, UnsupportedModelError
from .loop import DecodingSequence
from .policy import NO_POLICY, NoPolicy, SpeculationPolicy
from .prefix_cache import PrefixCache


def default_max_batch(target: BatchTarget) -> int:
    """Sequences per forward pass by default: 4 per core (a pass over a few dozen rows costs
    little more than over one on a CPU), at most 16, and no more than a quarter of the
    machine's memory holds at full context."""
    from .machine import default_threads, memory_bytes

    by_cores = min(16, 4 * default_threads())
    per_sequence = target.kv_bytes_per_token * target.max_context
    if not memory_bytes() or not per_sequence:
        return by_cores
    return max(1, min(by_cores, int(0.25 * memory_bytes() // per_sequence)))


#: Prompt tokens a step carries while other sequences are decoding (see the module doc).
PREFILL_TOKENS = 512


@dataclass(eq=False)
class BatchSequence(DecodingSequence):
    """One sequence of a batch: a :class:`~promptlookup.loop.DecodingSequence` (its inputs, as
    :func:`~promptlookup.loop.speculative_generate` takes them, its state and its step, its
    policy) and its KV cache once it joins. ``should_stop()``, asked before every step,
    cancels it when true (as :meth:`cancel` does). ``prefix_cache`` (for a target it
    :meth:`~promptlookup.prefix_cache.PrefixCache.applies` to): its cache starts with the keys
    and values of the longest cached prefix of its prompt (``tenant``'s), and its own go
    there once its prompt is in and when it ends. ``error``: the exception that ended it
    alone (``finish_reason`` ``"error"``, see :meth:`BatchDecoder.step`)."""

    should_stop: Callable[[], bool] | None = None
    prefix_cache: PrefixCache | None = None

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise InvalidParameterError("a batch sequence needs a non-empty prompt")
        super().__post_init__()
        self.cache = None  # its KV cache, from the target when it joins
        self.error: Exception | None = None

    @property
    def prefilling(self) -> bool:
        """Whether prompt tokens besides the last are still missing from the cache."""
        return self.cache.get_seq_length() < len(self.tokens) - 1

    def cancel(self) -> None:
        """End the sequence before its next step."""
        self.finish("cancelled")

    def fail(self, error: Exception) -> None:
        """End the sequence now because its own step raised ``error``."""
        self.error, self.finish_reason = error, "error"


@dataclass(eq=False)
class _Entry:
    """What a sequence feeds into this step's pass, and how many rows of logits it wants
    back (``logits_to_keep``): none for a prompt chunk, its last token's and its draft's
    otherwise."""

    sequence: BatchSequence
    token_ids: list[int]
    draft: Draft
    logits_to_keep: int


class SerialTarget:
    """A plain :class:`~promptlookup.backends.base.Target` (llama.cpp) as a
    :class:`~promptlookup.backends.base.BatchTarget` of one sequence at a time, so that the
    batch decoder drives it too: the target's own cache is the one sequence's
    (:meth:`new_sequence` empties it), and a pass feeds the tokens before the rows it keeps as
    a prefill, the rest as a forward pass, as :func:`~promptlookup.loop.speculative_generate`
    does."""

    row_invariant = False
    kv_bytes_per_token = 0

    def __init__(self, target: Target) -> None:
        self.target = target
        self.max_context, self.can_crop = target.max_context, target.can_crop

    def new_sequence(self) -> SerialTarget:
        self.target.reset()
        return self  # the one sequence's cache: the target's own

    def get_seq_length(self) -> int:
        return self.target.cache_length

    def forward_batch(self, caches, token_ids, logits_to_keep) -> list[torch.Tensor]:
        (tokens,), (kept,) = token_ids, logits_to_keep  # one sequence
        self.target.prefill(tokens[: len(tokens) - kept])
        return [self.target.forward(tokens[len(tokens) - kept :]) if kept else torch.empty(0)]

    def __getattr__(self, name):  # reset, prefill, forward, crop, prepare, cache_length
        return getattr(self.target, name)


class BatchDecoder:
    """Runs :class:`BatchSequence` s with continuous batching over a
    :class:`~promptlookup.backends.base.BatchTarget` (see the module doc).

    >>> decoder = BatchDecoder(lm.target, lm.policy, max_batch=8)      # doctest: +SKIP
    >>> decoder.add(BatchSequence(prompt_ids, max_new_tokens=64))      # doctest: +SKIP
    >>> for sequence, tokens in decoder.run(): ...                     # doctest: +SKIP
    """

    def __init__(
        self,
        target: BatchTarget,
        policy: SpeculationPolicy | NoPolicy = NO_POLICY,
        max_batch: int = 8,
        prefill_tokens: int = PREFILL_TOKENS,
    ) -> None:
        if max_batch < 1:
            raise InvalidParameterError(f"max_batch must be >= 1, got {max_batch}")
        if prefill_tokens < 1:
            raise InvalidParameterError(f"prefill_tokens must be >= 1, got {prefill_tokens}")
        if not isinstance(target, BatchTarget):  # one sequence at a time (see SerialTarget)
            if max_batch > 1:
                raise UnsupportedModelError(
                    f"{type(target).__name__} cannot run several sequences in one forward pass"
                )
            target = SerialTarget(target)
        self.target, self.policy = target, policy
        self.max_batch, self.prefill_tokens = max_batch, prefill_tokens
        self.waiting: collections.deque[BatchSequence] = collections.deque()
        self.running: list[BatchSequence] = []
        #: Prompt tokens the last step's forward pass carried (0: none, or no pass).
        self.prompt_tokens_fed = 0

    def add(self, sequence: BatchSequence) -> BatchSequence:
        """Queue a sequence; it joins at the next step with room."""
        if not self.target.can_crop and not isinstance(sequence.drafter, NoDrafter):
            raise UnsupportedModelError(
                "this model's KV cache cannot be cropped after a rejected "
                "draft; use drafter='none' (plain decoding)"
            )
        if len(sequence.tokens) + sequence.max_new_tokens > self.target.max_context:
            raise InvalidParameterError(
                f"prompt ({len(sequence.tokens)} tokens) + max_new_tokens "
                f"({sequence.max_new_tokens}) exceeds the context of {self.target.max_context}"
            )
        self.waiting.append(sequence)
        return sequence

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def run(self) -> Iterator[tuple[BatchSequence, list[int]]]:
        """Step until every sequence has finished, yielding each one's new tokens per step."""
        while not self.idle:
            yield from self.step()

    def step(self) -> list[tuple[BatchSequence, list[int]]]:
        """One step (see the module doc): ``(sequence, its new tokens)`` for every sequence
        that took part, finished ones included (their ``finish_reason`` set).

        An exception raised by one sequence's own work (its prefix, draft, verification, its
        grammar or logits processors) ends that sequence alone: :meth:`BatchSequence.fail`,
        ``finish_reason`` ``"error"``; the others go on, their tokens unchanged (each is
        computed as alone). Only a failing forward pass, shared by all, raises here."""
        events, self.prompt_tokens_fed = [], 0
        # Admit waiting sequences (their policy's costs timed first, when it has none), each
        #    from its prompt's cached prefix if any.
        while self.waiting and len(self.running) < self.max_batch:
            sequence = self.waiting.popleft()
            calibrate_alone(self.target, sequence.policy, sequence.tokens[-1])
            sequence.cache = self.target.new_sequence()
            if sequence.prefix_cache is not None:  # its prompt's cached prefix is not fed
                with _isolated(sequence):
                    sequence.cache, sequence.stats.cached_tokens = sequence.prefix_cache.join(
                        self.target, sequence.cache, sequence.tokens[:-1], sequence.tenant
                    )
            with _isolated(sequence):  # the room its prompt takes, at once (see there)
                reserve = getattr(self.target, "reserve", None)
                if reserve is not None:
                    reserve(sequence.cache, len(sequence.tokens), sequence.max_new_tokens)
            self.running.append(sequence)
        # Drop the ones that failed, were cancelled or asked to stop.
        for sequence in self.running:
            if not sequence.done and sequence.should_stop is not None and sequence.should_stop():
                sequence.cancel()
            if sequence.done or sequence.max_new_tokens < 1:
                sequence.finish_reason = sequence.finish_reason or "length"
                self._keep(sequence)  # ended by its caller (a stop string) or cancelled
                events.append((sequence, []))
        self.running = [sequence for sequence in self.running if not sequence.done]
        if not self.running:
            return events
        # 1-2. Prompt chunks for joining sequences; drafts, sized jointly, for the others.
        entries = self._entries()
        events += [(sequence, []) for sequence in self.running if sequence.error]
        self.running = [sequence for sequence in self.running if not sequence.done]
        if not entries:
            return events
        # 3. One forward pass over every sequence's new tokens.
        decoding = [entry for entry in entries if entry.logits_to_keep]
        total = sum(len(entry.token_ids) for entry in entries)
        self.prompt_tokens_fed = total - sum(entry.logits_to_keep for entry in decoding)
        self.target.prepare([total])
        forward_start = time.perf_counter()
        target_logits = self.target.forward_batch(  # (logits_to_keep_i, vocab) each
            [entry.sequence.cache for entry in entries],
            [entry.token_ids for entry in entries],
            [entry.logits_to_keep for entry in entries],
        )
        seconds = time.perf_counter() - forward_start
        if len(decoding) == len(entries) and all(
            entry.sequence.stats.forward_passes for entry in entries
        ):  # decoding steps only (a prompt chunk or a first step also ends a prompt)
            context = max(entry.sequence.speculation.context for entry in entries)
            self.policy.record_forward(total, seconds, context, batch_size=len(entries))
        # 4-5. Each sequence verifies its own draft, then its cache is cropped back.
        for entry, logits in zip(entries, target_logits):
            if entry.logits_to_keep:
                sequence, new_tokens = entry.sequence, []
                with _isolated(sequence):
                    new_tokens = sequence.accept(entry.draft, logits)
                    # Crop the cache back to the accepted tokens (the bonus token: next step).
                    sequence.cache.crop(len(sequence.tokens) - 1)
                    if sequence.done or sequence.stats.forward_passes == 1:
                        self._keep(sequence)  # its prompt once in, and all of it at its end
                events.append((sequence, [] if sequence.error else new_tokens))
        self.running = [sequence for sequence in self.running if not sequence.done]
        return events

    def _keep(self, sequence: BatchSequence) -> None:
        """The sequence's keys and values into its prefix cache, if it has one, for sequences
        that join later (at its end, its cache with them: a later one may take it over)."""
        if sequence.prefix_cache is not None and sequence.cache is not None and not sequence.error:
            sequence.prefix_cache.store(
                self.target, sequence.cache, sequence.tokens, sequence.tenant, sequence.done
            )
            if sequence.done:
                sequence.cache = None  # the prefix cache's now

    def _entries(self) -> list[_Entry]:
        """This step's tokens per running sequence (steps 1 and 2 of the module doc)."""
        chunk = getattr(self.target, "prefill_chunk", None) or PREFILL_CHUNK  # the target's own
        budget = chunk if all(s.prefilling for s in self.running) else self.prefill_tokens
        longest = getattr(self.target, "max_draft", None)  # its logits' bound, if any
        entries = []
        for sequence in self.running:
            missing = sequence.tokens[sequence.cache.get_seq_length() : -1]  # prompt not cached
            if len(missing) > budget:  # a chunk of the prompt only (if any room is left)
                if budget:
                    entries.append(_Entry(sequence, missing[:budget], Draft(), 0))
                budget = 0
                continue
            budget -= len(missing)
            with _isolated(sequence):
                draft = sequence.propose()
            if sequence.error is None:
                draft = draft if longest is None else draft.cut(longest)
                entries.append(_Entry(sequence, [*missing, sequence.tokens[-1]], draft, 1))
        # Each policy sizes its sequences' drafts jointly; every other row is fixed for it.
        groups: dict[int, list[_Entry]] = {}
        for entry in entries:
            if entry.draft:
                groups.setdefault(id(entry.sequence.policy), []).append(entry)
        for group in groups.values():
            fixed = sum(
                len(entry.token_ids) + len(entry.draft) * (entry not in group) for entry in entries
            ) - len(group)
            drafts = [entry.sequence.speculation.of(entry.draft) for entry in group]
            lengths = group[0].sequence.policy.decide(drafts, fixed_tokens=fixed)
            for entry, length in zip(group, lengths):
                entry.draft = entry.draft.cut(length)
        for entry in entries:
            if entry.logits_to_keep:
                entry.token_ids = [*entry.token_ids, *entry.draft]
                entry.logits_to_keep = len(entry.draft) + 1
        return entries


@contextlib.contextmanager
def _isolated(sequence: BatchSequence) -> Iterator[None]:
    """Run one sequence's own work: an exception there ends that sequence alone
    (:meth:`BatchSequence.fail`), not the step."""
    try:
        yield
    except Exception as error:
        sequence.fail(error)
