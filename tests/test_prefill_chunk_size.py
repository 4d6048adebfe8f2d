"""A target's own prefill chunk (``TorchTarget.prefill_chunk``): a model whose sliding-window
layers keep only their window (Gemma 3) takes its prompts in smaller passes than other models
(less memory: a windowed layer's buffers hold its window and one pass's rows), the batch decoder
and the target's own prefill both follow it, and every token stays what one pass over the
whole prompt gives: greedy, drafted or not, alone or batched, with the prefix cache on or off,
on a tiny seeded Gemma 3 (quantized C layers, windows of 8 tokens) and a tiny Llama."""

from __future__ import annotations

import pytest
import torch
from _fixtures import one_thread  # noqa: F401 (fixture)
from conftest import TinyTokenizer, tiny_llama
from test_gguf_families import family_model
from test_prefill_chunks import _prompt, _same_kv
from test_quantized import quantized_tiny

import promptlookup
from promptlookup.backends.base import PREFILL_CHUNK
from promptlookup.backends.gguf import quantized
from promptlookup.backends.hf.target import WINDOWED_PREFILL_CHUNK, TorchTarget

needs_c = pytest.mark.skipif(not quantized.available(), reason="no C compiler here")


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    model = family_model(tmp_path_factory.mktemp("gemma"), "gemma3", seed=4)
    return promptlookup.from_transformers(model, TinyTokenizer(64), name="tiny-gemma3")


def _passes(lm) -> list[int]:
    """Rows of every forward pass ``lm``'s target runs from now on (appended to the list)."""
    rows: list[int] = []
    target = lm.target
    forward_batch = target.forward_batch

    def counted(caches, token_ids, logits_to_keep):
        rows.append(sum(len(tokens) for tokens in token_ids))
        return forward_batch(caches, token_ids, logits_to_keep)

    target.forward_batch = counted
    return rows


@needs_c
def test_windowed_models_take_smaller_prefill_passes(gemma):
    assert gemma.target.prefill_chunk == min(WINDOWED_PREFILL_CHUNK, PREFILL_CHUNK) < PREFILL_CHUNK
    llama = TorchTarget(tiny_llama(vocab_size=32, seed=1, layers=2, context=512))
    assert llama.prefill_chunk == PREFILL_CHUNK
    llama.prefill_chunk = 40
    assert llama.prefill_chunk == 40
    llama.prefill_chunk = None  # back to the model's own choice
    assert llama.prefill_chunk == PREFILL_CHUNK
    with pytest.raises(ValueError, match="at least 1 token"):
        llama.prefill_chunk = 0


@needs_c
def test_the_batch_decoder_feeds_a_prompt_in_passes_of_the_targets_chunk(gemma):
    prompt = _prompt(21, 130, 64)
    gemma.target.prefill_chunk = 40
    try:
        rows = _passes(gemma)
        gemma.generate(prompt, max_new_tokens=3, drafter="none", prefix_cache=False)
    finally:
        gemma.target.prefill_chunk = None
        del gemma.target.forward_batch  # the instance's wrapper: the class's method again
    # Three whole chunks, then the last 10 prompt tokens with the last one (its first token).
    assert rows[:4] == [40, 40, 40, 10] and set(rows[4:]) == {1}


