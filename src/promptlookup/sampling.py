"""How the target picks its token at a verified position: greedy, or exact sampling after
``transformers``' logits processors (repetition penalty, temperature, top-k, top-p)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .errors import InvalidParameterError
from .limits import MIN_TEMPERATURE, REPETITION_PENALTY_RANGE


@dataclass(frozen=True)
class SamplingParams:
    """``temperature=0`` means greedy. ``top_k=0`` and ``top_p=1`` switch those filters off.

    Temperatures between 0 and :data:`MIN_TEMPERATURE`, and repetition penalties outside
    :data:`REPETITION_PENALTY_RANGE`, are refused: dividing or multiplying the logits by them
    leaves float32's range (inf, then NaN probabilities)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        def bad(name: str, value: object, rule: str) -> InvalidParameterError:
            return InvalidParameterError(f"{name} must be {rule}, got {value!r}")

        if not (
            isinstance(self.temperature, (int, float))
            and not isinstance(self.temperature, bool)
            and math.isfinite(self.temperature)
            and (self.temperature == 0 or self.temperature >= MIN_TEMPERATURE)
        ):
            raise bad("temperature", self.temperature, f"0 (greedy) or >= {MIN_TEMPERATURE}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", self.top_k, "an integer >= 0 (0 = off)")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise bad("top_p", self.top_p, "in (0, 1]")
        low, high = REPETITION_PENALTY_RANGE
        if not (
            isinstance(self.repetition_penalty, (int, float))
            and low <= self.repetition_penalty <= high
        ):
            raise bad("repetition_penalty", self.repetition_penalty, f"in [{low}, {high}]")
        for name in ("temperature", "top_p", "repetition_penalty"):  # an integer 2 means 2.0
            object.__setattr__(self, name, float(getattr(self, name)))

    @classmethod
    def keywords(cls) -> tuple[str, ...]:
        """The settings' names: the keywords of ``generate``/``stream``, of the CLI's flags
        (``--top-k`` is top_k) and of the server's request fields."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def as_kwargs(self) -> dict:
        """The settings as ``generate``'s keyword arguments: ``lm.generate(p, **s.as_kwargs())``."""
        return {name: getattr(self, name) for name in self.keywords()}

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def logits_processor(self) -> LogitsProcessorList:
        """The processors ``model.generate`` would build for these settings, in its order."""
        processors = LogitsProcessorList()
        if self.repetition_penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(self.repetition_penalty))
        if not self.greedy:
            if self.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(self.temperature))
            if self.top_k:
                processors.append(TopKLogitsWarper(self.top_k))
            if self.top_p < 1.0:
                processors.append(TopPLogitsWarper(self.top_p))
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
        return cls(params.logits_processor(), do_sample=not params.greedy, generator=generator)

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
