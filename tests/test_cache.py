"""GrowingLayer holds what transformers' DynamicLayer holds, through any appends and crops."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.cache_utils import DynamicLayer

from promptlookup.backends.hf.cache import GrowingLayer, growing_cache

# Each step appends `new` tokens, then removes `drop` of the newest (as after rejected drafts).
steps = st.lists(st.tuples(st.integers(1, 300), st.integers(0, 300)), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)
@given(steps)
def test_growing_layer_matches_dynamic_layer(ops):
    generator = torch.Generator().manual_seed(len(ops))
    growing, reference = GrowingLayer(), DynamicLayer()
    for new, drop in ops:
        keys = torch.randn(1, 2, new, 4, generator=generator)
        values = torch.randn(1, 2, new, 4, generator=generator)
        got_keys, got_values = growing.update(keys, values)
        want_keys, want_values = reference.update(keys, values)
        assert torch.equal(got_keys, want_keys) and torch.equal(got_values, want_values)
        drop = min(drop, reference.get_seq_length())
        growing.crop(growing.get_seq_length() - drop)
        reference.crop(-drop)  # transformers' own layer: a count to remove
        assert growing.get_seq_length() == reference.get_seq_length()
        if reference.get_seq_length():
            assert torch.equal(growing.keys, reference.keys)
            assert torch.equal(growing.values, reference.values)


def test_appending_writes_into_spare_room_without_reallocating():
    layer = GrowingLayer()
    layer.update(torch.zeros(1, 1, 10, 2), torch.zeros(1, 1, 10, 2))
    buffer = layer.key_buffer
    layer.update(torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2))
    assert layer.key_buffer is buffer and layer.get_seq_length() == 13
    assert layer.keys.data_ptr() == buffer.data_ptr()


def test_crop_keeps_a_length_refuses_a_negative_one_and_reset_empties():
    layer = GrowingLayer()
    layer.update(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2))
    with pytest.raises(ValueError):
        layer.crop(-2)
    layer.crop(6)  # longer than the layer: nothing to drop
    assert layer.get_seq_length() == 4
    layer.crop(2)
    assert layer.get_seq_length() == 2
    layer.reset()
    assert layer.get_seq_length() == 0


def test_growing_cache_gives_the_model_the_same_logits():
    from transformers import DynamicCache

    model = tiny_llama(seed=6)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    outputs = []
    for cache in (growing_cache(model.config), DynamicCache(config=model.config)):
        with torch.inference_mode():
            model(input_ids=ids[:, :5], cache=cache, use_cache=True)
            # Keep 3 of the 5 tokens (transformers' own layers take a count to remove).
            cache.crop(3 if type(cache.layers[0]) is GrowingLayer else -2)
            outputs.append(model(input_ids=ids[:, 3:], cache=cache, use_cache=True).logits)
    assert all(type(layer) is GrowingLayer for layer in growing_cache(model.config).layers)
    assert torch.equal(outputs[0], outputs[1])
