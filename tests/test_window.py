"""Sliding-window layers keep only their window (``backends/hf/window.py``) and change no bit:
a windowed layer holds what a whole layer holds where a pass can read it, under any passes and
crops; tiny Gemma-3-shaped models (windows of 8 and 16) give the same logits as with whole
layers, alone and batched; and the prefix cache resumes a windowed model exactly at every
prefix length around the window's edges, as with the cache off."""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch
from conftest import TinyTokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_gguf_families import VOCAB, family_model

import promptlookup
from promptlookup.backends.gguf import quantized
from promptlookup.backends.gguf.row_invariant import KEY_BLOCK
from promptlookup.backends.hf.cache import GrowingLayer, growing_cache
from promptlookup.backends.hf.target import TorchTarget
from promptlookup.backends.hf.window import (
    MARGIN,
    WindowCropError,
    WindowedCache,
    WindowedLayer,
)
from promptlookup.models import PACKAGED_MODELS
from promptlookup.prefix_cache import PrefixCache

KV_HEADS, HEAD_DIM = 2, 4


def states(rng: torch.Generator, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (1, KV_HEADS, count, HEAD_DIM)
    return torch.randn(shape, generator=rng), torch.randn(shape, generator=rng)


@settings(max_examples=60, deadline=None)
@given(
    window=st.sampled_from([1, 5, 8, 16, 70]),
    steps=st.lists(st.tuples(st.integers(1, 150), st.integers(0, 150)), min_size=1, max_size=25),
    transposed=st.booleans(),
)
def test_a_windowed_layer_holds_what_a_whole_layer_holds_within_every_window(
    window, steps, transposed
):
    """Passes of any size, each cropped back into itself (a rejected draft), keep every
    position that the next pass's window reads, bit for bit those of a whole layer, at
    block-aligned offsets, in buffers bounded by the window and the pass, not the length."""
    rng = torch.Generator().manual_seed(window)
    whole, windowed = GrowingLayer(transposed), WindowedLayer(window, transposed)
    largest = 0
    for count, rejected in steps:
        largest = max(largest, count)
        start = whole.get_seq_length()
        keys, values = states(rng, count)
        whole.update(keys, values)
        windowed.update(keys, values)
        assert windowed.get_seq_length() == whole.get_seq_length()
        room = windowed.keep + largest + windowed.slack + 2 * KEY_BLOCK
        assert windowed.capacity <= 2 * room  # never the sequence's length
        length = max(start, start + count - rejected)
        whole.crop(length)
        windowed.crop(length)
        offset = windowed.offset
        assert offset % KEY_BLOCK == 0 and offset <= max(0, length - window + 1)
        assert torch.equal(windowed.keys, whole.keys[..., offset:length, :])
        assert torch.equal(windowed.values, whole.values[..., offset:length, :])
    if windowed.offset > 0:  # further back than the window it holds: a named error
        with pytest.raises(WindowCropError, match="cannot be cropped back"):
            windowed.crop(windowed.offset + window - 2)


class WholeLayers(TorchTarget):
    """The same target with every layer whole (the kernels still mask by window): the
    reference a windowed cache must equal."""

    def new_sequence(self):
        cache = growing_cache(self.model.config, True, self.kv_dtype)
        cache.layers = [GrowingLayer(True, self.kv_dtype) for _ in cache.layers]
        return cache


@pytest.fixture(scope="module")
def gemmas(tmp_path_factory):
    if not quantized.available():
        pytest.skip("no C compiler here")
    folder = tmp_path_factory.mktemp("window")
    return {
        window: family_model(folder, "gemma3", **{"attention.sliding_window": window})
        for window in (8, 16)
    }


@pytest.mark.parametrize("window", [8, 16])
@pytest.mark.parametrize("one_call", [True, False])
def test_gemma_with_windowed_layers_is_gemma_with_whole_layers(gemmas, window, one_call):
    """Prompt chunks, drafts cropped back and one-token steps far past the window: the same
    logits bit for bit as whole layers, with windowed layers holding far less."""
    model = gemmas[window]
    windowed = TorchTarget(model, layers_in_one_call=one_call)
    whole = WholeLayers(model, layers_in_one_call=one_call)
    assert isinstance(windowed.cache, WindowedCache)
    rng = random.Random(window)
    for target in (windowed, whole):
        target.reset()
    for size, rejected in [(150, 0), (7, 3), (1, 0), (33, 30), (64, 1), (200, 5), (2, 1)] * 2:
        tokens = [rng.randrange(1, VOCAB) for _ in range(size)]
        start = windowed.cache_length
        logits = [target.forward(tokens) for target in (windowed, whole)]
        assert torch.equal(*logits), (size, start)
        for target in (windowed, whole):
            target.crop(start + size - rejected)
    length = windowed.cache_length
    sliding = windowed.cache.layers[0]
    assert isinstance(sliding, WindowedLayer) and length > 800
    assert sliding.capacity < length // 2 and sliding.offset > 0  # not the whole sequence
    assert windowed.cache.layers[1].get_seq_length() == length  # global layers hold all


@pytest.mark.parametrize("window", [8, 16])
def test_batched_windowed_sequences_get_their_rows_alone(gemmas, window):
    """Sequences of different lengths past the window share passes: each row is its row
    alone (over whole layers)."""
    model = gemmas[window]
    target, whole = TorchTarget(model), WholeLayers(model)
    rng = random.Random(3)
    prompts = [[rng.randrange(1, VOCAB) for _ in range(n)] for n in (5, 90, 170)]
    caches = [target.new_sequence() for _ in prompts]
    batched = target.forward_batch(caches, prompts, [len(p) for p in prompts])
    for _ in range(6):  # then steps of 1-4 rows each
        steps = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 4))] for _ in prompts]
        for index, rows in enumerate(target.forward_batch(caches, steps, [len(s) for s in steps])):
            batched[index] = torch.cat([batched[index], rows])
        prompts = [p + s for p, s in zip(prompts, steps)]
    for prompt, rows in zip(prompts, batched):
        whole.reset()
        assert torch.equal(whole.forward(prompt), rows)


