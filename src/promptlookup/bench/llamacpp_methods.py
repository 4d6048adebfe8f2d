"""Benchmark methods of the ``llama.cpp`` backend (registered on import).

- ``plain``: llama-cpp-python's own decoding, ``Llama.generate`` with a greedy sampler
  (``temperature=0``) or temperature/top-k/top-p sampling — the baseline.
- ``llamacpp-pld``: the same with ``draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10)``
  (parameter ``k`` = num_pred_tokens), llama-cpp-python's prompt lookup. It runs on a second
  ``Llama`` over the same GGUF with ``logits_all=True``, which llama-cpp-python needs with a
  draft model (it computes logits at every prompt position; without it prompts longer than
  ``n_batch`` crash).
- ``promptlookup``: :meth:`LanguageModel.generate` on :class:`LlamaCppTarget` (``k``, ``min``,
  ``max`` set the drafter's num_tokens, min_match, max_match; ``speculation=fixed|adaptive``).
- ``promptlookup-none``: the same loop with no drafter (its overhead against ``plain``).

Every method runs on the same GGUF with the same context size and thread count, gets the same
token-id prompt, starts from an empty KV cache (``Llama.reset()`` before each run, so nothing of
an earlier prompt is reused) and stops after an end-of-generation token or ``max_new_tokens``.
Only the generation call is timed, prompt prefill included (as for promptlookup's own loop).

Counting policy for ``Llama.generate``: each call of ``Llama.eval`` is one forward pass (the
first one also holds the prompt); tokens it feeds beyond the one a pass needs anyway are
drafted, and ``accepted = new_tokens - forward_passes``. Sampled runs draw their random numbers
from llama.cpp's sampler, so their tokens differ from promptlookup's (same distribution,
different random streams); greedy runs are comparable token for token.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InvalidParameterError
from .methods import (
    MethodOutput,
    Settings,
    Timer,
    cut_after_eos,
    register_backend,
    register_method,
    register_own_methods,
)

BACKEND = "llama.cpp"


class LlamaGenerate:
    """``Llama.generate`` on one prompt, stopping at an end-of-generation token."""

    name = "plain"

    def __init__(self, lm, llama=None) -> None:
        import llama_cpp

        self.lm = lm
        self.llama = llama if llama is not None else lm.model
        self._vocab = llama_cpp.llama_model_get_vocab(self.llama.model)
        self._is_eog = llama_cpp.llama_vocab_is_eog

    def run(self, prompt_ids: Sequence[int], settings: Settings) -> MethodOutput:
        llama = self.llama
        if settings.sampling:
            options = dict(temp=settings.temperature, top_k=settings.top_k, top_p=settings.top_p)
            llama.set_seed(settings.seed if settings.seed is not None else 0)
        else:
            options = dict(temp=0.0, top_k=1, top_p=1.0)
        fed: list[int] = []  # tokens per Llama.eval call
        original_eval = llama.eval

        def counting_eval(tokens):
            fed.append(len(tokens))
            return original_eval(tokens)

        llama.eval = counting_eval  # instance attribute: seen by Llama.generate only here
        new: list[int] = []
        token_seconds: list[float] = []
        try:
            llama.reset()
            with Timer() as timer:
                for token in llama.generate(
                    list(prompt_ids),
                    min_p=0.0,
                    typical_p=1.0,
                    repeat_penalty=1.0,
                    reset=True,
                    **options,
                ):
                    new.append(int(token))
                    token_seconds.append(timer.elapsed())
                    if (
                        self._is_eog(self._vocab, token)
                        or token in self.lm.eos_token_ids
                        or len(new) >= settings.max_new_tokens
                    ):
                        break
        finally:
            del llama.eval
            llama.reset()
        new = cut_after_eos(new, self.lm.eos_token_ids)
        passes = len(fed)
        drafted = sum(n - 1 for n in fed[1:])
        return MethodOutput(
            new, timer.seconds, passes, drafted, len(new) - passes, token_seconds[: len(new)]
        )


def _llamacpp_pld(lm, options: dict) -> LlamaGenerate:
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from ..backends.llamacpp.target import open_llama

    num_pred_tokens = options.get("num_pred_tokens", 10)
    if not isinstance(num_pred_tokens, int) or num_pred_tokens < 1:
        raise InvalidParameterError(
            f"llamacpp-pld: k must be an integer >= 1, got {num_pred_tokens!r}"
        )
    base = lm.model
    llama = open_llama(
        base.model_path,
        n_ctx=base.n_ctx(),
        n_batch=base.n_batch,
        n_threads=base.n_threads,
        logits_all=True,
        draft_model=LlamaPromptLookupDecoding(num_pred_tokens=num_pred_tokens),
    )
    return LlamaGenerate(lm, llama)


def load_for_bench(model: str | None, dtype: str, device: str, threads: int | None = None):
    """The bench model of this backend: a :class:`~promptlookup.LanguageModel` whose ``model``
    is the ``llama_cpp.Llama`` (``dtype`` does not apply: the GGUF's own quantization runs)."""
    if not str(device).startswith("cpu"):
        raise InvalidParameterError(f"the llama.cpp backend runs on the cpu, got device {device!r}")
    from ..loading import load_llamacpp

    return load_llamacpp(model, n_threads=threads)


register_backend(BACKEND, load=load_for_bench)
register_method(BACKEND, "plain", lambda lm, options: LlamaGenerate(lm))
register_method(BACKEND, "llamacpp-pld", _llamacpp_pld, params={"k": "num_pred_tokens"})
register_own_methods(BACKEND)
