"""promptlookup inside ``transformers``' own ``model.generate``: change one argument.

>>> out = model.generate(input_ids, max_new_tokens=256,                      # doctest: +SKIP
...                      custom_generate=promptlookup.custom_generate)

``generate`` prepares everything as usual (generation config, logits processors, stopping
criteria, streamer), then hands the decoding loop to :data:`custom_generate`, which runs
promptlookup's loop instead: the same tokens (greedy, float32), the same sampling distribution
(torch's global RNG, one draw per token in the same order), the same return value.

Policies:

- Every prepared logits processor runs at every verified position with the running
  ``input_ids`` (repetition penalty, temperature, top-k/top-p, min length, bad words...).
- Every prepared stopping criterion is checked after every accepted token with the running
  ``input_ids`` (max length, EOS, stop strings, max time); any one firing ends the generation.
- Streamers get each new token as it is accepted and ``end()`` at the end (``generate`` itself
  streams the prompt first).
- ``attention_mask`` may only mask left padding (zeros first, then ones, in every row); right
  padding or holes raise :class:`~promptlookup.errors.InvalidParameterError`. Padding is
  stripped for the model and kept in the returned sequences (processors and stopping criteria
  see it, as in plain ``generate``).
- One row or a batch (``input_ids`` (B, L), left padded) runs on the batch decoder and
  returns what plain ``generate`` does, row by row (see :mod:`promptlookup.hf_batch`). No
  streamer with a batch; beam search and ``num_return_sequences > 1`` raise.
- ``return_dict_in_generate=True`` returns a ``GenerateDecoderOnlyOutput`` with ``sequences``
  and ``cache`` (None for padded or batched inputs); asking for scores, logits, attentions or
  hidden states raises (not supported yet, never silently wrong).

With a *callable* ``custom_generate``, ``transformers`` 5.24 drops ``streamer`` after streaming
the prompt (we read it back from ``generate``'s frame) and ``tokenizer``, so ``stop_strings``
raise "could not locate a tokenizer". For stop strings use :func:`generate` below (same
arguments as ``model.generate``), the repository folder (``custom_generate="<repo>"``,
``trust_remote_code=True``), or ``stopping_criteria=[StopStringCriteria(tokenizer, stops)]``.
"""

from __future__ import annotations

# transformers' generation utilities are imported where used: importing them costs seconds.
import inspect
import weakref
from typing import Any

import torch

from .backends.hf.target import TorchTarget
from .drafters import DrafterSpec, NoDrafter, make_drafter
from .errors import InvalidParameterError, UnsupportedModelError
from .hf_batch import decode_batch
from .loading import torch_cost_file
from .loop import GenerationStats
from .policy import NO_POLICY, SpeculationPolicy, policy_for_speculation
from .text import eos_token_ids

__all__ = ["CustomGenerate", "custom_generate", "generate", "make_custom_generate"]

#: Model inputs ``generate`` prepares for every decoder-only model; we recompute or ignore them.
_PREPARED_INPUTS = frozenset(
    {"attention_mask", "position_ids", "cache", "logits_to_keep", "use_cache"}
)
_UNSUPPORTED_OUTPUTS = (
    "output_scores",
    "output_logits",
    "output_attentions",
    "output_hidden_states",
)


#: One speculation policy per model object (its measured costs and acceptance carry over
#: between calls, as with :class:`~promptlookup.LanguageModel`); gone with the model.
_POLICIES: weakref.WeakKeyDictionary[torch.nn.Module, SpeculationPolicy] = (
    weakref.WeakKeyDictionary()
)


#: The kernel and attention choices of each model object (timing them takes seconds), kept
#: between calls like its policy.
_CHOICES: weakref.WeakKeyDictionary[torch.nn.Module, tuple] = weakref.WeakKeyDictionary()


def policy_for(model: torch.nn.Module) -> SpeculationPolicy:
    """The adaptive speculation policy of ``model``; its cost curve is cached on disk like
    :func:`promptlookup.load_model`'s when the model has a name (``config._name_or_path``),
    else measured once per model object."""
    policy = _POLICIES.get(model)
    if policy is None:
        policy = _POLICIES[model] = SpeculationPolicy(cost_file=torch_cost_file(model))
    return policy


