"""Continuous batching: the decoding loop of :mod:`promptlookup.loop` over many sequences at
once, every step verifying all their drafts in **one** forward pass.

Each :meth:`BatchDecoder.step`:

1. *Admit*: waiting sequences join while fewer than ``max_batch`` run (sequences join and
   leave only at step boundaries).
2. *Draft*: every sequence whose prompt is in its cache drafts, as it would alone.
3. *Decide*: the policy sets all draft lengths jointly, from the cost of the whole pass and
   each sequence's own acceptance (:meth:`~promptlookup.policy.SpeculationPolicy.joint_draft_lengths`).
4. *One forward pass* over every sequence's new tokens: the next chunk of a joining sequence's
   prompt, or a running sequence's last token and its draft.
5. *Verify*: each sequence keeps its accepted tokens and its bonus token, chosen by its own
   chooser, and ends at EOS, its token budget or its ``should_stop`` (the step of a single
   stream: :meth:`~promptlookup.loop.DecodingSequence.accept`).
6. *Crop* each cache back to its accepted tokens; finished sequences leave.

Exactness: a :class:`~promptlookup.backends.base.BatchTarget` with ``row_invariant`` computes
each sequence's rows bit for bit as a pass over that sequence alone would, so a sequence's
tokens (greedy, or sampled with its own seeded generator) do not depend on what else shares
its passes, nor on the draft lengths chosen for it.

Prefill policy (time to first token against inter-token latency): while other sequences are
decoding, a step carries at most ``prefill_tokens`` prompt tokens (oldest joiner first), so
a long prompt delays each running sequence's next step by about one pass over that many
tokens rather than by a whole prefill (``promptlookup serve --prefill-tokens``; more lifts
throughput, since every step also carries the running sequences' drafts); with nobody
decoding, prompts go in whole chunks of
:data:`~promptlookup.backends.base.PREFILL_CHUNK` tokens. A prompt's last
chunk goes into the same pass as its first draft, which yields its first token.

Memory: each sequence holds its own KV cache, ``2 * layers * kv_heads * head_dim`` values per
token, with capacity rounded up to 64 tokens and doubling as it grows (SmolLM2-135M in
float32: 46 KB per token, so 8 sequences of 2,048 tokens take about 0.75 GB).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .backends.base import PREFILL_CHUNK, BatchTarget
from .drafters.base import Draft
from .errors import InvalidParameterError
from .loop import DecodingSequence
from .policy import AcceptanceModel, SequenceDraft, SpeculationPolicy


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
    :func:`~promptlookup.loop.speculative_generate` takes them, its state and its step) with
    its own acceptance statistics, and its KV cache once it joins. ``adaptive``: whether the
    policy trims its drafts (else they are verified whole). ``should_stop()``, asked before
    every step, cancels it when true (as :meth:`cancel` does)."""

    acceptance: AcceptanceModel | None = field(default_factory=AcceptanceModel)
    adaptive: bool = True
    should_stop: Callable[[], bool] | None = None

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise InvalidParameterError("a batch sequence needs a non-empty prompt")
        super().__post_init__()
        self.cache = None  # its KV cache, from the target when it joins

    @property
    def prefilling(self) -> bool:
        """Whether prompt tokens besides the last are still missing from the cache."""
        return self.cache.get_seq_length() < len(self.tokens) - 1

    def cancel(self) -> None:
        """End the sequence before its next step."""
        self.finish("cancelled")


