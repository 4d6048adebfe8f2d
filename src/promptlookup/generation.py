"""The Python API: a loaded model (tokenizer + target backend) that generates text with a
drafter, streaming or not."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence, Union

from .backends.base import Target
from .drafters import DrafterSpec, NoDrafter, make_drafter
from .errors import EmptyPromptError, InvalidParameterError, PromptTooLongError
from .loop import GenerationStats, speculative_generate
from .policy import SpeculationPolicy, check_speculation
from .sampling import SamplingParams, TokenChooser
from .text import IncrementalDetokenizer, StopStrings

#: A prompt: plain text, chat messages ``[{"role": ..., "content": ...}]``, or token ids.
Prompt = Union[str, Sequence[dict], Sequence[int]]


@dataclass
class GenerationResult:
    """What a generation returns. ``token_ids`` are the new tokens (ending with the EOS or the
    token that completed a stop string, if any); ``text`` is their text, cut before a stop
    string; ``finish_reason`` is ``"stop"`` (EOS or stop string) or ``"length"``."""

    text: str
    token_ids: list[int]
    stats: GenerationStats
    finish_reason: str = "length"
    prompt_ids: list[int] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason,
                "stats": self.stats.as_dict()}


class GenerationStream:
    """Iterate to receive text deltas as tokens are accepted; ``result`` is set at the end.
    ``close()`` (or leaving a ``with`` block) stops the generation within one decoding step."""

    def __init__(self, events: Iterator[str]) -> None:
        self._events = events
        self.result: GenerationResult | None = None
        #: The generation's statistics, filled in as it runs (``stats.logprobs`` included).
        self.stats: GenerationStats | None = None

    def __iter__(self) -> Iterator[str]:
        return self._events

    def close(self) -> None:
        self._events.close()

    def __enter__(self) -> GenerationStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LanguageModel:
    """A target model with its tokenizer. Build it with :func:`promptlookup.load_model`.

    >>> lm = promptlookup.load_model()                                  # doctest: +SKIP
    >>> result = lm.generate("Fix: def f(x): retrun x", chat=True)      # doctest: +SKIP
    >>> result.text, result.stats.tokens_per_forward                    # doctest: +SKIP
    """

    def __init__(self, target: Target, tokenizer, name: str = "model", model=None) -> None:
        self.target = target
        self.tokenizer = tokenizer
        self.name = name
        self.model = model  # the underlying framework model, when there is one
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos = eos if eos is not None else tokenizer.eos_token_id
        self.eos_token_ids = [eos] if isinstance(eos, int) else list(eos or [])
        #: Learned costs and acceptance statistics, shared by this model's requests.
        self.policy = SpeculationPolicy()

    # -- prompts ------------------------------------------------------------------------------

    def encode(self, prompt: Prompt, chat: bool = False) -> list[int]:
        """Token ids for a prompt. Messages always use the chat template; a string uses it
        when ``chat`` is true."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise EmptyPromptError("the prompt is empty")
            if chat:
                return self.encode([{"role": "user", "content": prompt}])
            return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])
        items = list(prompt)
        if not items:
            raise EmptyPromptError("the prompt is empty")
        if all(isinstance(t, int) for t in items):
            return items
        if all(isinstance(m, dict) and "role" in m and "content" in m for m in items):
            ids = self.tokenizer.apply_chat_template(items, add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        raise InvalidParameterError("a prompt must be text, token ids, or messages with role and content")

    # -- generation ---------------------------------------------------------------------------

    def warm_up(self) -> None:
        """Measure now what the first request would otherwise pay for inside its own time: the
        policy's forward-pass cost curve and the target's kernel choices (passes of 1-64
        tokens and prompt chunks). Both are kept on disk, so only the first process on a
        machine (per model, dtype, threads and version) measures; later ones take a second or
        two here. ``make demo`` and ``promptlookup serve`` call it before their first request."""
        ids = self.encode(" ".join(f"item {i}," for i in range(100)))
        # Over 128 tokens (a prompt chunk's kernels), with room for passes of up to 64 after it.
        self.generate(ids[: max(1, min(300, self.target.max_context - 80))], max_new_tokens=8)

    def stream(self, prompt: Prompt, *, max_new_tokens: int = 256,
               drafter: DrafterSpec = "prompt-lookup", temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, repetition_penalty: float = 1.0, seed: int | None = None,
               stop: Sequence[str] | str = (), chat: bool = False,
               speculation: str = "adaptive", should_stop: Callable[[], bool] | None = None,
               logprobs: int | None = None, **drafter_options) -> GenerationStream:
        """Like :meth:`generate`, but returns a :class:`GenerationStream` of text deltas.
        Invalid arguments raise here, before anything is generated."""
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InvalidParameterError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        params = SamplingParams(temperature, top_k, top_p, repetition_penalty, seed)
        prompt_ids = self.encode(prompt, chat=chat)
        if len(prompt_ids) + max_new_tokens > self.target.max_context:
            raise PromptTooLongError(
                f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                f"the model's context of {self.target.max_context} tokens")
        check_speculation(speculation)
        if logprobs is not None and (not isinstance(logprobs, int) or isinstance(logprobs, bool)
                                     or logprobs < 0):
            raise InvalidParameterError(f"logprobs must be an integer >= 0, got {logprobs!r}")
        stops = StopStrings([stop] if isinstance(stop, str) else list(stop))
        device = getattr(self.target, "device", "cpu")
        chooser = TokenChooser.from_params(params, device=device)
        adaptive = self.policy if speculation == "adaptive" else None
        # A draft model is loaded on the target's device and dtype, samples with `chooser` and
        # sizes its drafts by their cost with the policy.
        drafter_obj = make_drafter(drafter, eos_token_ids=self.eos_token_ids,
                                   tokenizer=self.tokenizer, chooser=chooser, policy=adaptive,
                                   device=str(device),
                                   dtype=str(getattr(self.model, "dtype", "float32")),
                                   **drafter_options)
        policy = adaptive if not isinstance(drafter_obj, NoDrafter) else None
        stream = GenerationStream(iter(()))
        stream._events = self._events(stream, prompt_ids, max_new_tokens, drafter_obj, chooser,
                                      stops, policy, should_stop, logprobs)
        return stream

    def _events(self, stream, prompt_ids, max_new_tokens, drafter, chooser, stops,
                policy, should_stop=None, logprobs=None) -> Iterator[str]:
        stats = stream.stats = GenerationStats()
        detok = IncrementalDetokenizer(self.tokenizer)
        tokens = speculative_generate(self.target, prompt_ids, max_new_tokens=max_new_tokens,
                                      drafter=drafter, chooser=chooser,
                                      eos_token_ids=self.eos_token_ids, stats=stats,
                                      policy=policy, should_stop=should_stop, logprobs=logprobs)
        finish_reason = "length"
        pieces: list[str] = []
        try:
            for token in tokens:
                piece = stops.feed(detok.add(token))
                if token in self.eos_token_ids:
                    finish_reason = "stop"
                if stops.stopped:
                    finish_reason = "stop"
                    tokens.close()  # a stop string: end the generation now
                if piece:
                    pieces.append(piece)
                    yield piece
            tail = stops.feed(detok.flush()) + stops.flush()
            if tail:
                pieces.append(tail)
                yield tail
        finally:
            tokens.close()
            stream.result = GenerationResult("".join(pieces), detok.ids, stats, finish_reason,
                                             list(prompt_ids))

    def generate(self, prompt: Prompt, **options) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens after ``prompt``. The keyword arguments
        are those of :meth:`stream` (one signature, shown for both):

        ``drafter``: ``"prompt-lookup"`` (default), ``"none"`` (plain decoding),
        ``"reference:FILE"``, ``"draft-model:PATH_OR_ID"``, a comma-separated chain such as
        ``"prompt-lookup,draft-model:PATH"`` (see :mod:`promptlookup.drafters`), a drafter
        object, a loaded draft model (a smaller ``LanguageModel`` with the same tokenizer), a
        callable ``f(tokens, max_tokens) -> list[int]``, or a list of these (a chain).
        ``temperature=0`` is greedy; otherwise exact sampling with ``top_k``/``top_p``/
        ``repetition_penalty``, reproducible with ``seed``. ``stop``: strings that end the
        generation (not included in ``text``). ``speculation="adaptive"`` (default) verifies
        only as much of each draft as the measured costs and learned acceptance say pays off
        (see :mod:`promptlookup.policy`); ``"fixed"`` verifies whole drafts. ``should_stop()``,
        asked before every forward pass, ends the generation early when it returns true.
        ``logprobs=N`` records every new token's log-probability and its ``N`` most likely
        alternatives in ``result.stats.logprobs`` (see
        :class:`~promptlookup.sampling.TokenLogprob`). Extra keyword
        arguments configure the drafter (e.g. ``num_tokens=8``, or ``reference_text=old_code``
        for prompt lookup).

        >>> lm.generate(prompt, drafter="draft-model:SmolLM2-135M.gguf")     # doctest: +SKIP
        >>> lm.generate(prompt, drafter="prompt-lookup", reference_text=old_code)  # doctest: +SKIP
        >>> lm.generate(prompt, drafter=lambda tokens: tokens[-4:])          # doctest: +SKIP
        """
        stream = self.stream(prompt, **options)
        for _ in stream:
            pass
        return stream.result


# generate takes stream's keyword arguments; help() and inspect show them for both.
LanguageModel.generate.__signature__ = inspect.signature(LanguageModel.stream).replace(
    return_annotation="GenerationResult")
