"""Greedy decoding is lossless: with any drafter, the loop's tokens are exactly those of plain
decoding and of ``transformers``' own ``model.generate(do_sample=False)`` (tiny float32 models)."""

from __future__ import annotations

import functools
import random

import pytest
import torch
from _fixtures import one_thread  # noqa: F401 (autouse fixture)
from conftest import TinyTokenizer, tiny_llama

import promptlookup
from promptlookup.backends.hf.target import TorchTarget
from promptlookup.drafters import CallableDrafter, NoDrafter, PromptLookupDrafter
from promptlookup.loop import GenerationStats, speculative_generate
from promptlookup.sampling import SamplingParams, TokenChooser

VOCAB = 32
#: Seeds whose greedy continuations of a repeated prompt are partly repetitive (drafts get
#: accepted) and partly not (drafts get rejected).
SEEDS = (3, 4, 6)
MAX_NEW = 48


@functools.cache
def model_for(seed: int):
    return tiny_llama(vocab_size=VOCAB, seed=seed)


def repeated_prompt(seed: int, period: int = 12, repeats: int = 3) -> list[int]:
    """A random sequence (no EOS id 0) repeated: prompt lookup finds plenty to draft from."""
    rng = random.Random(seed)
    return [rng.randrange(1, VOCAB) for _ in range(period)] * repeats


def hf_greedy(
    model, prompt: list[int], max_new_tokens: int, eos_token_id=None, **kwargs
) -> list[int]:
    """``transformers``' plain greedy decoding, new tokens only (ending with the EOS if any)."""
    input_ids = torch.tensor([prompt])  # (1, len(prompt))
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        pad_token_id=0,
        **kwargs,
    )
    return out[0, len(prompt) :].tolist()


def run(model, prompt, drafter, max_new_tokens=MAX_NEW, eos=(), chooser=None):
    stats = GenerationStats()
    tokens = list(
        speculative_generate(
            TorchTarget(model),
            prompt,
            max_new_tokens=max_new_tokens,
            drafter=drafter,
            chooser=chooser,
            eos_token_ids=eos,
            stats=stats,
        )
    )
    check_stats(tokens, stats, eos)
    return tokens, stats


def check_stats(tokens, stats, eos=()):
    assert stats.new_tokens == len(tokens)
    assert 0 <= stats.accepted_tokens <= stats.drafted_tokens
    assert 1 <= stats.forward_passes <= stats.new_tokens
    # Every forward pass yields its accepted draft tokens plus one bonus token, unless the
    # generation ended at an EOS that was itself an accepted draft token (no bonus then).
    ended_in_draft = stats.new_tokens == stats.forward_passes + stats.accepted_tokens - 1
    assert stats.new_tokens == stats.forward_passes + stats.accepted_tokens or (
        ended_in_draft and tokens[-1] in eos
    )


class Oracle:
    """Drafts the true greedy continuation (optionally corrupted), however long it is asked."""

    def __init__(self, prompt, continuation, corrupt=False, length=None):
        self.prompt_length = len(prompt)
        self.continuation = list(continuation)
        self.corrupt = corrupt
        self.length = length

    def __call__(self, tokens, max_tokens):
        position = len(tokens) - self.prompt_length
        draft = self.continuation[position : position + (self.length or max_tokens)]
        return [(t + 1) % VOCAB for t in draft] if self.corrupt else draft


@pytest.fixture(scope="module", params=SEEDS, ids=lambda s: f"seed{s}")
def case(request):
    """(model, prompt, plain tokens): plain = transformers' greedy output, checked equal to the
    loop's own plain decoding (drafter none)."""
    model = model_for(request.param)
    prompt = repeated_prompt(request.param)
    expected = hf_greedy(model, prompt, MAX_NEW)
    plain, stats = run(model, prompt, NoDrafter())
    assert plain == expected
    assert stats.forward_passes == stats.new_tokens == MAX_NEW and stats.drafted_tokens == 0
    return model, prompt, expected


@pytest.mark.parametrize("num_tokens", [1, 3, 10, 40])
def test_prompt_lookup_equals_plain_decoding_across_draft_lengths(case, num_tokens):
    model, prompt, expected = case
    tokens, stats = run(model, prompt, PromptLookupDrafter(num_tokens=num_tokens))
    assert tokens == expected
    assert stats.accepted_tokens > 0, "no draft accepted: the test would prove nothing"
    assert stats.forward_passes < stats.new_tokens