@dataclass(eq=False)
class _Entry:
    """What a sequence feeds into this step's pass, and how many rows of logits it wants
    back (``rows``): none for a prompt chunk, its last token's and its draft's otherwise."""

    sequence: BatchSequence
    token_ids: list[int]
    draft: Draft
    rows: int


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
        policy: SpeculationPolicy | None = None,
        max_batch: int = 8,
        prefill_tokens: int = PREFILL_TOKENS,
    ) -> None:
        if max_batch < 1:
            raise InvalidParameterError(f"max_batch must be >= 1, got {max_batch}")
        if prefill_tokens < 1:
            raise InvalidParameterError(f"prefill_tokens must be >= 1, got {prefill_tokens}")
        self.target, self.policy = target, policy
        self.max_batch, self.prefill_tokens = max_batch, prefill_tokens
        self.waiting: collections.deque[BatchSequence] = collections.deque()
        self.running: list[BatchSequence] = []

    def add(self, sequence: BatchSequence) -> BatchSequence:
        """Queue a sequence; it joins at the next step with room."""
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
        that took part, finished ones included (their ``finish_reason`` set)."""
        # 1. Admit waiting sequences; drop the ones that were cancelled or asked to stop.
        adaptive = [sequence for sequence in self.waiting if sequence.adaptive]
        if self.policy is not None and not self.policy.costs.calibrated and adaptive:
            self._calibrate(adaptive[0].tokens[-1])
        while self.waiting and len(self.running) < self.max_batch:
            sequence = self.waiting.popleft()
            sequence.cache = self.target.new_sequence()
            self.running.append(sequence)
        events = []
        for sequence in self.running:
            if not sequence.done and sequence.should_stop is not None and sequence.should_stop():
                sequence.cancel()
            if sequence.done or sequence.max_new_tokens < 1:
                sequence.finish_reason = sequence.finish_reason or "length"
                events.append((sequence, []))
        self.running = [sequence for sequence in self.running if not sequence.done]
        if not self.running:
            return events
        # 2-3. Prompt chunks for joining sequences; drafts, sized jointly, for the others.
        entries = self._entries()
        # 4. One forward pass over every sequence's new tokens.
        decoding = [entry for entry in entries if entry.rows]
        total = sum(len(entry.token_ids) for entry in entries)
        self.target.prepare([total])
        forward_start = time.perf_counter()
        target_logits = self.target.forward_batch(  # (rows_i, vocab) each
            [entry.sequence.cache for entry in entries],
            [entry.token_ids for entry in entries],
            [entry.rows for entry in entries],
        )
        seconds = time.perf_counter() - forward_start
        if (
            self.policy is not None
            and len(decoding) == len(entries)
            and all(entry.sequence.stats.forward_passes for entry in entries)
        ):
            self.policy.record_forward(total, seconds, batch_size=len(entries))
        # 5-6. Each sequence verifies its own draft, then its cache is cropped back.
        for entry, logits in zip(entries, target_logits):
            if entry.rows:
                sequence = entry.sequence
                new_tokens = sequence.accept(entry.draft, logits, self.policy)
                # Crop the cache back to the accepted tokens (the bonus token is fed next step).
                sequence.cache.crop(len(sequence.tokens) - 1 - sequence.cache.get_seq_length())
                events.append((sequence, new_tokens))
        self.running = [sequence for sequence in self.running if not sequence.done]
        return events

    def _calibrate(self, probe_token: int) -> None:
        """Measure the one-sequence cost curve (once per policy, or never with a cost file)
        on the target's own cache, which batched passes do not use."""
        self.target.reset()
        self.target.prefill([probe_token])
        self.policy.store.begin(self.target, probe_token)
        self.target.reset()

    def _entries(self) -> list[_Entry]:
        """This step's tokens per running sequence (steps 2 and 3 of the module doc)."""
        budget = PREFILL_CHUNK if all(s.prefilling for s in self.running) else self.prefill_tokens
        entries, decided = [], []
        for sequence in self.running:
            missing = sequence.tokens[sequence.cache.get_seq_length() : -1]  # prompt not cached
            if len(missing) > budget:  # a chunk of the prompt only (if any room is left)
                if budget:
                    entries.append(_Entry(sequence, missing[:budget], Draft(), rows=0))
                budget = 0
                continue
            budget -= len(missing)
            draft = sequence.propose()
            entries.append(_Entry(sequence, [*missing, sequence.tokens[-1]], draft, rows=1))
            if draft and sequence.adaptive and self.policy is not None:
                decided.append(entries[-1])
        if decided:  # every row but the decided drafts' is fixed
            fixed = sum(
                len(entry.token_ids) + len(entry.draft) * (entry not in decided)
                for entry in entries
            ) - len(decided)
            lengths = self.policy.joint_draft_lengths(
                [
                    SequenceDraft(
                        len(entry.draft),
                        entry.draft.match_length,
                        entry.sequence.acceptance,
                        entry.sequence.chooser.do_sample,
                        entry.draft.source,
                    )
                    for entry in decided
                ],
                fixed_tokens=fixed,
            )
            for entry, length in zip(decided, lengths):
                entry.draft = entry.draft.cut(length)
        for entry in entries:
            if entry.rows:
                entry.token_ids, entry.rows = [*entry.token_ids, *entry.draft], len(entry.draft) + 1
        return entries
