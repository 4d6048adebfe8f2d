"""The prefix cache never changes a token: every output with it equals the output without it,
token for token (greedy, seeded sampling, logprobs), in float32, bfloat16 and the quantized
engine, one request at a time and under continuous batching; it stays within its budget; a
tenant never reuses another's entries; targets without row-invariant passes reuse nothing."""

from __future__ import annotations

import random

import pytest
import torch
from _fixtures import one_thread  # noqa: F401 (fixture)
from conftest import TinyTokenizer, tiny_llama
from test_quantized import quantized_tiny

import promptlookup
from promptlookup.backends.gguf import quantized_layers
from promptlookup.errors import InvalidParameterError
from promptlookup.prefix_cache import PrefixCache


def tiny(kind: str):
    """A tiny seeded model as a LanguageModel: float32, bfloat16 or the quantized engine."""
    if kind == "quantized":
        if quantized_layers.kernel() is None:
            pytest.skip("no C compiler here")
        return promptlookup.from_transformers(quantized_tiny(1), TinyTokenizer(64), name="q")
    model = tiny_llama(seed=1)
    return promptlookup.from_transformers(
        model if kind == "float32" else model.to(torch.bfloat16), TinyTokenizer(32), name=kind
    )


def conversation(lm, turns: int, options: dict, cache) -> list:
    """A conversation: each turn's prompt is the last one, its answer and new tokens."""
    rng = random.Random(7)
    vocab = lm.tokenizer.vocab_size
    prompt = [rng.randrange(1, vocab) for _ in range(90)]
    results = []
    for _ in range(turns):
        result = lm.generate(prompt, max_new_tokens=24, prefix_cache=cache, **options)
        results.append(result)
        prompt = [*prompt, *result.token_ids, *(rng.randrange(1, vocab) for _ in range(11))]
    return results


SAMPLING = {"temperature": 0.9, "top_k": 10, "seed": 3, "repetition_penalty": 1.1}


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "quantized"])
@pytest.mark.parametrize("options", [{}, SAMPLING], ids=["greedy", "sampled"])
def test_a_conversation_with_the_cache_is_the_conversation_without_it(kind, options):
    lm = tiny(kind)
    without = conversation(lm, 4, {**options, "logprobs": 2}, False)
    cache = PrefixCache(mib=64, block_tokens=16)
    with_cache = conversation(lm, 4, {**options, "logprobs": 2}, cache)
    for plain, cached in zip(without, with_cache):
        assert cached.token_ids == plain.token_ids
        assert cached.stats.logprobs == plain.stats.logprobs
    assert [r.stats.cached_tokens for r in without] == [0] * 4
    # Turn 1 finds nothing; each later turn at least the whole blocks of the last prompt.
    found = [r.stats.cached_tokens for r in with_cache]
    assert found[0] == 0
    for before, now in zip(with_cache, found[1:]):
        assert now >= before.stats.prompt_tokens // 16 * 16 > 0


def test_the_cache_keeps_keys_and_values_bit_for_bit():
    lm = tiny("float32")
    target, prompt = lm.target, list(range(1, 31)) * 3
    cache = PrefixCache(mib=8, block_tokens=4)  # 22 blocks: copied out in two parts
    sequence = target.new_sequence()
    target.forward_batch([sequence], [prompt], [0])
    cache.store(target, sequence, prompt)
    restored = target.new_sequence()
    assert cache.restore(target, restored, [*prompt[:70], 31]) == 70  # to the token, mid-block
    for before, after in zip(sequence.layers, restored.layers):
        assert torch.equal(after.keys, before.keys[:, :, :70])
        assert torch.equal(after.values, before.values[:, :, :70])


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "quantized"])
@pytest.mark.parametrize("options", [{}, SAMPLING], ids=["greedy", "sampled"])
def test_batched_requests_sharing_a_prefix_get_what_they_get_alone(kind, options):
    lm = tiny(kind)
    options = {**options, "logprobs": 2, "max_new_tokens": 20}
    rng = random.Random(5)
    vocab = lm.tokenizer.vocab_size
    shared = [rng.randrange(1, vocab) for _ in range(120)]
    prompts = [[*shared, *(rng.randrange(1, vocab) for _ in range(n))] for n in (1, 5, 9, 30, 3)]
    alone = [lm.generate(p, prefix_cache=False, **options) for p in prompts]
    cache = PrefixCache(mib=64, block_tokens=16)
    lm.generate(shared, max_new_tokens=4, prefix_cache=cache)  # the prefix, seen before
    # Two slots: later prompts join as earlier ones end, the cache filled meanwhile.
    results = lm.generate_batch(prompts, max_batch=2, prefix_cache=cache, **options)
    assert [r.token_ids for r in results] == [r.token_ids for r in alone]
    assert [r.stats.logprobs for r in results] == [r.stats.logprobs for r in alone]
    assert all(r.stats.cached_tokens >= 112 for r in results)  # whole 16-token blocks


