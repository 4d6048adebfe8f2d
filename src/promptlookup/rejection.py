"""Speculative sampling: verifying a *sampled* draft so that the output keeps exactly the
target's distribution (Leviathan et al. 2023, Chen et al. 2023).

At verified position i the draft token ``x`` was drawn from ``draft_probs[i]``; the target's
distribution there is ``target_probs`` (the chooser's processors on the target's logits, then
softmax, exactly as plain sampling computes it). The rule:

- accept ``x`` with probability ``min(1, target_probs[x] / draft_probs[x])``;
- on rejection, draw the token from the *residual* distribution, the normalised positive part
  of ``target_probs - draft_probs``, and stop (the rest of the draft is discarded);
- if every draft token is accepted, the bonus token is drawn from the target's distribution at
  the position after the draft.

Each emitted token is then distributed exactly as the target's: ``P(x) = min(draft, target) +
(1 - sum min(draft, target)) * residual = target``. All random numbers come from the chooser's
generator.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from .sampling import TokenChooser


def target_distribution(
    chooser: TokenChooser, tokens: Sequence[int], target_logits: torch.Tensor
) -> torch.Tensor:
    """The target's sampling distribution (vocab,) after ``tokens``, from its logits (vocab,)."""
    input_ids = torch.tensor([list(tokens)], dtype=torch.long, device=target_logits.device)
    scores = chooser.processors(input_ids, target_logits[None].float())  # (1, vocab)
    return torch.softmax(scores[0], dim=-1)


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """The distribution (vocab,) to draw from after a rejection: ``max(0, target - draft)``
    normalised. (When the two are equal a rejection cannot happen but for rounding; then the
    target's distribution itself is used.)"""
    residual = torch.clamp(target_probs - draft_probs, min=0)  # (vocab,)
    total = residual.sum()
    return residual / total if total > 0 else target_probs


def verify_sampled_draft(
    chooser: TokenChooser,
    tokens: list[int],
    draft: Sequence[int],
    draft_probs: torch.Tensor,
    target_logits: torch.Tensor,
) -> Iterator[int]:
    """Yield the accepted draft tokens, then one more token (the resampled token after a
    rejection, or the bonus token).

    ``draft_probs`` (>= len(draft), draft vocab): row i is the distribution ``draft[i]`` was
    drawn from. ``target_logits`` (len(draft) + 1, vocab): row i scores the token after
    ``draft[:i]``. As for :func:`promptlookup.loop.verified_tokens`, the caller appends each
    yielded token to ``tokens`` before the next is computed.
    """
    generator = chooser.generator
    device = generator.device if generator is not None else target_logits.device
    for i, token in enumerate(draft):
        target_probs = target_distribution(chooser, tokens, target_logits[i]).to(device)
        row = _same_width(draft_probs[i].float().to(device), target_probs.shape[-1])
        draft_p = float(row[token]) if token < row.shape[-1] else 0.0
        target_p = float(target_probs[token]) if token < target_probs.shape[-1] else 0.0
        coin = float(torch.rand((), generator=generator, device=device))
        if coin * draft_p < target_p:  # accepted with probability min(1, target_p / draft_p)
            yield token
            continue
        residual = residual_distribution(target_probs, row)
        yield int(torch.multinomial(residual, 1, generator=generator))
        return
    target_probs = target_distribution(chooser, tokens, target_logits[len(draft)]).to(device)
    yield int(torch.multinomial(target_probs, 1, generator=generator))  # the bonus token


def _same_width(draft_probs: torch.Tensor, vocab: int) -> torch.Tensor:
    """Draft probabilities over the target's vocabulary: a draft model's logits may be padded
    to a different size than the target's (the tokenizer is the same)."""
    width = draft_probs.shape[-1]
    if width > vocab:
        return draft_probs[:vocab]
    if width < vocab:
        return torch.nn.functional.pad(draft_probs, (0, vocab - width))
    return draft_probs
