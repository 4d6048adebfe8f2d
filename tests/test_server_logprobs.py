"""Exact logprobs and cancellation in the loop (``speculative_generate(logprobs=, should_stop=)``),
which the server's ``logprobs``/``top_logprobs`` and disconnects are built on."""

from __future__ import annotations

import math

from _server import RowByRowTarget
from conftest import TinyTokenizer, tiny_llama

from promptlookup.backends.hf.target import TorchTarget
from promptlookup.generation import LanguageModel

PROMPT = "abcd abcd abcd abcd"


def row_invariant_lm() -> LanguageModel:
    model = tiny_llama()
    return LanguageModel(
        RowByRowTarget(TorchTarget(model)), TinyTokenizer(32), name="tiny", model=model
    )


def test_logprobs_of_drafted_tokens_equal_plain_decoding_bit_for_bit():
    lm = row_invariant_lm()
    plain = lm.generate(PROMPT, max_new_tokens=30, drafter="none", logprobs=3)
    reference = lm.generate(
        PROMPT, max_new_tokens=30, logprobs=3, speculation="fixed", reference_text=plain.text
    )
    lookup = lm.generate(PROMPT, max_new_tokens=30, logprobs=3, speculation="fixed")
    assert reference.stats.accepted_tokens > 0 and lookup.stats.accepted_tokens > 0
    assert reference.token_ids == lookup.token_ids == plain.token_ids
    assert reference.stats.logprobs == lookup.stats.logprobs == plain.stats.logprobs
    assert [e.token_id for e in plain.stats.logprobs] == plain.token_ids


def test_logprobs_of_sampled_tokens_equal_plain_decoding_bit_for_bit():
    lm = row_invariant_lm()
    settings = dict(
        max_new_tokens=30, temperature=0.8, top_k=10, repetition_penalty=1.1, seed=5, logprobs=2
    )
    plain = lm.generate(PROMPT, drafter="none", **settings)
    drafted = lm.generate(PROMPT, speculation="fixed", reference_text=plain.text, **settings)
    assert drafted.stats.accepted_tokens > 0
    assert drafted.token_ids == plain.token_ids
    assert drafted.stats.logprobs == plain.stats.logprobs


def test_logprobs_are_the_processed_distribution_most_likely_first():
    lm = row_invariant_lm()
    greedy = lm.generate(PROMPT, max_new_tokens=8, drafter="none", logprobs=5)
    for entry in greedy.stats.logprobs:
        assert len(entry.top) == 5 and entry.top[0] == (entry.token_id, entry.logprob)
        values = [lp for _, lp in entry.top]
        assert values == sorted(values, reverse=True) and values[0] <= 0
    top_k = lm.generate(
        PROMPT, max_new_tokens=8, drafter="none", logprobs=5, temperature=1, top_k=2, seed=1
    )
    for entry in top_k.stats.logprobs:  # top-k filtered the others out of the distribution
        assert [math.isinf(lp) for _, lp in entry.top] == [False, False, True, True, True]
        assert math.isclose(sum(math.exp(lp) for _, lp in entry.top[:2]), 1, rel_tol=1e-5)


def test_logprobs_from_stock_transformers_passes_match_plain_decoding_closely():
    model = tiny_llama()
    lm = LanguageModel(TorchTarget(model), TinyTokenizer(32), name="tiny", model=model)
    plain = lm.generate(PROMPT, max_new_tokens=24, drafter="none", logprobs=1)
    drafted = lm.generate(
        PROMPT, max_new_tokens=24, logprobs=1, speculation="fixed", reference_text=plain.text
    )
    assert drafted.stats.accepted_tokens > 0
    assert [e.token_id for e in drafted.stats.logprobs] == plain.token_ids
    for a, b in zip(drafted.stats.logprobs, plain.stats.logprobs):
        assert math.isclose(a.logprob, b.logprob, rel_tol=1e-4, abs_tol=1e-5)


def test_without_logprobs_nothing_is_recorded():
    lm = row_invariant_lm()
    assert lm.generate(PROMPT, max_new_tokens=4).stats.logprobs == []


def test_should_stop_ends_the_generation_before_the_next_forward_pass():
    lm = row_invariant_lm()
    passes = []

    def should_stop():
        passes.append(None)
        return len(passes) > 3  # asked before each pass: three passes, then no fourth

    result = lm.generate(PROMPT, max_new_tokens=30, drafter="none", should_stop=should_stop)
    # A batch-capable target's one driver: the first pass ends the prompt and yields a token.
    assert result.stats.forward_passes == 3 and len(result.token_ids) == 3
    assert lm.generate(PROMPT, max_new_tokens=30, should_stop=lambda: True).token_ids == []
