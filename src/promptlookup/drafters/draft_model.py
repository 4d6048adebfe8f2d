"""Draft model: a smaller causal LM sharing the target's tokenizer guesses the next tokens.

The draft model keeps its own KV cache across decoding steps. It stays in sync with the loop by
comparison, not by bookkeeping: at every ``propose`` it compares the tokens it has cached with the
loop's ``tokens``, crops its cache to their common prefix (dropping rejected draft tokens) and
feeds the tokens it has not seen (the accepted tokens and the bonus token, or everything another
drafter of a chain drafted meanwhile). So it can sit in a :class:`~.base.ChainDrafter` and skip
steps, or be reused for another prompt.

Drafting policy:

- Greedy decoding drafts the argmax; sampling draws each draft token from the draft model's
  distribution after the target's own logits processors (temperature, top-k, top-p, repetition
  penalty), using the generation's random generator, and returns those distributions with the
  draft (:attr:`~.base.Draft.draft_probs`) so the loop verifies with the speculative-sampling
  rejection rule (:mod:`promptlookup.rejection`): the output distribution stays exactly the
  target's.
- With a speculation policy (``policy``: the sequence's
  :class:`~promptlookup.policy.Speculation`, which the sequence hands its drafter), each draft
  is also capped at the length worth producing given the draft model's own measured seconds
  per draft token and the target's cost curve
  (:meth:`~promptlookup.policy.Speculation.worth_drafting`); 0 means a plain step.
- Draft length adapts like ``transformers``' assisted generation: it starts at
  ``start_tokens`` in each generation (a new ``tokens`` list); +2 after a draft the target
  accepted entirely, -1 otherwise, within ``[1, num_tokens]`` (the current one:
  ``draft_length``). Within a draft, drafting stops early after a position where the draft
  model's confidence (its highest probability) is below ``confidence_threshold`` (like
  ``assistant_confidence_threshold``; that position's token is still proposed) and after an
  end-of-sequence token.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Sequence

import torch

from ..backends.hf.target import TorchTarget
from ..backends.hf.window import WindowCropError
from ..errors import UnsupportedModelError
from ..prefix_tree import common_prefix_length
from .base import Draft
from .options import DRAFT_MODEL_DEFAULTS, check_draft_model_options


class DraftModelDrafter:
    """Drafts with a smaller ``transformers`` causal LM that shares the target's tokenizer.

    >>> import promptlookup                                                  # doctest: +SKIP
    >>> lm = promptlookup.load_model("HuggingFaceTB/SmolLM2-360M-Instruct")  # doctest: +SKIP
    >>> lm.generate("Explain KV caches.", chat=True,                         # doctest: +SKIP
    ...             drafter="draft-model:HuggingFaceTB/SmolLM2-135M-Instruct")
    >>> small = promptlookup.load_model()     # or an already loaded model   # doctest: +SKIP
    >>> lm.generate("Explain KV caches.", chat=True, drafter=small)          # doctest: +SKIP
    >>> lm.generate("...", drafter=DraftModelDrafter(small.model, num_tokens=8))  # doctest: +SKIP

    Args:
        model: the draft model (any causal LM whose forward takes ``cache=``), on the target's
            device. Its cache must be croppable (no sliding-window or recurrent layers).
        num_tokens: most tokens per draft.
        start_tokens: draft length of the first step (then adapted, see the module docstring).
        confidence_threshold: stop drafting after a position where the draft model's highest
            probability is lower (0 turns this off).
        eos_token_ids: tokens after which a draft stops.
        chooser: the generation's :class:`~promptlookup.sampling.TokenChooser`; its processors
            shape the draft distribution and, when it samples, its generator draws the draft.
            ``LanguageModel.generate`` builds the drafter with it (or hands it to a drafter
            object, see :func:`~.base.bind_generation`); None drafts greedily.
        policy: a :class:`~promptlookup.policy.Speculation` that caps each draft at the
            length worth its cost, or None (every draft as long as the adaptive length).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        num_tokens: int = DRAFT_MODEL_DEFAULTS["num_tokens"],
        start_tokens: int = DRAFT_MODEL_DEFAULTS["start_tokens"],
        confidence_threshold: float = DRAFT_MODEL_DEFAULTS["confidence_threshold"],
        eos_token_ids: Iterable[int] = (),
        chooser=None,
        policy=None,
    ) -> None:
        check_draft_model_options(num_tokens, start_tokens, confidence_threshold)
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.num_tokens = num_tokens
        self.start_tokens = start_tokens
        self.draft_length = min(start_tokens, num_tokens)  # the current (adaptive) one
        self._source: object = None  # the loop's token list (one object per generation)
        self.confidence_threshold = confidence_threshold
        self.eos_token_ids = frozenset(eos_token_ids)
        self.chooser = chooser
        #: The draft model's own cache and forward passes, the same as a target's.
        self.draft_target = TorchTarget(self.model)
        self.cached: list[int] = []  # the tokens whose keys and values the cache holds
        #: A :class:`~promptlookup.policy.Speculation` sizing drafts by cost, or None.
        self.policy = policy
        self.seconds_per_token: float | None = None  # measured cost of one draft token

    # -- the drafter protocol -----------------------------------------------------------------

    @torch.inference_mode()
    def propose(self, tokens: Sequence[int], max_tokens: int) -> Draft:
        """Up to ``max_tokens`` draft tokens; when sampling, with the (len(draft), vocab)
        distributions they were drawn from (``draft_probs``; None when greedy)."""
        if tokens is not self._source:  # a new generation: start over with the draft length
            self._source, self.draft_length = tokens, min(self.start_tokens, self.num_tokens)
        length = min(max_tokens, self.draft_length)
        if self.policy is not None and self.seconds_per_token is not None:
            length = min(length, self.policy.worth_drafting(self.seconds_per_token, length))
        if length < 1 or not tokens:
            return Draft()
        chooser = self.chooser
        processors = chooser.processors if chooser is not None else None
        sampling = chooser is not None and chooser.do_sample
        generator = chooser.generator if sampling else None
        input_ids = None
        if processors:  # the processors see the tokens so far, like the target's
            input_ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        draft_logits = self._sync(tokens)  # (vocab,) for the position after tokens
        start = time.perf_counter()
        draft: list[int] = []
        rows: list[torch.Tensor] = []
        while True:
            scores = draft_logits.float()[None]  # (1, vocab)
            if processors:
                scores = processors(input_ids, scores)
            draft_probs = torch.softmax(scores[0], dim=-1)  # (vocab,)
            if sampling:
                on = generator.device if generator is not None else draft_probs.device
                token = int(torch.multinomial(draft_probs.to(on), 1, generator=generator))
            else:
                token = int(scores[0].argmax())
            draft.append(token)
            rows.append(draft_probs)
            if (
                len(draft) >= length
                or token in self.eos_token_ids
                or float(draft_probs.max()) < self.confidence_threshold
            ):
                break
            draft_logits = self._feed([token])
            if input_ids is not None:
                next_id = torch.tensor([[token]], dtype=torch.long, device=self.device)
                input_ids = torch.cat([input_ids, next_id], dim=1)
        if len(draft) > 1:  # its own forward passes' time, one per draft token after the first
            seconds = (time.perf_counter() - start) / (len(draft) - 1)
            previous = self.seconds_per_token
            self.seconds_per_token = seconds if previous is None else 0.8 * previous + 0.2 * seconds
        return Draft(draft, draft_probs=torch.stack(rows) if sampling else None)

    def update(self, draft: Sequence[int], num_accepted: int) -> None:
        """Adapt the draft length: +2 after a fully accepted draft, -1 otherwise."""
        if not draft:
            return  # a step this drafter did not draft (e.g. in a chain)
        if num_accepted >= len(draft):
            self.draft_length = min(self.num_tokens, self.draft_length + 2)
        else:
            self.draft_length = max(1, self.draft_length - 1)

    # -- the draft model's cache --------------------------------------------------------------

    def _sync(self, tokens: Sequence[int]) -> torch.Tensor:
        """Crop the cache to its common prefix with ``tokens``, feed the rest; returns the
        draft logits (vocab,) for the position after ``tokens``."""
        keep = min(common_prefix_length(self.cached, tokens), len(tokens) - 1)
        drop = len(self.cached) - keep
        if drop > 0:
            if not self.cache.is_croppable:
                raise UnsupportedModelError(
                    f"draft model {type(self.model).__name__} keeps a cache that cannot be cropped"
                )
            try:
                self.cache.crop(self.cache.get_seq_length() - drop)
            except WindowCropError:  # back past a sliding window it holds: start again
                self.draft_target.reset()
                keep = 0
            del self.cached[keep:]
        return self._feed(list(tokens[keep:]))

    @property
    def cache(self):
        return self.draft_target.cache

    def _feed(self, token_ids: list[int]) -> torch.Tensor:
        """Append ``token_ids`` (at least one) to the cache; the logits (vocab,) after them."""
        draft_logits = self.draft_target.extend(token_ids)
        self.cached.extend(token_ids)
        return draft_logits

    def __repr__(self) -> str:
        return (
            f"DraftModelDrafter({type(self.model).__name__}, num_tokens={self.num_tokens}, "
            f"confidence_threshold={self.confidence_threshold})"
        )


