"""How the target picks its token at a verified position: greedy, or exact sampling after
``transformers``' logits processors (repetition penalty, temperature, top-k, top-p)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .limits import SamplingParams


def logits_processors(params: SamplingParams) -> LogitsProcessorList:
    """The processors ``model.generate`` would build for ``params``, in its order."""
    processors = LogitsProcessorList()
    if params.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    if not params.greedy:
        if params.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k:
            processors.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            processors.append(TopPLogitsWarper(params.top_p))
    return processors


class TokenChooser:
    """Picks the target's token from its logits at one position.

    ``processors`` run on ``(input_ids (1, n), scores (1, vocab))`` exactly as in
    ``model.generate``; ``do_sample`` draws from the softmax (with ``generator``, or torch's
    global generator when None), else takes the argmax.
    """

    def __init__(
        self,
        processors: LogitsProcessorList | None,
        do_sample: bool,
        generator: torch.Generator | None = None,
    ) -> None:
        self.processors = processors or LogitsProcessorList()
        self.do_sample = do_sample
        self.generator = generator

    @classmethod
    def from_params(
        cls, params: SamplingParams, device: torch.device | str = "cpu"
    ) -> TokenChooser:
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=device)
            if params.seed is not None:
                generator.manual_seed(params.seed)
            else:
                generator.seed()
        return cls(logits_processors(params), do_sample=not params.greedy, generator=generator)

    @property
    def plain_argmax(self) -> bool:
        """True when the choice at every position is a bare argmax (no processor, no sampling),
        so all positions of a forward pass can be decided at once."""
        return not self.do_sample and len(self.processors) == 0

    def choose(self, input_ids: torch.Tensor, target_logits: torch.Tensor) -> int:
        """``input_ids``: (1, n) tokens so far; ``target_logits``: (vocab,) for position n."""
        scores = self.processors(input_ids, target_logits[None].float())  # (1, vocab)
        if not self.do_sample:
            return int(scores[0].argmax())
        target_probs = torch.softmax(scores[0], dim=-1)  # (vocab,)
        return int(torch.multinomial(target_probs, 1, generator=self.generator))


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability and the ``top`` most likely tokens at its position,
    as ``(token_id, logprob)`` pairs, most likely first.

    The distribution is the *processed* one the chooser picks from: the softmax of the scores
    after its logits processors (see :meth:`SamplingParams.logits_processor`). For greedy
    decoding that is the raw logits with the repetition penalty applied; for sampling,
    temperature, top-k and top-p are applied too, so tokens filtered out have ``-inf``."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprob(
    chooser: TokenChooser, tokens: list[int], target_logits: torch.Tensor, token: int, top_n: int
) -> TokenLogprob:
    """The :class:`TokenLogprob` of ``token`` chosen after ``tokens`` from ``target_logits``
    (vocab,), computed exactly as :meth:`TokenChooser.choose` processes them, so that a
    position's answer depends only on its tokens and its logits row."""
    input_ids = torch.tensor([tokens], dtype=torch.long, device=target_logits.device)
    scores = chooser.processors(input_ids, target_logits[None].float())  # (1, vocab)
    logprobs = torch.log_softmax(scores, dim=-1)[0]  # (vocab,)
    top: tuple[tuple[int, float], ...] = ()
    if top_n > 0:
        values, ids = torch.topk(logprobs, min(top_n, logprobs.numel()))
        top = tuple(zip(ids.tolist(), values.tolist()))
    return TokenLogprob(int(token), float(logprobs[token]), top)
