"""Benchmark methods of the ``torch`` backend (registered on import).

- ``plain``: ``model.generate`` with no assistance, the baseline.
- ``hf-pld``: ``model.generate(prompt_lookup_num_tokens=10)`` with transformers' default n-gram
  size (parameters ``k`` = prompt_lookup_num_tokens, ``ngram`` = max_matching_ngram_size).
- ``promptlookup``: :meth:`LanguageModel.generate` with its defaults (``k``, ``min``, ``max``
  set the drafter's num_tokens, min_match, max_match; ``speculation=fixed|adaptive``; an
  explicit ``k`` means ``speculation=fixed`` unless given, so `--sweep` measures fixed settings).
- ``promptlookup-none``: the same loop with no drafter (its own overhead against ``plain``).
- ``promptlookup-fastest``: promptlookup with the fastest kernels by timing whether or not
  they are row-invariant (exactness off): what exactness costs, in the same run.
- ``hf-custom``: ``model.generate(custom_generate=...)`` from :mod:`promptlookup.hf_generate`.

Counting policy. promptlookup's own methods report the loop's counters. For ``model.generate``
a forward pre-hook records the input length of every top-level call of the model during the
call (:class:`ForwardTrace`); calls that only feed the prompt (a separate prefill) are not
forward passes, the rest are (plain decoding: one per new token). Every such pass yields its
accepted draft tokens plus one bonus token, so ``accepted = new_tokens - forward_passes``, and
``drafted`` is the number of tokens fed beyond the one each pass needs anyway. When the model
is called without ``input_ids`` the draft counts are unknown (None).

Fair comparison: every method gets the same token-id prompt, the same ``max_new_tokens`` and
an explicit generation config (greedy, or temperature/top-k/top-p sampling; no repetition
penalty; EOS from the model, pad = EOS, batch of one, so ``generate`` never pads). Outputs are
the new tokens up to and including the first EOS. Only the ``generate`` call is timed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from transformers import LogitsProcessorList

from ..errors import InvalidParameterError
from ..grammar import GrammarLogitsProcessor, grammar_state
from .methods import (
    LOOKUP_PARAMS,
    MethodOutput,
    Settings,
    Timer,
    check_int_options,
    cut_after_eos,
    lookup_factory,
    register_backend,
    register_method,
    register_own_methods,
)

BACKEND = "torch"


class ForwardTrace:
    """Records the input length of each top-level call of ``model`` while active."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.lengths: list[int | None] = []

    def __enter__(self) -> ForwardTrace:
        self._handle = self.model.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()

    def _hook(self, module, args, kwargs) -> None:
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        self.lengths.append(None if input_ids is None else int(input_ids.shape[-1]))

    def counts(self, prompt_tokens: int, new_tokens: int) -> tuple[int, int | None, int | None]:
        """``(forward_passes, drafted_tokens, accepted_tokens)`` of one generation (see the
        module docstring); a pass is a call that reaches past the prompt's first
        ``prompt_tokens - 1`` tokens."""
        if any(length is None for length in self.lengths):
            return len(self.lengths), None, None
        prefix = prompt_tokens - 1  # what a separate prefill may feed without producing a token
        fed = passes = drafted = 0
        for length in self.lengths:
            fed += length
            if passes == 0 and fed <= prefix:
                continue  # prefill only
            # The first pass also finishes the prompt; later ones feed last token + draft.
            positions = fed - prefix if passes == 0 else length
            passes += 1
            drafted += positions - 1
        return passes, drafted, new_tokens - passes


class TokenClock:
    """A ``generate`` streamer that only notes when each new token arrived (seconds since
    ``start``); ``generate`` hands it the prompt first, which is skipped."""

    def __init__(self) -> None:
        self.token_seconds: list[float] = []
        self._prompt_seen = False

    def start(self) -> None:
        self._start = time.perf_counter()

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        now = time.perf_counter() - self._start
        self.token_seconds.extend([now] * value.numel())

    def end(self) -> None:
        pass


def generation_config(lm, settings: Settings, **extra):
    """An explicit config, so neither the model's defaults nor transformers' global ones
    (top_k=50) change what is compared."""
    from transformers import GenerationConfig

    eos = list(lm.eos_token_ids)
    sampling = (
        {
            "do_sample": True,
            "temperature": settings.temperature,
            "top_k": settings.top_k,
            "top_p": settings.top_p,
        }
        if settings.sampling
        else {"do_sample": False}
    )
    return GenerationConfig(
        max_new_tokens=settings.max_new_tokens,
        eos_token_id=eos,
        pad_token_id=eos[0] if eos else None,
        repetition_penalty=1.0,
        **sampling,
        **extra,
    )


