"""Chunked prefill is exact: a prompt fed in chunks of any size leaves bit for bit the keys,
values and logits that one pass over the whole prompt leaves, and every generation gives the
tokens it gives unchunked (alone and batched, prefix cache on and off), on tiny seeded models
(float32 layers in Python, quantized layers in C, Gemma 3's windows) and on the real default
model. Row-invariant passes are what make it so: a row depends on its own position and its
sequence's cache alone, never on the rows that share its pass."""

from __future__ import annotations

import random

import pytest
import torch
from _fixtures import attention_path, one_thread  # noqa: F401 (fixtures)
from conftest import TinyTokenizer, tiny_llama
from test_gguf_families import family_model
from test_quantized import quantized_tiny

import promptlookup
from promptlookup import batching
from promptlookup.backends.gguf import quantized
from promptlookup.backends.hf import target as hf_target
from promptlookup.backends.hf.target import TorchTarget

#: A chunk longer than any prompt here: the whole prompt in one pass (unchunked).
WHOLE = 1 << 20


def _prompt(seed: int, length: int, vocab: int) -> list[int]:
    """A prompt that repeats spans of itself (so prompt lookup drafts, and some are accepted)."""
    rng = random.Random(seed)
    motif = [rng.randrange(1, vocab) for _ in range(9)]
    tokens: list[int] = []
    while len(tokens) < length:
        tokens += motif[: rng.randint(2, 9)] + [rng.randrange(1, vocab)]
    return tokens[:length]


def _same_kv(cache, expected) -> bool:
    """Whether two sequences' caches hold the same keys and values at every position both
    hold (a windowed layer keeps only its last positions, from an ``offset`` that depends on
    how the prompt was cut into passes: backends/hf/window.py)."""
    for layer, other in zip(cache.layers, expected.layers):
        if layer.get_seq_length() != other.get_seq_length():
            return False
        first = max(getattr(layer, "offset", 0), getattr(other, "offset", 0))
        window = getattr(layer, "window", None) or layer.get_seq_length()
        if layer.get_seq_length() - first < min(window, layer.get_seq_length()):
            return False  # one of them lost positions its next pass reads
        for mine, theirs in ((layer.keys, other.keys), (layer.values, other.values)):
            mine = mine[..., first - getattr(layer, "offset", 0) :, :]
            theirs = theirs[..., first - getattr(other, "offset", 0) :, :]
            if not torch.equal(mine, theirs):
                return False
    return True


def _prefilled(target: TorchTarget, prompts: list[list[int]], chunk: int):
    """Each prompt's cache and its last position's logits (vocab,), the prompts fed side by side
    in shared passes of up to ``chunk`` tokens each (a prompt that has ended sits out); a
    chunked prompt's cache reserved at once, as the batch decoder reserves it."""
    caches = [target.new_sequence() for _ in prompts]
    if chunk != WHOLE:
        for cache, prompt in zip(caches, prompts):
            target.reserve(cache, len(prompt), 8)
    last: list[torch.Tensor | None] = [None] * len(prompts)
    for start in range(0, max(map(len, prompts)), chunk):
        pieces = [prompt[start : start + chunk] for prompt in prompts]
        keep = [
            int(start + chunk >= len(prompt) and bool(piece))
            for prompt, piece in zip(prompts, pieces)
        ]
        for index, logits in enumerate(target.forward_batch(caches, pieces, keep)):
            if keep[index]:
                last[index] = logits[-1]
    return caches, last


def _assert_same_prefill(target: TorchTarget, prompts: list[list[int]], chunks) -> None:
    """Alone and side by side, in chunks of each size of ``chunks``: the unchunked pass's keys,
    values and last logits, bit for bit."""
    reference = [_prefilled(target, [prompt], WHOLE) for prompt in prompts]
    for chunk in chunks:
        for together in (False, True):
            runs = (
                [_prefilled(target, prompts, chunk)]
                if together
                else [_prefilled(target, [prompt], chunk) for prompt in prompts]
            )
            caches = [cache for run in runs for cache in run[0]]
            logits = [row for run in runs for row in run[1]]
            for index, (cache, row) in enumerate(zip(caches, logits)):
                (expected_cache,), (expected_row,) = reference[index]
                assert _same_kv(cache, expected_cache), (chunk, together)
                assert torch.equal(row, expected_row), (chunk, together, index)


