"""Constrained decoding (promptlookup.grammar): the output matches the grammar and equals plain
constrained decoding (``drafter="none"`` with the same grammar) token for token, greedy and
seeded sampling, single stream and batch decoder; sampling keeps the masked distribution
(chi-square against the exact masked probabilities, as in test_sampling_exact.py); the tokens
a grammar forces are drafted and counted; bad grammars are named errors."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import replace

import jsonschema
import numpy as np
import pytest
import torch
from _fixtures import one_thread  # noqa: F401 (autouse fixture)
from conftest import TinyTokenizer, tiny_llama
from test_sampling_exact import (
    PROMPT,
    SAMPLES,
    VOCAB,
    fixed_drafter,
    goodness_of_fit,
    memo_target,
    processed_probs,
    two_sample,
)

import promptlookup
from promptlookup import Grammar, GrammarError
from promptlookup.drafters import NoDrafter
from promptlookup.grammar import GRAMMAR, engine_tokenizer
from promptlookup.loop import GenerationStats, speculative_generate
from promptlookup.sampling import SamplingParams, TokenChooser

#: Letters a..~ on the tiny tokenizer (id i >= 1 is chr(96 + i)); forced runs: "abc", "fghij".
PATTERN = r"abc(d|e)fghij[a-k]{2,30}"
PROMPTS = ["abcdfghijkabcefghijabcdefgh", "kjihgfedcbaabcefghijkkkk", "abcefghijabab"]


@functools.cache
def tiny_lm():
    return promptlookup.from_transformers(tiny_llama(vocab_size=32, seed=3), TinyTokenizer(32))


def test_bad_grammars_are_named_errors_with_one_line():
    for build, value in [
        (Grammar.json_schema, {"type": "wat"}),
        (Grammar.json_schema, "not a schema"),
        (Grammar.regex, "[a-z"),
        (Grammar.regex, ""),
        (Grammar.lark, "start: undefined_rule"),
    ]:
        with pytest.raises(GrammarError) as info:
            build(value)
        assert "\n" not in str(info.value) and str(info.value).startswith("invalid ")
    with pytest.raises(GrammarError, match="response_format must be"):
        Grammar.of_response_format({"type": "yaml"})
    with pytest.raises(GrammarError, match="needs a 'json_schema' object"):
        Grammar.of_response_format({"type": "json_schema"})
    assert Grammar.of_response_format({"type": "text"}) is None
    assert Grammar.of_response_format({"type": "json_object"}) == Grammar.json_schema(None)
    shaped = {"type": "json_object", "schema": SHAPE}  # llama-server's spelling
    assert Grammar.of_response_format(shaped) == Grammar.json_schema(SHAPE)
    with pytest.raises(promptlookup.InvalidParameterError, match="grammar must be"):
        tiny_lm().generate("abc", grammar=PATTERN)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_output_matches_the_grammar_and_equals_plain_constrained_decoding(prompt):
    lm, grammar = tiny_lm(), Grammar.regex(PATTERN)
    plain = lm.generate(prompt, max_new_tokens=40, drafter="none", grammar=grammar)
    fast = lm.generate(prompt, max_new_tokens=40, drafter="prompt-lookup", grammar=grammar)
    assert fast.token_ids == plain.token_ids
    assert re.fullmatch(PATTERN, fast.text), fast.text
    assert plain.stats.forward_passes == plain.stats.new_tokens  # one token per pass
    assert plain.stats.forced_tokens == plain.stats.drafted_tokens == 0
    assert fast.stats.forced_tokens > 0  # forced runs were drafted (as far as the policy keeps)
    assert fast.stats.forward_passes < plain.stats.forward_passes
    free = lm.generate(prompt, max_new_tokens=40, drafter="none")
    assert not re.fullmatch(PATTERN, free.text)  # the grammar is what made it match


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seeded_sampling_equals_plain_constrained_decoding(seed):
    lm, grammar = tiny_lm(), Grammar.regex(PATTERN)
    options = dict(max_new_tokens=40, temperature=1.0, top_k=8, seed=seed, grammar=grammar)
    plain = lm.generate(PROMPTS[0], drafter="none", **options)
    fast = lm.generate(PROMPTS[0], drafter="prompt-lookup", **options)
    assert fast.token_ids == plain.token_ids
    assert re.fullmatch(PATTERN, fast.text), fast.text
    assert fast.stats.forced_tokens > 0


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "seed": 7}])
def test_batch_decoder_equals_plain_constrained_decoding_alone(sampling):
    lm, grammar = tiny_lm(), Grammar.regex(PATTERN)
    options = dict(max_new_tokens=40, grammar=grammar, **sampling)
    batch = lm.generate_batch(PROMPTS, drafter="prompt-lookup", **options)
    for prompt, result in zip(PROMPTS, batch):
        alone = lm.generate(prompt, drafter="none", **options)
        assert result.token_ids == alone.token_ids
        assert re.fullmatch(PATTERN, result.text), result.text
    assert sum(result.stats.forced_tokens for result in batch) > 0


def test_forced_drafts_are_learned_as_the_grammar_source(monkeypatch):
    lm, learned = tiny_lm(), []
    real = lm.policy.learn

    def learn(draft, num_accepted):  # every draft the policy is told about
        learned.append((draft.source, draft.length, num_accepted))
        real(draft, num_accepted)

    monkeypatch.setattr(lm.policy, "learn", learn)
    lm.generate(PROMPTS[1], max_new_tokens=30, grammar=Grammar.regex(PATTERN))
    assert any(source == GRAMMAR and accepted > 0 for source, _, accepted in learned)


def test_a_stop_string_rolls_the_grammar_back_with_the_tokens():
    lm, grammar = tiny_lm(), Grammar.regex(PATTERN)
    plain = lm.generate(PROMPTS[0], max_new_tokens=40, drafter="none", grammar=grammar)
    stop = plain.text[12:14]
    stopped = lm.generate(PROMPTS[0], max_new_tokens=40, grammar=grammar, stop=stop)
    assert stopped.text == plain.text[: plain.text.index(stop)]
    assert stopped.stats.forced_tokens <= stopped.stats.accepted_tokens


def test_the_grammar_ends_the_output_with_eos_once_it_is_complete():
    lm = tiny_lm()
    result = lm.generate(PROMPTS[2], max_new_tokens=20, grammar=Grammar.regex("abc(d|e)"))
    assert re.fullmatch("abc(d|e)", result.text)
    assert result.finish_reason == "stop" and result.token_ids[-1] == 0


# -- the masked distribution, statistically (vocabulary of 8: EOS and a..g) ---------------------

#: Token 1 in a..e, token 2 forced ("c"), token 3 in b..g: (token 1, token 3) are counted.
SMALL = r"[a-e]c[b-g][a-g]*"


@functools.cache
def small_tokenizer():
    return engine_tokenizer(TinyTokenizer(VOCAB), [0])


def masked_probs(params, prefix, allowed):
    logits = memo_target().next_logits(tuple(prefix)).clone()
    mask = torch.full_like(logits, float("-inf"))
    mask[allowed] = 0
    return processed_probs(params, prefix, logits + mask)


def exact_masked_joint(params) -> np.ndarray:
    """P(token 1, token 3) under SMALL: (vocab, vocab)."""
    first = masked_probs(params, PROMPT, [1, 2, 3, 4, 5])
    joint = np.zeros((VOCAB, VOCAB))
    for t1 in range(1, 6):
        third = masked_probs(params, [*PROMPT, t1, 3], [2, 3, 4, 5, 6, 7])
        joint[t1] = first[t1].item() * third.numpy()
    return joint


def sample_masked(params, seeds, drafter_factory):
    counts, total = np.zeros((VOCAB, VOCAB), dtype=np.int64), GenerationStats()
    for seed in seeds:
        stats = GenerationStats()
        tokens = list(
            speculative_generate(
                memo_target(),
                PROMPT,
                max_new_tokens=5,
                drafter=drafter_factory(),
                chooser=TokenChooser.from_params(replace(params, seed=seed)),
                stats=stats,
                grammar=Grammar.regex(SMALL).start(small_tokenizer()),
            )
        )
        assert tokens[1] == 3  # the forced "c"
        counts[tokens[0], tokens[2]] += 1
        total.accepted_tokens += stats.accepted_tokens
        total.drafted_tokens += stats.drafted_tokens
        total.forced_tokens += stats.forced_tokens
    return counts, total


def test_sampling_under_a_grammar_keeps_the_masked_distribution():
    params = SamplingParams(temperature=1.0)
    joint = exact_masked_joint(params)
    first = int(joint.sum(axis=1).argmax())
    draft = [first, 3, int(joint[first].argmax())]  # likely; rejected often enough too
    drafted, stats = sample_masked(params, range(SAMPLES), fixed_drafter(draft))
    plain, plain_stats = sample_masked(params, range(SAMPLES, 2 * SAMPLES), NoDrafter)
    assert 0 < stats.accepted_tokens < stats.drafted_tokens and stats.forced_tokens > 0
    assert plain_stats.drafted_tokens == 0
    assert two_sample(drafted, plain, joint) > 0.001
    assert goodness_of_fit(drafted, joint) > 0.001
    assert goodness_of_fit(plain, joint) > 0.001


# -- the real default model ------------------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "city": {"type": "string", "maxLength": 40},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 5},
    },
    "required": ["name", "age", "city", "skills"],
    "additionalProperties": False,
}


def test_default_model_json_schema_equals_plain_constrained_decoding(default_lm):
    document = (
        "Maria Gonzalez is a 34 year old engineer living in Barcelona. She is skilled in "
        "Python, Rust and distributed systems."
    )
    messages = [{"role": "user", "content": f"Extract the person as JSON.\n\n{document}"}]
    response_format = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    options = dict(max_new_tokens=120, response_format=response_format)
    plain = default_lm.generate(messages, drafter="none", **options)
    fast = default_lm.generate(messages, **options)
    assert fast.token_ids == plain.token_ids and fast.finish_reason == "stop"
    answer = json.loads(fast.text)
    assert set(answer) == set(PERSON["properties"]) and answer["city"] == "Barcelona"
    assert fast.stats.forced_tokens > 0
    assert fast.stats.forward_passes < plain.stats.forward_passes


#: A Pydantic-style discriminated union: ``oneOf`` whose branches exclude each other.
SHAPE = {
    "oneOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "radius": {"type": "integer"}},
         "required": ["kind", "radius"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer"}},
         "required": ["kind", "side"], "additionalProperties": False},
    ]
}  # fmt: skip


def test_one_of_is_read_as_any_of_and_a_discriminated_union_holds(default_lm):
    messages = [{"role": "user", "content": "A circle of radius 3 as JSON."}]
    options = dict(max_new_tokens=40, grammar=Grammar.json_schema(SHAPE))
    plain = default_lm.generate(messages, drafter="none", **options)
    fast = default_lm.generate(messages, **options)
    assert fast.token_ids == plain.token_ids and fast.finish_reason == "stop"
    jsonschema.validate(json.loads(fast.text), SHAPE)  # exactly one branch
