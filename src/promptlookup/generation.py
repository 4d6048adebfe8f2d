"""The Python API: a loaded model (tokenizer + target backend) that generates text with a
drafter, streaming or not."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from .backends.base import BatchTarget, Target
from .batching import PREFILL_TOKENS, BatchDecoder, BatchSequence, default_max_batch
from .drafters import Drafter, DrafterSpec, NoDrafter, make_drafter
from .errors import (
    InvalidParameterError,
    PromptTooLongError,
    UnsupportedModelError,
)
from .grammar import Grammar, GrammarState, grammar_state
from .policy import NO_POLICY, NoPolicy, SpeculationPolicy, policy_for_speculation
from .prefix_cache import PrefixCache
from .prompts import Prompt, encode_prompt
from .results import GenerationResult, GenerationStream, TextAssembler
from .sampling import SamplingParams, TokenChooser
from .text import eos_token_ids


@dataclass
class _Request:
    """One generation's checked inputs (see :meth:`LanguageModel.stream`)."""

    prompt_ids: list[int]
    max_new_tokens: int
    drafter: Drafter
    chooser: TokenChooser
    stops: list[str]
    policy: SpeculationPolicy | NoPolicy  # NO_POLICY: whole drafts are verified
    should_stop: Callable[[], bool] | None
    logprobs: int | None
    tenant: str | None
    grammar: GrammarState | None  # this generation's own state of its grammar
    prefix_cache: PrefixCache | None = None  # where the target can reuse keys and values


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
        configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.eos_token_ids = eos_token_ids(configured, tokenizer.eos_token_id)
        #: Learned costs and acceptance statistics, shared by this model's requests.
        self.policy = SpeculationPolicy()
        #: The :class:`~promptlookup.prefix_cache.PrefixCache` generations use unless told
        #: otherwise (``prefix_cache=``); None: none. Used only where reuse is exact
        #: (:meth:`~promptlookup.prefix_cache.PrefixCache.applies`).
        self.prefix_cache: PrefixCache | None = None

    # -- prompts ------------------------------------------------------------------------------

    def encode(self, prompt: Prompt, chat: bool = False) -> list[int]:
        """Token ids for a prompt. Messages always use the chat template (a model without one
        gets their contents as plain text, with a warning once); a string uses it when
        ``chat`` is true."""
        return encode_prompt(self, prompt, chat)

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

    def stream(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 256,
        drafter: DrafterSpec = "prompt-lookup",
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] | str = (),
        chat: bool = False,
        speculation: str = "adaptive",
        should_stop: Callable[[], bool] | None = None,
        logprobs: int | None = None,
        prefix_cache: PrefixCache | bool = True,
        tenant: str | None = None,
        response_format: dict | None = None,
        grammar: Grammar | None = None,
        **drafter_options,
    ) -> GenerationStream:
        """Like :meth:`generate`, but returns a :class:`GenerationStream` of text deltas.
        Invalid arguments raise here, before anything is generated."""
        request = self._request(
            prompt, max_new_tokens, drafter,
            SamplingParams(temperature, top_k, top_p, repetition_penalty, seed),
            stop, chat, speculation, should_stop, logprobs, tenant, drafter_options,
            (grammar, response_format),
        )  # fmt: skip
        request.prefix_cache = PrefixCache.chosen(prefix_cache, self.prefix_cache, self.target)
        stream = GenerationStream(iter(()))
        stream._request = request
        stream._events = self._events(stream, request)
        return stream

    def _request(
        self, prompt, max_new_tokens, drafter, params, stop, chat, speculation, should_stop,
        logprobs, tenant, drafter_options, constraint=(None, None),
    ) -> _Request:  # fmt: skip
        """A checked request: every argument of :meth:`stream`, validated and built."""
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InvalidParameterError(
                f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}"
            )
        prompt_ids = self.encode(prompt, chat=chat)
        if len(prompt_ids) + max_new_tokens > self.target.max_context:
            raise PromptTooLongError(
                f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                f"the model's context of {self.target.max_context} tokens"
            )
        policy = policy_for_speculation(speculation, self.policy)
        if logprobs is not None and (
            not isinstance(logprobs, int) or isinstance(logprobs, bool) or logprobs < 0
        ):
            raise InvalidParameterError(f"logprobs must be an integer >= 0, got {logprobs!r}")
        stops = [stop] if isinstance(stop, str) else list(stop)
        device = getattr(self.target, "device", "cpu")
        chooser = TokenChooser.from_params(params, device=device)
        # A draft model is loaded on the target's device and dtype and samples with `chooser`.
        drafter_obj = make_drafter(
            drafter,
            eos_token_ids=self.eos_token_ids,
            tokenizer=self.tokenizer,
            chooser=chooser,
            device=str(device),
            dtype=str(getattr(self.model, "dtype", "float32")),
            **drafter_options,
        )
        if isinstance(drafter_obj, NoDrafter):
            policy = NO_POLICY  # plain decoding: nothing to decide, no costs to time
        if tenant is not None and not isinstance(tenant, str):
            raise InvalidParameterError(f"tenant must be a string, got {tenant!r}")
        state = grammar_state(*constraint, self.tokenizer, self.eos_token_ids)
        return _Request(
            prompt_ids,
            max_new_tokens,
            drafter_obj,
            chooser,
            stops,
            policy,
            should_stop,
            logprobs,
            tenant,
            state,
        )

    def _events(self, stream: GenerationStream, request: _Request) -> Iterator[str]:
        """The stream's text deltas: the batch decoder with this one sequence (one driver for
        one row and many, each step as in a batch; a target that runs one sequence at a time
        too, :class:`~promptlookup.batching.SerialTarget`)."""
        text = TextAssembler(self.tokenizer, request.stops, self.eos_token_ids)
        sequence = self._sequence(request)
        stream.stats = sequence.stats
        decoder = BatchDecoder(self.target, self.policy, max_batch=1)
        deltas: list[tuple[int, str]] = []
        results: list[GenerationResult | None] = [None]
        steps = _drive(decoder, {decoder.add(sequence): (0, text)}, deltas, results)
        try:
            for _ in steps:  # each step's text deltas
                yield from (piece for _, piece in deltas)
                deltas.clear()
        finally:
            if not sequence.done:
                sequence.cancel()  # the stream was closed early: the sequence ends here
            stream.result = results[0] or text.result(sequence.stats, request.prompt_ids)

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
        :class:`~promptlookup.sampling.TokenLogprob`). ``tenant`` (an opaque string, e.g. a
        server's client): whose acceptance history the policy weighs this request's drafts
        with; requests of other tenants never shape them; and whose entries of the prefix
        cache it reuses and adds to (None is a tenant too). ``prefix_cache``: a
        :class:`~promptlookup.prefix_cache.PrefixCache` whose keys and values of an earlier
        sequence that the prompt starts with are reused (the output is the same, token for
        token; ``result.stats.cached_tokens`` counts them), ``True`` (default) the model's
        :attr:`prefix_cache` if any, ``False`` none. ``response_format``: OpenAI's
        ``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema": {"schema":
        {...}}}``; ``grammar``: any :class:`~promptlookup.grammar.Grammar` (a JSON schema, a
        regular expression or a Lark grammar): the output matches it, token for token what
        ``drafter="none"`` gives under it, and the tokens it forces are drafted for free
        (``stats.forced_tokens``); a schema that cannot compile raises
        :class:`~promptlookup.errors.GrammarError`. Extra keyword
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

    def generate_batch(
        self,
        prompts: Sequence[Prompt],
        *,
        max_batch: int | None = None,
        prefill_tokens: int = PREFILL_TOKENS,
        **options,
    ) -> list[GenerationResult]:
        """Generate after every prompt of ``prompts`` at once: one result per prompt, in order,
        each equal to what :meth:`generate` with the same ``options`` returns for it alone
        (every sequence's forward passes are computed as alone, see
        :mod:`promptlookup.batching`), with its own stats. At most ``max_batch`` sequences
        share a forward pass (default: :func:`~promptlookup.batching.default_max_batch`);
        the others join as earlier ones finish, their prompts ``prefill_tokens`` per step
        while others decode (more: throughput; fewer: steadier streams). ``options`` are
        :meth:`generate`'s; a
        ``seed`` seeds every prompt's sampler alike.

        >>> results = lm.generate_batch(["Fix: x = 1 +", "Fix: y = 2 *"], chat=True)  # doctest: +SKIP
        """
        results: list[GenerationResult] = []
        for _ in self._batch(prompts, max_batch, prefill_tokens, options, lambda *_: None, results):
            pass
        return results

    def stream_batch(
        self,
        prompts: Sequence[Prompt],
        *,
        max_batch: int | None = None,
        prefill_tokens: int = PREFILL_TOKENS,
        **options,
    ) -> Iterator[tuple[int, str]]:
        """:meth:`generate_batch` as a stream of ``(prompt index, text delta)`` pairs, in the
        order they are decided; closing the iterator ends every generation."""
        deltas: list[tuple[int, str]] = []
        for _ in self._batch(
            prompts,
            max_batch,
            prefill_tokens,
            options,
            lambda index, piece: deltas.append((index, piece)),
            [],
        ):
            yield from deltas
            deltas.clear()

    def batch_sequence(self, prompt: Prompt, **options) -> tuple[BatchSequence, TextAssembler]:
        """One prompt as a :class:`~promptlookup.batching.BatchSequence` (``options``: those
        of :meth:`generate`, checked here) and the :class:`TextAssembler` of its text."""
        request = self.stream(prompt, **options)._request
        return self._sequence(request), TextAssembler(
            self.tokenizer, request.stops, self.eos_token_ids
        )

    def _sequence(self, request: _Request) -> BatchSequence:
        return BatchSequence(
            request.prompt_ids,
            request.max_new_tokens,
            request.drafter,
            request.chooser,
            self.eos_token_ids,
            policy=request.policy,
            should_stop=request.should_stop,
            logprobs=request.logprobs,
            prefix_cache=request.prefix_cache,
            tenant=request.tenant,
            grammar=request.grammar,
        )

    def _batch(
        self, prompts, max_batch, prefill_tokens, options, emit, results: list
    ) -> Iterator[None]:
        """Run a batch, calling ``emit(index, piece)`` for each text delta and yielding after
        every step; ``results`` ends with one :class:`GenerationResult` per prompt."""
        if not isinstance(self.target, BatchTarget):
            raise UnsupportedModelError(
                f"{type(self.target).__name__} cannot run several "
                "sequences in one forward pass; use generate"
            )
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise InvalidParameterError("generate_batch takes a list of prompts")
        sequences = [self.batch_sequence(prompt, **options) for prompt in prompts]  # checked
        decoder = BatchDecoder(
            self.target,
            self.policy,
            max_batch=max_batch or default_max_batch(self.target),
            prefill_tokens=prefill_tokens,
        )
        texts = {}
        for index, (sequence, text) in enumerate(sequences):
            texts[decoder.add(sequence)] = (index, text)
        results[:] = [None] * len(sequences)
        deltas: list[tuple[int, str]] = []
        for _ in _drive(decoder, texts, deltas, results):
            for index, piece in deltas:
                emit(index, piece)
            deltas.clear()
            yield


def _drive(decoder: BatchDecoder, texts: dict, deltas: list, results: list) -> Iterator[None]:
    """The decoder's steps, one driver for one row and many: each sequence's new tokens into
    its :class:`TextAssembler` (``texts``: sequence -> (index, assembler)), its text deltas
    appended to ``deltas`` as ``(index, piece)``, its :class:`GenerationResult` into
    ``results[index]`` when it ends; yields after each step."""
    for sequence, new_tokens in decoder.run():
        if sequence.error is not None:
            raise sequence.error  # its own step failed (the server ends that request alone)
        index, text = texts[sequence]
        pieces = [piece for _, piece in text.add_step(sequence, new_tokens) if piece]
        if sequence.done:
            pieces += [tail] if (tail := text.flush()) else []
            results[index] = text.result(sequence.stats, sequence.prompt_ids)
        deltas += [(index, piece) for piece in pieces]
        yield


# generate takes stream's keyword arguments; help() and inspect show them for both.
LanguageModel.generate.__signature__ = inspect.signature(LanguageModel.stream).replace(
    return_annotation="GenerationResult"
)