def target_for(model: torch.nn.Module) -> TorchTarget:
    """A fresh target (an empty cache) over ``model`` that reuses the kernel and attention
    choices measured in earlier calls with the same model object (on disk too, beside the cost
    curve, when the model has a name). Layer by layer in Python even over quantized weights,
    whose one-call layers round norms and SiLU their own way, and keys and values in the
    model's dtype: what ``model.generate`` computes with the model's modules is the reference
    here."""
    weight = next(model.parameters())
    # Keys and values in the model's dtype, as model.generate keeps them (not 16-bit).
    kv_dtype = str(weight.dtype).removeprefix("torch.")
    kept = _CHOICES.get(model)
    if kept is not None and kept[0] == (weight.dtype, weight.device):
        return TorchTarget(  # sets eval mode
            model, kernels=kept[1], attention=kept[2], layers_in_one_call=False, kv_dtype=kv_dtype
        )
    target = TorchTarget(
        model, layers_in_one_call=False, kv_dtype=kv_dtype
    )  # new, or moved or cast since
    cost_file = torch_cost_file(model)
    if cost_file is not None:
        target.use_choice_files(cost_file)
    _CHOICES[model] = ((weight.dtype, weight.device), target.kernels, target.attention)
    return target


class CustomGenerate:
    """A decoding method for ``model.generate(..., custom_generate=...)`` that runs
    promptlookup's loop with a drafter built from ``drafter`` and ``drafter_options`` (a fresh
    one per call, unless ``drafter`` is a drafter object). ``speculation="adaptive"`` (default)
    verifies only the part of each draft worth its measured cost (see
    :mod:`promptlookup.policy`), ``"fixed"`` whole drafts. ``last_stats`` holds the
    :class:`~promptlookup.loop.GenerationStats` of the latest call (use one instance per thread).
    """

    def __init__(
        self,
        drafter: DrafterSpec = "prompt-lookup",
        *,
        speculation: str = "adaptive",
        **drafter_options: Any,
    ) -> None:
        policy_for_speculation(speculation, None)  # checked here; the model's policy per call
        make_drafter(drafter, **drafter_options)  # invalid options raise now, not mid-generate
        self.drafter = drafter
        self.speculation = speculation
        self.drafter_options = drafter_options
        self.last_stats: GenerationStats | None = None

    def __repr__(self) -> str:
        options = "".join(f", {k}={v!r}" for k, v in self.drafter_options.items())
        mode = "" if self.speculation == "adaptive" else f", speculation={self.speculation!r}"
        return f"make_custom_generate({self.drafter!r}{mode}{options})"

    def __call__(
        self,
        model,
        input_ids: torch.LongTensor,
        logits_processor,
        stopping_criteria,
        generation_config,
        synced_gpus: bool = False,
        streamer=None,
        **model_kwargs,
    ):
        """The signature ``generate`` calls a decoding method with (like ``_sample``).
        ``input_ids`` (B, prompt_len) includes any left padding."""
        if streamer is None:
            streamer = _streamer_from_generate(inspect.currentframe().f_back)
        was_training = model.training
        try:
            _check_supported(model, input_ids, generation_config, synced_gpus, model_kwargs)
            mask = model_kwargs.get("attention_mask")
            pads = [
                _left_padding(None if mask is None else mask[row], input_ids.shape[1])
                for row in range(input_ids.shape[0])
            ]
            if len(pads) > 1 and streamer is not None:
                raise InvalidParameterError(
                    "promptlookup's custom_generate streams one sequence "
                    "at a time; drop the streamer or the batch"
                )
            eos_ids = eos_token_ids(generation_config.eos_token_id)
            drafters = [
                make_drafter(self.drafter, eos_token_ids=eos_ids, **self.drafter_options)
                for _ in pads
            ]
            # The model's policy (NO_POLICY: whole drafts, or plain decoding).
            policy = NO_POLICY
            if not isinstance(drafters[0], NoDrafter) and self.speculation == "adaptive":
                policy = policy_for(model)
            target = target_for(model)  # sets eval mode; restored below
            sequences, self.last_stats, cache = decode_batch(
                target,
                policy,
                input_ids,
                pads,
                drafters,
                logits_processor,
                stopping_criteria,
                generation_config,
                streamer,
            )
        finally:
            model.train(was_training)
            if streamer is not None:
                streamer.end()
        if not generation_config.return_dict_in_generate:
            return sequences
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        return GenerateDecoderOnlyOutput(sequences=sequences, cache=cache)