def _generations(lm, prompts, chunk: int, **options) -> list[list[int]]:
    """Greedy tokens after each prompt, its prompt in passes of ``chunk`` tokens: alone, batched,
    and with a prefix cache holding each prompt's first half."""
    lm.target.prefill_chunk = chunk
    try:
        outputs = [lm.generate(p, prefix_cache=False, **options).token_ids for p in prompts]
        batch = lm.generate_batch(prompts, prefix_cache=False, prefill_tokens=chunk, **options)
        outputs += [result.token_ids for result in batch]
        cache = promptlookup.PrefixCache(mib=16)
        for prompt in prompts:
            lm.generate(prompt[: len(prompt) // 2], max_new_tokens=2, prefix_cache=cache)
        cached = [lm.generate(p, prefix_cache=cache, **options) for p in prompts]
        assert all(result.stats.cached_tokens > 0 for result in cached)
        outputs += [result.token_ids for result in cached]
        # The target's own prefill (the reference loop's path): its chunks too.
        outputs += [
            list(promptlookup.speculative_generate(lm.target, p, max_new_tokens=12))
            for p in prompts
        ]
    finally:
        lm.target.prefill_chunk = None
    return outputs


@needs_c
@pytest.mark.parametrize("drafter", ["none", "prompt-lookup"])
def test_every_chunk_size_gives_the_tokens_of_one_pass_over_the_prompt(gemma, drafter):
    """Chunks shorter than the window (8), across it, and the windowed default (the whole
    prompt here: the reference), greedy tokens alone, batched and cached."""
    prompts = [_prompt(22, 230, 64), _prompt(23, 57, 64), _prompt(24, 150, 64)]
    options = dict(max_new_tokens=12, drafter=drafter, speculation="fixed")
    expected = _generations(gemma, prompts, 1 << 20, **options)
    for chunk in (5, 8, 33, gemma.target.prefill_chunk):
        assert _generations(gemma, prompts, chunk, **options) == expected, chunk


@needs_c
def test_the_c_layers_slices_of_a_long_pass_change_no_bit(gemma, monkeypatch):
    """A 300-row pass in slices of 64 rows (the least: 1 byte of budget), of 100 KiB and of
    the whole pass (no budget): the same keys, values and logits of every row. A model with
    sliding-window layers has the budget (:data:`SLICE_BYTES`, 0 by default), others none."""
    from promptlookup.backends.gguf import quantized_layers

    target = gemma.target
    layers = target.decoder_pass.quantized_layers
    assert layers.slice_bytes == quantized_layers.SLICE_BYTES
    llama = TorchTarget(quantized_tiny(seed=3)).decoder_pass.quantized_layers
    assert llama is not None and llama.slice_bytes == 0
    prompt = _prompt(25, 300, 64)
    results = []
    for budget in (1, 100 * 2**10, 0):
        monkeypatch.setattr(layers, "slice_bytes", budget)
        cache = target.new_sequence()
        logits = target.forward_batch([cache], [prompt], [len(prompt)])[0]
        results.append((cache, logits))
    (expected_cache, expected), others = results[0], results[1:]
    for cache, logits in others:
        assert torch.equal(logits, expected)
        assert _same_kv(cache, expected_cache)


@needs_c
def test_drafts_are_cut_to_the_targets_logits_bound_without_changing_a_token(gemma, monkeypatch):
    """With a pass's logits bounded to 4 rows (a 3-token draft), prompt lookup's long drafts
    are cut: no decoding pass verifies more, and every token is the unbounded run's."""
    from promptlookup.backends.hf import target as hf_target

    prompts = [_prompt(26, 120, 64), _prompt(27, 90, 64)]
    options = dict(max_new_tokens=40, drafter="prompt-lookup", speculation="fixed")
    expected = [gemma.generate(p, prefix_cache=False, **options).token_ids for p in prompts]
    monkeypatch.setattr(hf_target, "LOGITS_BYTES", 4 * 4 * gemma.target.config.vocab_size)
    assert gemma.target.max_draft == 3
    rows = _passes(gemma)
    try:
        bounded = [gemma.generate(p, prefix_cache=False, **options) for p in prompts]
        together = gemma.generate_batch(prompts, prefix_cache=False, **options)
    finally:
        del gemma.target.forward_batch
    assert [result.token_ids for result in bounded] == expected
    assert [result.token_ids for result in together] == expected
    assert max(result.stats.accepted_tokens for result in bounded) > 0  # drafts were verified
    decoding = [count for count in rows if count < 64]  # passes after the prompts' first
    assert max(decoding) <= 2 * 4  # the batch: two sequences of 4 rows at most
