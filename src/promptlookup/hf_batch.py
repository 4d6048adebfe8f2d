"""The decoding of :mod:`promptlookup.hf_generate`: ``model.generate`` over left-padded rows
``(B, L)`` with their ``attention_mask`` (one row included), run on :mod:`promptlookup.batching`
and returned as ``transformers``' ``_sample`` returns them.

Policies:

- Each row is one :class:`~promptlookup.batching.BatchSequence` without its padding; its
  chooser (:class:`PaddedChooser`) hands the padding back to the logits processors, which
  are called with that row alone (:func:`row_processors`).
- Stopping criteria are asked after every accepted token of a row, with the row's running ids.
  With an EOS-aware criterion (as in ``_sample``) a row that stops is done: the step's later
  tokens never happened, and the returned row is right-padded with ``pad_token_id`` (else
  ``eos_token_id[0]``). Without one, the first row to stop sets the length, and every row
  ends with that many new tokens (``_sample`` stops all rows at once).
- Greedy rows equal plain ``generate``'s; sampled ones follow its distribution, and one row
  its very draws (torch's global generator, one draw per token in the same order).
- One row may stream: each token goes to the ``streamer`` once accepted and before any stop.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from .batching import BatchDecoder, BatchSequence
from .errors import InvalidParameterError
from .loop import GenerationStats
from .sampling import TokenChooser


def decode_batch(
    target,
    policy,
    input_ids: torch.Tensor,
    pads: Sequence[int],
    drafters: Sequence,
    logits_processor,
    stopping_criteria,
    generation_config,
    streamer=None,
):
    """The batch ``input_ids`` (B, L), with ``pads[i]`` leading pad tokens in row i, decoded
    with ``drafters[i]`` on ``target``: ``(sequences, stats, cache)``, the returned
    ``sequences`` (B, L + new tokens), the row's :class:`GenerationStats` (a batch's: its rows'
    added up) and the row's KV cache as after ``_sample``, every token but the last (None for a
    batch or a padded row, whose positions would not line up with ``sequences``)."""
    # As _sample: rows stopped by an EOS-aware criterion get padding while others go on.
    pad_rows = any(hasattr(criterion, "eos_token_id") for criterion in stopping_criteria)
    pad_id = generation_config._pad_token_tensor  # pad, else eos[0]
    if pad_rows and pad_id is None and len(pads) > 1:
        raise InvalidParameterError("a batch that stops on EOS needs a pad_token_id")
    rows, length = input_ids.tolist(), input_ids.shape[1]
    budget = max(1, (generation_config.max_length or length + 1) - length)  # >= 1 like _sample
    sequences = [
        BatchSequence(
            row[pad:],
            budget,
            drafter=drafter,
            policy=policy,
            chooser=PaddedChooser(
                row[:pad], row_processors(logits_processor, i), bool(generation_config.do_sample)
            ),
        )
        for i, (row, pad, drafter) in enumerate(zip(rows, pads, drafters))
    ]
    stops: list[int | None] = [None] * len(rows)  # new tokens of each row when it stopped
    decoder = BatchDecoder(target, policy, max_batch=len(rows))
    for sequence in sequences:
        decoder.add(sequence)
    streamed = 0  # tokens of the one row given to the streamer
    for sequence, new_tokens in decoder.run():
        if sequence.error is not None:
            raise sequence.error  # a logits processor's or drafter's own failure
        i = sequences.index(sequence)  # by identity
        if stops[i] is not None:
            continue
        stops[i] = _stop(
            rows[i][: pads[i]], sequence, len(new_tokens), stopping_criteria, input_ids.device
        )
        if stops[i] is not None and pad_rows:
            sequence.finish("stop", drop=sequence.stats.new_tokens - stops[i])
        elif stops[i] is not None and None not in stops:
            _settle(sequences, max(stops))  # every row runs to the longest stop
        if streamer is not None:  # one row: this step's tokens up to any stop
            start = len(sequence.prompt_ids)
            for token in sequence.tokens[start + streamed : start + sequence.stats.new_tokens]:
                streamer.put(torch.tensor([token]))  # (1,) like _sample's next_tokens
            streamed = sequence.stats.new_tokens
    longest = max(stops)
    for row, sequence, stop in zip(rows, sequences, stops):
        new = sequence.tokens[len(sequence.prompt_ids) :]
        row += new[:stop] + [int(pad_id)] * (longest - stop) if pad_rows else new[:longest]
    out = torch.tensor(rows, dtype=input_ids.dtype, device=input_ids.device)
    if len(sequences) > 1:
        return out, _summed([sequence.stats for sequence in sequences]), None
    (sequence,) = sequences
    sequence.cache.crop(len(sequence.tokens) - 1)  # as after _sample: all but the last token
    return out, sequence.stats, None if pads[0] else sequence.cache


def row_processors(processors, row: int):
    """``generate``'s processors for one row of its batch, called with that row alone: the
    repetition penalty gets only the row's padding length (which it skips) and
    ``prefix_allowed_tokens_fn`` the row's index; the others work row by row."""
    from transformers import (
        LogitsProcessorList,
        PrefixConstrainedLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
    )

    own = LogitsProcessorList()
    for processor in processors or ():
        if isinstance(processor, RepetitionPenaltyLogitsProcessor) and isinstance(
            processor.prompt_ignore_length, torch.Tensor
        ):
            processor = copy.copy(processor)
            processor.prompt_ignore_length = processor.prompt_ignore_length[row : row + 1]
        elif isinstance(processor, PrefixConstrainedLogitsProcessor):
            processor, allowed = copy.copy(processor), processor._prefix_allowed_tokens_fn
            processor._prefix_allowed_tokens_fn = lambda _, ids, allowed=allowed: allowed(row, ids)
        own.append(processor)
    return own