def test_some_drafts_are_rejected_too(case):
    """The seeds were chosen so that verification also rejects tokens (both paths run)."""
    model, prompt, expected = case
    tokens, stats = run(model, prompt, PromptLookupDrafter(num_tokens=10))
    assert tokens == expected
    assert 0 < stats.accepted_tokens < stats.drafted_tokens


def test_eos_inside_a_draft(case):
    model, prompt, plain = case
    # The EOS: the token that first appears latest in the plain output (well inside it).
    first_seen = {}
    for i, token in enumerate(plain):
        first_seen.setdefault(token, i)
    eos, k = max(first_seen.items(), key=lambda item: item[1])
    assert k >= 2
    expected = hf_greedy(model, prompt, MAX_NEW, eos_token_id=eos)
    assert expected == plain[: k + 1]  # transformers stops after the EOS, including it
    # A drafter proposing the true continuation, past the EOS: the EOS is an accepted draft
    # token and the generation ends right there, inside the draft (of the second step: the
    # first, which ends the prompt, drafts nothing).
    oracle = CallableDrafter(Oracle(prompt, plain))
    tokens, stats = run(model, prompt, oracle, eos=[eos])
    assert tokens == expected
    assert stats.forward_passes == 2 and stats.accepted_tokens == k
    for drafter in (
        NoDrafter(),
        PromptLookupDrafter(num_tokens=10, eos_token_ids=[eos]),
        PromptLookupDrafter(num_tokens=40),
    ):  # a draft running on past the EOS
        tokens, _ = run(model, prompt, drafter, eos=[eos])
        assert tokens == expected


@pytest.mark.parametrize("max_new_tokens", [1, 2, 5, 17])
def test_max_new_tokens_ending_inside_a_draft(case, max_new_tokens):
    model, prompt, plain = case
    expected = plain[:max_new_tokens]
    assert hf_greedy(model, prompt, max_new_tokens) == expected

    class Greedy:  # ignores max_tokens and drafts 40 tokens: the loop must cut the draft
        def propose(self, tokens, max_tokens):
            return Oracle(prompt, plain, length=40)(tokens, max_tokens)

        def update(self, draft, num_accepted):
            pass

    tokens, stats = run(model, prompt, Greedy(), max_new_tokens=max_new_tokens)
    assert tokens == expected
    # The first token alone, then max_new_tokens - 2 accepted + the bonus token.
    assert stats.forward_passes == min(max_new_tokens, 2)
    for drafter in (PromptLookupDrafter(num_tokens=40), NoDrafter()):
        tokens, stats = run(model, prompt, drafter, max_new_tokens=max_new_tokens)
        assert tokens == expected and stats.new_tokens == max_new_tokens


def test_garbage_drafts_change_nothing(case):
    model, prompt, plain = case
    wrong = CallableDrafter(Oracle(prompt, plain, corrupt=True))
    tokens, stats = run(model, prompt, wrong)
    assert tokens == plain
    assert stats.drafted_tokens > 0 and stats.accepted_tokens == 0
    assert stats.forward_passes == stats.new_tokens


def test_repetition_penalty_equals_transformers(case):
    model, prompt, _ = case
    penalty = 1.3
    expected = hf_greedy(model, prompt, MAX_NEW, repetition_penalty=penalty)
    results = {}
    for name, drafter in [
        ("none", NoDrafter()),
        ("prompt-lookup", PromptLookupDrafter(num_tokens=10)),
    ]:
        chooser = TokenChooser.from_params(SamplingParams(repetition_penalty=penalty))
        assert not chooser.plain_argmax  # the position-by-position path
        results[name] = run(model, prompt, drafter, chooser=chooser)
    assert results["none"][0] == expected
    assert results["prompt-lookup"][0] == expected
    assert results["prompt-lookup"][1].drafted_tokens > 0


def test_repetition_penalty_with_accepted_drafts():
    """A mild penalty on a model that still loops: drafts are accepted under the penalty."""
    model, prompt = model_for(4), repeated_prompt(4)
    penalty = 1.05
    expected = hf_greedy(model, prompt, MAX_NEW, repetition_penalty=penalty)
    chooser = TokenChooser.from_params(SamplingParams(repetition_penalty=penalty))
    tokens, stats = run(model, prompt, PromptLookupDrafter(num_tokens=10), chooser=chooser)
    assert tokens == expected
    assert stats.accepted_tokens > 0


# -- through the API (LanguageModel) -------------------------------------------------------------


@pytest.fixture(scope="module")
def lm():
    return promptlookup.from_transformers(model_for(3), TinyTokenizer(VOCAB), name="tiny-3")