def check_same_tokenizer(
    draft_tokenizer, target_tokenizer, draft_name: str = "draft model"
) -> None:
    """Raise :class:`UnsupportedModelError` unless both tokenizers map the same strings to the
    same ids (a draft model's token ids must mean what the target's mean)."""
    if draft_tokenizer is None or target_tokenizer is None or draft_tokenizer is target_tokenizer:
        return
    draft_size, target_size = _size(draft_tokenizer), _size(target_tokenizer)
    if draft_size != target_size:
        raise UnsupportedModelError(
            f"{draft_name}: its tokenizer has {draft_size} tokens, the "
            f"target's {target_size}; a draft model must share the "
            "target's tokenizer"
        )
    if hasattr(draft_tokenizer, "get_vocab") and hasattr(target_tokenizer, "get_vocab"):
        draft_vocab, target_vocab = draft_tokenizer.get_vocab(), target_tokenizer.get_vocab()
        if draft_vocab != target_vocab:
            differing = sorted(set(draft_vocab.items()) ^ set(target_vocab.items()))[:1]
            example = f" (e.g. {differing[0][0]!r})" if differing else ""
            raise UnsupportedModelError(
                f"{draft_name}: its tokenizer maps tokens to other ids "
                f"than the target's{example}; a draft model must share "
                "the target's tokenizer"
            )


def _size(tokenizer) -> int | None:
    """Number of tokens, added tokens included."""
    return (
        len(tokenizer) if hasattr(tokenizer, "__len__") else getattr(tokenizer, "vocab_size", None)
    )


@functools.lru_cache(maxsize=2)
def load_draft_model(path: str, dtype: str = "float32", device: str = "cpu"):
    """``(model, tokenizer)`` for ``draft-model:PATH``, loaded once per process (each
    generation then gets a fresh :class:`DraftModelDrafter` with its own cache)."""
    from ..models import load_pretrained

    model, tokenizer, _ = load_pretrained(path, dtype=dtype, device=device)
    return model, tokenizer