def test_the_cache_stays_within_its_budget_and_forgets_the_least_recently_used():
    lm = tiny("float32")
    per_block = lm.target.kv_bytes_per_token * 16
    cache = PrefixCache(mib=6 * per_block / 2**20, block_tokens=16)  # 6 blocks
    rng = random.Random(9)
    prompts = [[rng.randrange(1, 32) for _ in range(64)] for _ in range(3)]  # 4+ blocks each
    for prompt in prompts:
        lm.generate(prompt, max_new_tokens=4, prefix_cache=cache)
        assert cache.used_bytes <= cache.limit_bytes
    assert lm.generate(prompts[-1], max_new_tokens=4, prefix_cache=cache).stats.cached_tokens
    assert not lm.generate(prompts[0], max_new_tokens=4, prefix_cache=cache).stats.cached_tokens


def test_a_tenant_reuses_only_its_own_entries():
    lm = tiny("float32")
    cache, prompt = PrefixCache(mib=8, block_tokens=16), list(range(1, 31)) * 3
    first = lm.generate(prompt, max_new_tokens=8, prefix_cache=cache, tenant="a")
    other = lm.generate(prompt, max_new_tokens=8, prefix_cache=cache, tenant="b")
    again = lm.generate(prompt, max_new_tokens=8, prefix_cache=cache, tenant="a")
    assert other.stats.cached_tokens == 0 and again.stats.cached_tokens > 0
    assert first.token_ids == other.token_ids == again.token_ids


def test_the_models_default_cache_is_used_unless_turned_off():
    lm = tiny("float32")
    lm.prefix_cache = PrefixCache(mib=8, block_tokens=16)
    prompt = list(range(1, 31)) * 2
    lm.generate(prompt, max_new_tokens=4)
    assert lm.generate(prompt, max_new_tokens=4).stats.cached_tokens > 0
    assert lm.generate(prompt, max_new_tokens=4, prefix_cache=False).stats.cached_tokens == 0
    with pytest.raises(InvalidParameterError, match="prefix_cache"):
        lm.generate(prompt, max_new_tokens=4, prefix_cache="yes")


def test_targets_without_row_invariant_passes_reuse_nothing():
    from promptlookup.backends.hf.target import TorchTarget

    lm = tiny("float32")
    lm.target = TorchTarget(lm.model, row_invariant=False)
    assert not PrefixCache.applies(lm.target)
    cache, prompt = PrefixCache(mib=8, block_tokens=16), list(range(1, 31)) * 2
    lm.generate(prompt, max_new_tokens=4, prefix_cache=cache)
    assert lm.generate(prompt, max_new_tokens=4, prefix_cache=cache).stats.cached_tokens == 0
    assert cache.used_bytes == 0


def test_a_cache_holds_one_models_keys_and_values():
    small, other = tiny("float32"), tiny("quantized")
    cache, prompt = PrefixCache(mib=8, block_tokens=16), list(range(1, 31)) * 2
    small.generate(prompt, max_new_tokens=4, prefix_cache=cache)
    with pytest.raises(InvalidParameterError, match="one model"):
        other.generate(prompt, max_new_tokens=4, prefix_cache=cache)


@pytest.mark.parametrize("mib", [0, -1])
def test_a_cache_needs_a_budget(mib):
    with pytest.raises(InvalidParameterError, match="budget"):
        PrefixCache(mib=mib)


@pytest.mark.slow
def test_the_default_model_answers_a_conversation_alike_with_and_without_the_cache(default_lm):
    messages = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    cache, texts = PrefixCache(mib=256), {}
    for use in (False, cache):
        turns, history = [], list(messages)
        for step in range(3):
            result = default_lm.generate(history, max_new_tokens=48, prefix_cache=use)
            turns.append((result.token_ids, result.stats.cached_tokens))
            history += [
                {"role": "assistant", "content": result.text},
                {"role": "user", "content": f"Now change it: step {step}."},
            ]
        texts[bool(use)] = turns
    assert [ids for ids, _ in texts[True]] == [ids for ids, _ in texts[False]]
    assert all(cached > 20 for _, cached in texts[True][1:])