def test_api_generate_equals_transformers(lm):
    prompt = repeated_prompt(3)
    expected = hf_greedy(lm.model, prompt, MAX_NEW, eos_token_id=0)
    for drafter in ("prompt-lookup", "none", [None, "prompt-lookup"]):
        result = lm.generate(prompt, max_new_tokens=MAX_NEW, drafter=drafter)
        assert result.token_ids == expected
        assert result.text == lm.tokenizer.decode(expected)
        assert result.stats.new_tokens == len(result.token_ids)
        assert result.finish_reason == "length"


def test_api_result_includes_the_eos_token():
    """transformers stops after EOS and includes it; so does ``GenerationResult.token_ids``."""
    seed = 7  # this model writes EOS (id 0, its generation_config's eos) after 18 tokens
    model, prompt = model_for(seed), repeated_prompt(seed)
    lm = promptlookup.from_transformers(model, TinyTokenizer(VOCAB), name="tiny-7")
    assert lm.eos_token_ids == [0]
    expected = hf_greedy(model, prompt, MAX_NEW, eos_token_id=0)
    assert expected[-1] == 0 and len(expected) < MAX_NEW
    for drafter in ("prompt-lookup", "none"):
        result = lm.generate(prompt, max_new_tokens=MAX_NEW, drafter=drafter)
        assert result.token_ids == expected
        assert result.finish_reason == "stop"


@pytest.mark.parametrize("drafter", ["prompt-lookup", "none"])
def test_stop_strings_cut_text_and_tokens(lm, drafter):
    prompt = repeated_prompt(3)
    full = lm.generate(prompt, max_new_tokens=MAX_NEW, drafter="none")
    assert 0 not in full.token_ids  # one character per token from here on
    text = full.text
    stop = text[30:33]
    cut = text.find(stop)
    result = lm.generate(prompt, max_new_tokens=MAX_NEW, drafter=drafter, stop=[stop])
    assert result.text == text[:cut]
    # token_ids end with the token that completed the stop string.
    assert result.token_ids == full.token_ids[: cut + len(stop)]
    assert result.finish_reason == "stop"
    # Several stop strings: the earliest in the text wins, whatever the order given.
    late = text[-3:]
    early = text[12:14]
    cut_early = min(text.find(early), text.find(late))
    result = lm.generate(prompt, max_new_tokens=MAX_NEW, drafter=drafter, stop=[late, early])
    assert result.text == text[:cut_early]
    # A stop string that never appears: nothing changes.
    result = lm.generate(prompt, max_new_tokens=MAX_NEW, drafter=drafter, stop="@@@")
    assert (result.text, result.token_ids, result.finish_reason) == (text, full.token_ids, "length")


def test_api_garbage_callable_drafter(lm):
    prompt = repeated_prompt(3)
    plain = hf_greedy(lm.model, prompt, MAX_NEW, eos_token_id=0)
    result = lm.generate(
        prompt, max_new_tokens=MAX_NEW, drafter=Oracle(prompt, plain, corrupt=True)
    )
    assert result.token_ids == plain
    assert result.stats.accepted_tokens == 0


@pytest.mark.parametrize(
    "prompt, options, error",
    [
        ("", {}, promptlookup.EmptyPromptError),
        ("   ", {"chat": True}, promptlookup.EmptyPromptError),
        ([], {}, promptlookup.EmptyPromptError),
        ([1, 2], {"max_new_tokens": 0}, promptlookup.InvalidParameterError),
        ([1, 2], {"max_new_tokens": 511}, promptlookup.PromptTooLongError),  # context is 512
        ([1, 2], {"temperature": -1.0}, promptlookup.InvalidParameterError),
        ([1, 2], {"top_p": 0.0}, promptlookup.InvalidParameterError),
        ([1, 2], {"top_k": -1}, promptlookup.InvalidParameterError),
        ([1, 2], {"repetition_penalty": 0.0}, promptlookup.InvalidParameterError),
        ([1, 2], {"drafter": "magic"}, promptlookup.InvalidParameterError),
        ([1, 2], {"num_tokens": 0}, promptlookup.InvalidParameterError),
        ([{"role": "user"}], {}, promptlookup.InvalidParameterError),
    ],
)
def test_api_bad_input_raises_a_named_error_before_generating(lm, prompt, options, error):
    with pytest.raises(error) as info:
        lm.stream(prompt, **options)
    assert "\n" not in str(info.value) and str(info.value)