def _stop(padding, sequence, num_new, stopping_criteria, device) -> int | None:
    """The new-token count of ``sequence`` at which a stopping criterion fired on its running
    ids (padding first) in its last ``num_new`` tokens, or when it finished, else None."""
    done = sequence.stats.new_tokens
    for count in range(done - num_new + 1, done + 1):
        prefix = sequence.tokens[: len(sequence.prompt_ids) + count]
        if bool(stopping_criteria(torch.tensor([padding + prefix], device=device), None).any()):
            return count
    return done if sequence.done else None


def _settle(sequences, stop: int) -> None:
    """Every row ends with ``stop`` new tokens: cut the ones past it, extend the others."""
    for sequence in sequences:
        if sequence.stats.new_tokens >= stop:
            sequence.finish("stop", drop=sequence.stats.new_tokens - stop)
        else:
            sequence.max_new_tokens = stop


def _summed(stats: Sequence[GenerationStats]) -> GenerationStats:
    """The counters of a batch's rows added up (``seconds``: the longest row's)."""
    names = ("prompt_tokens", "new_tokens", "forward_passes", "drafted_tokens", "accepted_tokens")
    return GenerationStats(
        **{name: sum(getattr(row, name) for row in stats) for name in names},
        seconds=max(row.seconds for row in stats),
    )


class PaddedChooser(TokenChooser):
    """A TokenChooser whose processors see the left padding before ``input_ids``, as in plain
    ``generate`` (the repetition penalty skips it; min length counts it)."""

    def __init__(self, padding: Sequence[int], processors, do_sample: bool) -> None:
        super().__init__(processors, do_sample=do_sample, generator=None)
        self.padding = list(padding)

    def choose(self, input_ids: torch.Tensor, target_logits: torch.Tensor) -> int:
        if self.padding:
            pad = torch.tensor([self.padding], dtype=input_ids.dtype, device=input_ids.device)
            input_ids = torch.cat([pad, input_ids], dim=1)  # (1, num_pad + n)
        return super().choose(input_ids, target_logits)