def decoded(target, tokens: list[int], rng: random.Random):
    """``tokens`` fed as a prompt chunk, then steps with drafts cropped back (so the windowed
    layers drop positions as decoding does); returns the cache."""
    target.reset()
    cut = rng.randint(1, len(tokens))
    target.forward(tokens[:cut])
    while target.cache_length < len(tokens):
        start = target.cache_length
        size = min(rng.randint(1, 6), len(tokens) - start)
        target.forward([*tokens[start : start + size], *([1] * rng.randint(0, 3))])
        target.crop(start + size)
    return target.cache


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    window=st.sampled_from([8, 16]),
    stored=st.integers(1, 260),
    back=st.integers(-3, 40),
    extra=st.integers(1, 12),
    seed=st.integers(0, 10**6),
)
def test_a_cached_prefix_resumes_exactly_around_the_windows_edges(
    gemmas, window, stored, back, extra, seed
):
    """A sequence of ``stored`` tokens (decoded with drafts) is cached; a request sharing its
    first ``stored - back`` tokens resumes from the cache where the blocks carry its window,
    and its logits are bit for bit those with the cache off. Resuming is guaranteed within
    ``margin`` tokens of the stored end."""
    target = TorchTarget(gemmas[window])
    rng = random.Random(seed)
    first = [rng.randrange(1, VOCAB) for _ in range(stored)]
    cache = PrefixCache(mib=64, block_tokens=16)
    cache.store(target, decoded(target, first, rng), first)
    shared = max(0, min(stored, stored - back))
    request = [*first[:shared], *(rng.randrange(1, VOCAB) for _ in range(extra))]
    sequence = target.new_sequence()
    resumed = cache.restore(target, sequence, request[:-1])
    common = next(
        (i for i, (a, b) in enumerate(zip(first, request[:-1])) if a != b),
        min(len(first), len(request) - 1),
    )
    assert resumed <= common and sequence.get_seq_length() == resumed
    if common >= stored - min(MARGIN, window):  # the stored window, and its margin
        assert resumed == common
    target.cache = sequence
    rest = target.forward(request[resumed:])
    target.reset()
    assert torch.equal(rest, target.forward(request)[resumed:]), (stored, shared, resumed)