def _generations(lm, prompts, chunk: int, monkeypatch, **options) -> list[list[int]]:
    """Greedy tokens after each prompt with prompts fed ``chunk`` tokens per pass: alone
    (generate) and batched (generate_batch), each with the prefix cache off and on (the cache
    filled by a first request that shares each prompt's first half)."""
    monkeypatch.setattr(batching, "PREFILL_CHUNK", chunk)
    monkeypatch.setattr(hf_target, "PREFILL_CHUNK", chunk)
    outputs = []
    for cached in (False, True):
        cache = promptlookup.PrefixCache(mib=16) if cached else False
        if cached:  # every prompt's first half in the cache, so the rest is fed after it
            for prompt in prompts:
                lm.generate(prompt[: len(prompt) // 2], max_new_tokens=2, prefix_cache=cache)
        alone = [lm.generate(p, prefix_cache=cache, **options) for p in prompts]
        if cached:
            assert all(result.stats.cached_tokens > 0 for result in alone)
        outputs += [result.token_ids for result in alone]
        together = lm.generate_batch(prompts, prefix_cache=cache, prefill_tokens=chunk, **options)
        outputs += [result.token_ids for result in together]
    return outputs


def _assert_same_generations(lm, prompts, chunks, monkeypatch, **options) -> None:
    expected = _generations(lm, prompts, WHOLE, monkeypatch, **options)
    # Unchunked, alone and batched, cached or not: one answer per prompt (the reference
    # itself is consistent before chunks are compared with it).
    assert expected == expected[: len(prompts)] * 4
    for chunk in chunks:
        assert _generations(lm, prompts, chunk, monkeypatch, **options) == expected, chunk


def test_chunked_prefill_leaves_the_whole_prompts_keys_values_and_logits(attention_path):
    target = TorchTarget(tiny_llama(vocab_size=48, seed=3, layers=2, context=512))
    assert target.row_invariant
    prompts = [_prompt(1, 300, 48), _prompt(2, 77, 48), _prompt(3, 190, 48)]
    # Chunks across key blocks (64), shorter than one, and of one token.
    _assert_same_prefill(target, prompts, [1, 13, 64, 100])


@pytest.mark.skipif(not quantized.available(), reason="no C compiler here")
def test_chunked_prefill_is_exact_in_the_quantized_c_layers():
    target = TorchTarget(quantized_tiny(seed=1))
    assert target.decoder_pass.quantized_layers is not None  # the one-call C layers
    prompts = [_prompt(4, 450, 64), _prompt(5, 120, 64)]
    _assert_same_prefill(target, prompts, [7, 64, 200])


@pytest.mark.skipif(not quantized.available(), reason="no C compiler here")
def test_chunked_prefill_is_exact_across_gemma_3s_sliding_windows(tmp_path):
    """Chunks far longer and far shorter than the window (8 tokens here)."""
    target = TorchTarget(family_model(tmp_path, "gemma3", seed=2))
    prompts = [_prompt(6, 260, 64), _prompt(7, 41, 64)]
    _assert_same_prefill(target, prompts, [3, 8, 9, 100])


@pytest.mark.parametrize("drafter", ["none", "prompt-lookup"])
def test_generations_with_chunked_prefill_give_the_unchunked_tokens(monkeypatch, drafter):
    model = tiny_llama(vocab_size=32, seed=5, layers=2, context=512)
    lm = promptlookup.from_transformers(model, TinyTokenizer(32), name="tiny")
    prompts = [_prompt(8, 210, 32), _prompt(9, 35, 32), _prompt(10, 130, 32)]
    _assert_same_generations(lm, prompts, [16, 50], monkeypatch, max_new_tokens=24, drafter=drafter)


@pytest.mark.skipif(not quantized.available(), reason="no C compiler here")
def test_a_quantized_models_generations_with_chunked_prefill_give_the_unchunked_tokens(
    monkeypatch,
):
    lm = promptlookup.from_transformers(quantized_tiny(seed=2), TinyTokenizer(64), name="q")
    prompts = [_prompt(11, 300, 64), _prompt(12, 60, 64)]
    _assert_same_generations(lm, prompts, [24], monkeypatch, max_new_tokens=16)


def test_the_default_models_chunked_prefill_is_exact(default_lm, monkeypatch):
    """The real model (quantized layers in C, float16 keys and values): 300 tokens of real text
    in chunks of 64 (the C layers' slices are 512 rows: also less)."""
    text = " ".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(40))
    prompt = default_lm.encode(text)[:300]
    assert len(prompt) == 300
    _assert_same_prefill(default_lm.target, [prompt, prompt[:90]], [64])
    _assert_same_generations(default_lm, [prompt], [64], monkeypatch, max_new_tokens=8)


def test_a_reserved_cache_takes_the_whole_prompt_in_one_allocation():
    """Reserved, the cache holds the prompt and a quarter of it more at most: the chunks write
    into that one buffer (no copy as it grows, no freed buffers left in the heap)."""
    target = TorchTarget(tiny_llama(vocab_size=48, seed=3, layers=2, context=2048))
    prompt = _prompt(13, 1000, 48)
    cache = target.new_sequence()
    target.reserve(cache, len(prompt), 4000)
    layers = cache.layers
    capacities = {layer.value_buffer.shape[-2] for layer in layers}
    assert capacities == {1280}  # 1,000 + 250, rounded up to whole key blocks
    pointers = [(layer.key_storage.data_ptr(), layer.value_buffer.data_ptr()) for layer in layers]
    for start in range(0, len(prompt), 300):
        target.forward_batch([cache], [prompt[start : start + 300]], [1])
    assert [(layer.key_storage.data_ptr(), layer.value_buffer.data_ptr()) for layer in layers] == (
        pointers
    )
    assert cache.get_seq_length() == len(prompt)