def _check_supported(model, input_ids, generation_config, synced_gpus, model_kwargs) -> None:
    if model.config.is_encoder_decoder:
        raise UnsupportedModelError("promptlookup's custom_generate supports decoder-only models")
    if (generation_config.num_beams or 1) > 1:
        raise InvalidParameterError(
            "promptlookup's custom_generate does not do beam search "
            f"(num_beams={generation_config.num_beams}); use num_beams=1"
        )
    if (generation_config.num_return_sequences or 1) > 1:
        raise InvalidParameterError(
            "promptlookup's custom_generate returns one sequence per call "
            f"(num_return_sequences={generation_config.num_return_sequences}); call it repeatedly"
        )
    if input_ids.shape[1] == 0:
        raise InvalidParameterError(
            "promptlookup's custom_generate needs input_ids (the prompt "
            "is empty, or given only as inputs_embeds)"
        )
    if synced_gpus:
        raise InvalidParameterError("promptlookup's custom_generate does not support synced_gpus")
    if generation_config.return_dict_in_generate:
        asked = [name for name in _UNSUPPORTED_OUTPUTS if getattr(generation_config, name)]
        if asked:
            raise InvalidParameterError(
                f"promptlookup's custom_generate does not return "
                f"{', '.join(asked)} yet; drop them or use plain generate"
            )
    extra = sorted(
        k for k, v in model_kwargs.items() if v is not None and k not in _PREPARED_INPUTS
    )
    if extra:
        raise InvalidParameterError(
            f"promptlookup's custom_generate does not support the model "
            f"inputs {extra}; only input_ids and attention_mask"
        )


def _left_padding(attention_mask: torch.Tensor | None, length: int) -> int:
    """How many leading positions one row (length,) of an attention mask masks. Zeros
    anywhere else raise: the loop has no mask, and dropping them would silently change the
    result."""
    if attention_mask is None:
        return 0
    mask = attention_mask.tolist()  # (length,)
    num_pad = length - int(sum(mask))
    if num_pad >= length or any(mask[:num_pad]) or not all(mask[num_pad:]):
        raise InvalidParameterError(
            "promptlookup's custom_generate accepts an attention_mask only with left padding "
            "(zeros first, then ones, at least one 1, in every row); pad on the left "
            "(tokenizer.padding_side = 'left')"
        )
    return num_pad


def _streamer_from_generate(frame):
    """The ``streamer`` passed to ``GenerationMixin.generate``, if ``frame`` is that call.

    transformers 5.24 keeps only a callable's *own* extra arguments for it
    (``_extract_generation_mode_kwargs``), so the streamer it already gave the prompt to never
    reaches the decoding method; without this, a ``TextIteratorStreamer`` would wait forever.
    """
    from transformers import GenerationMixin  # already imported: generate is calling us

    generate_code = inspect.unwrap(GenerationMixin.generate).__code__
    if frame is not None and frame.f_code is generate_code:
        return frame.f_locals.get("streamer")
    return None


def make_custom_generate(
    drafter: DrafterSpec = "prompt-lookup", *, speculation: str = "adaptive", **drafter_options: Any
) -> CustomGenerate:
    """A ``custom_generate`` callable with a chosen drafter, e.g.
    ``make_custom_generate("prompt-lookup", num_tokens=8, speculation="fixed")`` or
    ``make_custom_generate(my_fn)`` (``my_fn(tokens, max_tokens) -> list[int]``). Options are
    those of :func:`promptlookup.make_drafter`; ``speculation`` as in
    :meth:`promptlookup.LanguageModel.generate`."""
    return CustomGenerate(drafter, speculation=speculation, **drafter_options)


#: ``model.generate(..., custom_generate=promptlookup.custom_generate)``: the default drafter.
custom_generate = CustomGenerate()


def generate(
    model,
    inputs: torch.Tensor | None = None,
    *,
    tokenizer=None,
    stopping_criteria=None,
    drafter: DrafterSpec = "prompt-lookup",
    drafter_options: dict | None = None,
    **generate_kwargs,
):
    """``model.generate(inputs, **generate_kwargs)`` decoded by promptlookup, with
    ``stop_strings`` + ``tokenizer`` working too: the stop strings ``generate`` would use become a
    ``StopStringCriteria`` (transformers drops ``tokenizer`` for callables). This is what the
    repository's ``custom_generate/generate.py`` runs."""
    from transformers import StoppingCriteriaList, StopStringCriteria

    generate_kwargs.pop("custom_generate", None)
    criteria = StoppingCriteriaList(stopping_criteria or [])
    if tokenizer is not None:
        # generate's precedence: keyword argument > generation_config > model.generation_config.
        config = generate_kwargs.get("generation_config")
        if "stop_strings" in generate_kwargs:
            stops = generate_kwargs["stop_strings"]
        elif config is not None and config.stop_strings is not None:
            stops = config.stop_strings
        else:
            stops = model.generation_config.stop_strings
        if stops:
            criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stops))
        generate_kwargs["stop_strings"] = None
    decoding = make_custom_generate(drafter, **(drafter_options or {}))
    # type(model).generate: a model loaded with this repository's custom_generate has its
    # instance ``generate`` replaced by this very function.
    return type(model).generate(
        model,
        inputs,
        stopping_criteria=criteria,
        tokenizer=tokenizer,
        custom_generate=decoding,
        **generate_kwargs,
    )
