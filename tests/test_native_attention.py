"""The native row-invariant attention kernel: each query row is computed by one formula,
whatever shares the call (other rows, other sequences, threads), and it is attention."""

from __future__ import annotations

import random

import pytest
import torch
from test_decoder_pass import _tiny

from promptlookup.backends.gguf import native_attention
from promptlookup.backends.gguf.decoder_pass import DecoderPass
from promptlookup.backends.gguf.native_attention import PassRows, kernel
from promptlookup.backends.hf.cache import GrowingLayer
from promptlookup.backends.hf.target import TorchTarget

pytestmark = pytest.mark.skipif(kernel() is None, reason="no C compiler on this machine")


def filled_layer(length: int, kv_heads: int, head_dim: int, dtype, generator) -> GrowingLayer:
    layer = GrowingLayer(transposed_keys=True)
    if length:
        layer.update(
            *(
                torch.randn(1, kv_heads, length, head_dim, generator=generator).to(dtype)
                for _ in range(2)
            )
        )
    return layer


def attend(query, keys, values, layers, starts, lengths):
    """Append each sequence's new keys and values (1, kv_heads, rows, head_dim; packed like the
    query's rows), one kernel call over them all, then crop them again."""
    first = 0
    for layer, n in zip(layers, lengths):
        layer.update(keys[:, :, first : first + n], values[:, :, first : first + n])
        first += n
    out = native_attention.native_attention(query, layers, PassRows(starts, lengths), 0.3)
    for layer, n in zip(layers, lengths):
        layer.crop(layer.get_seq_length() - n)
    return out  # (1, rows, heads, head_dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [8, 64, 96, 128])
@pytest.mark.parametrize("threads", [1, 2])
def test_rows_do_not_depend_on_what_shares_the_call(dtype, head_dim, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rng, generator = random.Random(head_dim), torch.Generator().manual_seed(head_dim)
        kv_heads, heads = 2, 6
        starts = [rng.randrange(0, 150) for _ in range(4)]
        layers = [filled_layer(start, kv_heads, head_dim, dtype, generator) for start in starts]
        # Up to 30 rows: a sequence's rows then span more than one task (24 rows of 3 query
        # heads each), and head size 96 ends in a partial chunk of the value sums.
        lengths = [rng.randint(1, 30) for _ in starts]
        total = sum(lengths)
        query = torch.randn(1, heads, total, head_dim, generator=generator).to(dtype)
        keys, values = (
            torch.randn(1, kv_heads, total, head_dim, generator=generator).to(dtype)
            for _ in range(2)
        )
        together = attend(query, keys, values, layers, starts, lengths)
        # Each sequence alone, in reverse order: each row as the last of a pass over its
        # sequence's rows up to it (a one-token pass when it is the first).
        offsets = [sum(lengths[:i]) for i in range(len(lengths))]
        for index in reversed(range(len(starts))):
            for row in range(lengths[index]):
                rows = slice(offsets[index], offsets[index] + row + 1)
                alone = attend(
                    query[:, :, rows],
                    keys[:, :, rows],
                    values[:, :, rows],
                    [layers[index]],
                    [starts[index]],
                    [row + 1],
                )
                assert torch.equal(alone[0, -1], together[0, rows.stop - 1]), (index, row)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_it_is_causal_attention(dtype):
    generator = torch.Generator().manual_seed(1)
    layer = filled_layer(70, 3, 64, dtype, generator)
    query = torch.randn(1, 9, 5, 64, generator=generator).to(dtype)
    new = torch.randn(1, 3, 5, 64, generator=generator).to(dtype)
    layer.update(new, new * 2)
    out = native_attention.native_attention(query, [layer], PassRows([70], [5]), 0.125)
    mask = torch.ones(5, 75, dtype=torch.bool).tril(70)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query.float(),
        layer.keys.float().repeat_interleave(3, 1),
        layer.values.float().repeat_interleave(3, 1),
        attn_mask=mask,
        scale=0.125,
    )
    tolerance = 2e-6 if dtype == torch.float32 else 2e-2
    assert torch.allclose(out.float(), expected.transpose(1, 2), atol=tolerance)


def test_without_the_kernel_passes_take_the_blas_path(monkeypatch):
    monkeypatch.setenv(native_attention.ENVIRONMENT, "0")
    monkeypatch.setattr(native_attention, "kernel", native_attention.kernel.__wrapped__)
    model = _tiny("llama", vocab_size=32, seed=0, layers=1)
    assert not DecoderPass(model).native_attention
    target = TorchTarget(model)
    assert target.row_invariant and not target.decoder_pass.native_attention
    target.extend([1, 2, 3])
    assert target.cache.layers[0].key_storage.stride(-1) == 1  # keys not transposed


def test_shapes_beyond_the_kernels_bounds_take_the_blas_path():
    assert native_attention.kernel_takes(9, 3, 64, torch.float32)
    assert native_attention.kernel_takes(9, 3, 64, torch.bfloat16)
    assert not native_attention.kernel_takes(9, 3, 64, torch.float16)
    assert not native_attention.kernel_takes(64, 2, 64, torch.float32)  # 32 heads per kv head
    assert not native_attention.kernel_takes(8, 8, 512, torch.float32)


def test_passes_use_the_kernel_and_transposed_keys_when_it_is_built():
    target = TorchTarget(_tiny("llama", vocab_size=32, seed=0, layers=1))
    assert target.decoder_pass.native_attention
    target.extend([1, 2, 3])
    layer = target.cache.layers[0]
    assert layer.key_buffer.shape[-2:] == (layer.key_buffer.shape[-2], layer.key_storage.shape[-2])
    assert layer.key_storage.shape[-1] == layer.key_buffer.shape[-2]  # (.., head_dim, capacity)