class HFGenerate:
    """``model.generate`` on one prompt; ``extra`` goes into the generation config and
    ``kwargs`` to ``generate`` itself."""

    name = "plain"

    def __init__(self, lm, extra: dict | None = None, **kwargs) -> None:
        if getattr(lm, "model", None) is None:
            raise InvalidParameterError("this method needs a transformers model (lm.model)")
        self.lm = lm
        self.extra = extra or {}
        self.kwargs = kwargs

    def run(self, prompt_ids: Sequence[int], settings: Settings) -> MethodOutput:
        model = self.lm.model
        if hasattr(model, "as_transformers"):  # a GGUF in our own modules: no generate there
            model = model.as_transformers()
        device = next(model.parameters()).device
        input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)  # (1, n)
        config = generation_config(self.lm, settings, **self.extra)
        kwargs = dict(self.kwargs)
        grammar = settings.grammar()
        if grammar is not None:  # plain constrained decoding
            state = grammar_state(grammar, None, self.lm.tokenizer, self.lm.eos_token_ids)
            processor = GrammarLogitsProcessor(state, len(prompt_ids))
            kwargs["logits_processor"] = LogitsProcessorList([processor])
        clock = TokenClock()
        with ForwardTrace(model) as trace:
            if settings.sampling and settings.seed is not None:
                torch.manual_seed(settings.seed)
            with Timer() as timer:
                clock.start()
                out = model.generate(
                    input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    generation_config=config,
                    streamer=clock,
                    **kwargs,
                )
        sequences = out.sequences if hasattr(out, "sequences") else out  # (1, n + new)
        new = cut_after_eos(sequences[0, len(prompt_ids) :].tolist(), self.lm.eos_token_ids)
        passes, drafted, accepted = self._counts(trace, len(prompt_ids), len(new))
        token_seconds = clock.token_seconds[: len(new)]
        return MethodOutput(
            new,
            timer.seconds,
            passes,
            drafted,
            accepted,
            token_seconds if len(token_seconds) == len(new) else None,
        )

    def _counts(self, trace: ForwardTrace, prompt_tokens: int, new_tokens: int):
        return trace.counts(prompt_tokens, new_tokens)


class HFCustomGenerate(HFGenerate):
    """``model.generate(custom_generate=make_custom_generate(...))``; counters come from the
    callable's ``last_stats``, else (a generation cut short by EOS after its last pass) from
    the forward trace."""

    def __init__(self, lm, options: dict) -> None:
        from ..hf_generate import make_custom_generate

        if "num_tokens" in options:  # an explicit k is a fixed setting, as for promptlookup:k=
            options = {"speculation": "fixed", **options}
        self.decoding = make_custom_generate("prompt-lookup", **options)
        super().__init__(lm, custom_generate=self.decoding)

    def _counts(self, trace, prompt_tokens, new_tokens):
        stats = self.decoding.last_stats
        if stats is not None and stats.new_tokens == new_tokens:
            return stats.forward_passes, stats.drafted_tokens, stats.accepted_tokens
        return trace.counts(prompt_tokens, new_tokens)


def _hf_pld(lm, options: dict) -> HFGenerate:
    extra = {"prompt_lookup_num_tokens": options.get("prompt_lookup_num_tokens", 10)}
    if "max_matching_ngram_size" in options:
        extra["max_matching_ngram_size"] = options["max_matching_ngram_size"]
    for key, value in extra.items():
        if not isinstance(value, int) or value < 1:
            raise InvalidParameterError(f"hf-pld: {key} must be an integer >= 1, got {value!r}")
    return HFGenerate(lm, extra)


def fastest_twin(lm):
    """``lm``'s model behind a target that keeps the fastest kernels by timing, row-invariant
    or not (what exactness costs), with a policy of its own; same weights, no copy."""
    from ..loading import from_transformers

    twin = from_transformers(lm.model, lm.tokenizer, name=lm.name, row_invariant=False)
    cost_file = getattr(lm.policy, "cost_file", None)
    if cost_file is not None:
        twin.policy.cost_file = cost_file.with_name(f"{cost_file.stem}-fastest.json")
        twin.target.use_choice_files(twin.policy.cost_file)
    return twin


def load_for_bench(model: str | None, dtype: str, device: str, threads: int | None = None):
    """The bench model of this backend: a :class:`~promptlookup.LanguageModel`."""
    import promptlookup

    return promptlookup.load_model(model, dtype=dtype, device=device)


register_backend(BACKEND, load=load_for_bench)
register_method(BACKEND, "plain", lambda lm, options: HFGenerate(lm))
register_method(
    BACKEND,
    "hf-pld",
    _hf_pld,
    params={"k": "prompt_lookup_num_tokens", "ngram": "max_matching_ngram_size"},
)
register_own_methods(BACKEND)
register_method(BACKEND, "promptlookup-fastest", lookup_factory(fastest_twin), params=LOOKUP_PARAMS)
register_method(
    BACKEND,
    "hf-custom",
    lambda lm, options: HFCustomGenerate(lm, check_int_options("hf-custom", options)),
    params=LOOKUP_PARAMS,
)
