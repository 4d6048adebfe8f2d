"""A quantized model's layers in one C call (``quantized_layers.c``): each row of a pass is
computed bit for bit as a one-token pass computes it, whatever shares the pass (rows of the
same sequence, other sequences, a prompt chunk) and on any thread count; and the values are
those of the same layers run one by one in Python, up to rounding."""

from __future__ import annotations

import pytest
import torch
from conftest import TinyTokenizer
from test_quantized import quantized_tiny

import promptlookup
from promptlookup.backends.gguf import quantized_layers

pytestmark = pytest.mark.skipif(quantized_layers.kernel() is None, reason="no C compiler here")


def tiny_target(seed: int = 0):
    target = promptlookup.from_transformers(quantized_tiny(seed), TinyTokenizer(64)).target
    assert target.decoder_pass.quantized_layers is not None  # the layers run in one call
    return target


def test_the_layers_compute_what_the_python_layers_compute():
    target = tiny_target()
    tokens = [3, 9, 27, 5, 60, 1, 7, 7, 2, 40]
    in_c = target.forward(tokens)
    layers, target.decoder_pass.quantized_layers = target.decoder_pass.quantized_layers, None
    target.reset()
    in_python = target.forward(tokens)
    target.decoder_pass.quantized_layers = layers
    # Norms and SiLU round differently from torch's; every product is the same kernel's.
    assert torch.allclose(in_c, in_python, rtol=0, atol=1e-5 * in_python.abs().max())


@pytest.mark.parametrize("threads", [1, 2])
def test_every_row_of_a_pass_is_a_one_token_passs_row(threads):
    """Passes of 1 to 20 tokens (a prompt chunk from 16 rows takes the buffered products)
    after a prompt, with rejected drafts cropped, equal one-token passes bit for bit."""
    torch.set_num_threads(threads)
    target = tiny_target(1)
    prompt = [(7 * i) % 64 for i in range(30)]
    target.forward(prompt)
    start = target.cache_length
    steps = [(5 * i + 3) % 64 for i in range(20)]
    alone = torch.cat([target.forward([token]) for token in steps])
    for count in (2, 3, 5, 8, 9, 16, 17, 20):
        target.crop(start)
        target.forward([1, 2, 3])  # a rejected draft, cropped: its slots hold stale values
        target.crop(start)
        assert torch.equal(target.forward(steps[:count]), alone[:count]), count


def test_sequences_sharing_a_pass_get_their_own_rows():
    prompts = [[1, 2, 3, 4, 5, 6], [9, 8, 7], [60, 61, 62, 63, 1, 2, 3, 4, 5, 6, 7]]
    assert_sequences_get_their_own_rows(tiny_target(2), prompts)


def assert_sequences_get_their_own_rows(target, prompts: list[list[int]]) -> None:
    """Three sequences' drafts in one pass: each gets the rows of its one-token passes."""
    drafts = [[10, 11, 12], [13], [14, 15, 16, 17, 18]]
    alone = []
    for prompt, draft in zip(prompts, drafts):
        target.reset()
        target.forward(prompt)
        alone.append(torch.cat([target.forward([token]) for token in draft]))
    caches = [target.new_sequence() for _ in prompts]
    target.forward_batch(caches, prompts, [1, 1, 1])
    batched = target.forward_batch(caches, drafts, [len(d) for d in drafts])
    for expected, got in zip(alone, batched):
        assert torch.equal(got, expected)


def test_a_cache_that_grows_between_passes_keeps_its_keys_and_values():
    """Single steps across the cache's first capacity (256 positions, then grown and
    copied) give the rows of one pass over the same tokens, which never grew."""
    target = tiny_target(3)
    tokens = [(11 * i + 5) % 64 for i in range(262)]
    whole = target.forward(tokens)[-8:]
    target.reset()
    target.forward(tokens[:-8])
    assert torch.equal(torch.cat([target.forward([token]) for token in tokens[-8:]]), whole)


def test_a_pass_longer_than_a_slice_gives_the_rows_of_shorter_passes():
    """A pass over more rows than the kernel takes at once (SLICE_ROWS, 512: its rows go
    through the layers in slices) gives each row's bits as passes of a few hundred rows do,
    for one sequence and for two sharing the pass."""
    target = tiny_target(4)
    tokens = [(13 * i + 7) % 64 for i in range(1100)]
    whole = target.forward(tokens)
    target.reset()
    pieces = [target.forward(tokens[start : start + 300]) for start in range(0, 1100, 300)]
    assert torch.equal(torch.cat(pieces), whole)
    target.reset()
    other = target.forward(tokens[500:])
    caches = [target.new_sequence(), target.new_sequence()]
    first, second = target.forward_batch(caches, [tokens[:700], tokens[500:]], [700, 600])
    assert torch.equal(first, whole[:700]) and torch.equal(second, other)