def test_a_conversation_of_a_windowed_model_with_the_cache_is_one_without(gemmas):
    """Greedy turns of a conversation past the window: the same tokens with the cache on, and
    every later turn resumes from it."""
    lm = promptlookup.from_transformers(gemmas[8], TinyTokenizer(VOCAB), name="gemma3")

    def conversation(prefix_cache):
        rng, prompt, results = random.Random(5), [5, 9, 2] * 30, []
        for _ in range(3):
            result = lm.generate(prompt, max_new_tokens=40, prefix_cache=prefix_cache)
            results.append(result)
            prompt = [*prompt, *result.token_ids, *(rng.randrange(1, VOCAB) for _ in range(9))]
        return results

    without = conversation(False)
    cached = conversation(PrefixCache(mib=64, block_tokens=16))
    assert [r.token_ids for r in cached] == [r.token_ids for r in without]
    assert all(r.stats.cached_tokens > 100 for r in cached[1:])


GEMMA = PACKAGED_MODELS["gemma-3-270m"]


@pytest.mark.skipif(importlib.util.find_spec(GEMMA) is None, reason=f"{GEMMA} not installed")
def test_gemma_3_270m_windowed_is_gemma_3_270m_whole_past_its_window():
    """The real model (window 512): a 1,800-token prompt in three chunks, then steps with drafts
    cropped back, give the same logits bit for bit with windowed and with whole layers."""
    target = promptlookup.load_model("gemma-3-270m").target
    windowed = target.new_sequence()
    assert isinstance(windowed, WindowedCache)
    whole = growing_cache(target.model.config, True, target.kv_dtype)
    whole.layers = [GrowingLayer(True, target.kv_dtype) for _ in whole.layers]
    rng = random.Random(2)
    vocab = target.config.vocab_size
    for size, rejected in [(600, 0), (600, 0), (600, 0), (5, 3), (1, 0), (3, 1), (1, 0)]:
        tokens = [rng.randrange(1000, vocab) for _ in range(size)]
        start = whole.get_seq_length()
        (a,), (b,) = (target.forward_batch([c], [tokens], [size]) for c in (windowed, whole))
        assert torch.equal(a, b), start
        for cache in (windowed, whole):
            cache.crop(start + size - rejected)
    assert windowed.layers[0].offset > 0  # its window: positions before it are gone


def test_a_windowed_draft_model_starts_again_where_its_window_is_gone(gemmas):
    """A draft model with windowed layers, asked to draft after tokens that part from its
    cache before the window it holds, feeds them again from the start: the same drafts as a
    fresh drafter's, and its cache in step."""
    from promptlookup.drafters import DraftModelDrafter

    def drafter():
        return DraftModelDrafter(gemmas[8], num_tokens=4, start_tokens=4, confidence_threshold=0)

    rng = random.Random(4)
    first = [rng.randrange(1, VOCAB) for _ in range(300)]
    used = drafter()
    for length in range(100, 301, 100):  # a sequence growing past its window
        used.propose(first[:length], 4)
    assert used.cache.layers[0].offset > 0  # its window only
    other = [*first[:50], *(rng.randrange(1, VOCAB) for _ in range(20))]  # parts at 50
    assert used.propose(other, 4) == drafter().propose(other, 4)
    assert used.cache.get_seq_length() == len(used.cached)
