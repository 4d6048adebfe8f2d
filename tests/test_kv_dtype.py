"""16-bit keys and values (``kv_dtype``): the quantized engine caches float16 by default, each
key and value rounded once as it is stored, so every guarantee holds against plain decoding
with the same ``kv_dtype``: rows of a pass are one-token passes' rows bit for bit, and drafts,
batching and the prefix cache never change a token. The kernel is attention over the rounded
keys and values (against a float32 reference), and its conversions are IEEE's (against
torch's, on the CPU's F16C instructions and in the portable C other CPUs run)."""

from __future__ import annotations

import random

import pytest
import torch
from _fixtures import one_thread  # noqa: F401 (fixture)
from click.testing import CliRunner
from conftest import TinyTokenizer
from test_decoder_pass import _tiny
from test_quantized import quantized_tiny

import promptlookup
from promptlookup.backends.gguf import native_attention, quantized_layers
from promptlookup.backends.gguf.decoder_pass import KV_DTYPES
from promptlookup.backends.gguf.native_attention import ELEMENT_TYPES, PassRows, kernel
from promptlookup.backends.hf.cache import GrowingLayer
from promptlookup.cli import main
from promptlookup.errors import InvalidParameterError
from promptlookup.prefix_cache import PrefixCache

pytestmark = pytest.mark.skipif(quantized_layers.kernel() is None, reason="no C compiler here")
HALVES = [torch.float16, torch.bfloat16]


def tiny_lm(seed: int = 1, kv_dtype: str = "auto", **options):
    return promptlookup.from_transformers(
        quantized_tiny(seed), TinyTokenizer(64), name="q", kv_dtype=kv_dtype, **options
    )


# -- the conversions ----------------------------------------------------------------------------


def _round(dtype, portable: bool, values: torch.Tensor) -> torch.Tensor:
    out = torch.empty(values.numel(), dtype=torch.int16)
    kernel().half_round(
        ELEMENT_TYPES[dtype], portable, values.data_ptr(), out.data_ptr(), values.numel()
    )
    return out


def _widen(dtype, portable: bool, bits: torch.Tensor) -> torch.Tensor:
    out = torch.empty(bits.numel(), dtype=torch.float32)
    kernel().half_widen(
        ELEMENT_TYPES[dtype], portable, bits.data_ptr(), out.data_ptr(), bits.numel()
    )
    return out


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("portable", [False, True])
def test_every_16_bit_value_widens_as_torch_widens_it(dtype, portable):
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    expected = bits.view(dtype).float()
    got = _widen(dtype, portable, bits)
    nan = expected.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(torch.int32), expected[~nan].view(torch.int32))


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("portable", [False, True])
def test_floats_round_to_16_bits_as_torch_rounds_them(dtype, portable):
    generator = torch.Generator().manual_seed(0)
    # Random bit patterns over every exponent (subnormal, overflow and zero included), the
    # exact ties between neighbouring 16-bit values, and the edges of float16's range.
    patterns = torch.randint(
        -(2**31), 2**31 - 1, (400_000,), generator=generator, dtype=torch.int64
    )
    randoms = patterns.to(torch.int32).view(torch.float32)
    halves = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype).float()
    finite = halves[halves.isfinite()].unique()
    ties = (finite[:-1] + (finite[1:] - finite[:-1]) / 2).float()  # exact for 16-bit values
    edges = torch.tensor([65504.0, 65519.99, 65520.0, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 0.0, -0.0])
    values = torch.cat([randoms, ties, edges, -edges, torch.tensor([float("inf"), float("nan")])])
    values = values[~values.isnan()].contiguous()  # NaNs: any quiet NaN will do
    assert torch.equal(_round(dtype, portable, values), values.to(dtype).view(torch.int16))


# -- the kernel -----------------------------------------------------------------------------------


def filled_layer(length, kv_heads, head_dim, kv_dtype, generator) -> GrowingLayer:
    layer = GrowingLayer(transposed_keys=True, kv_dtype=kv_dtype)
    if length:
        layer.update(
            *(torch.randn(1, kv_heads, length, head_dim, generator=generator) for _ in range(2))
        )
    return layer


@pytest.mark.parametrize("kv_dtype", HALVES)
@pytest.mark.parametrize("query_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [0, 50])
def test_the_kernel_is_float32_attention_over_the_rounded_keys_and_values(
    kv_dtype, query_dtype, window
):
    generator = torch.Generator().manual_seed(2)
    layer = filled_layer(130, 2, 96, kv_dtype, generator)
    assert layer.key_storage.dtype == layer.value_buffer.dtype == kv_dtype
    query = torch.randn(1, 6, 7, 96, generator=generator).to(query_dtype)
    new = torch.randn(1, 2, 7, 96, generator=generator) * 4
    layer.update(new, new - 1)
    out = native_attention.native_attention(query, [layer], PassRows([130], [7]), 0.1, window)
    assert out.dtype == query_dtype
    # The reference: keys and values rounded to 16 bits by torch, then float32 attention.
    keys = torch.cat([layer.keys[:, :, :130], new.to(kv_dtype)], dim=2).float()
    values = torch.cat([layer.values[:, :, :130], (new - 1).to(kv_dtype)], dim=2).float()
    assert torch.equal(layer.keys.float(), keys) and torch.equal(layer.values.float(), values)
    mask = torch.ones(7, 137, dtype=torch.bool).tril(130)
    if window:
        mask &= ~torch.ones(7, 137, dtype=torch.bool).tril(130 - window)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query.float(), keys.repeat_interleave(3, 1), values.repeat_interleave(3, 1),
        attn_mask=mask, scale=0.1,
    ).transpose(1, 2)  # fmt: skip
    tolerance = 2e-6 if query_dtype == torch.float32 else 3e-2
    assert torch.allclose(out.float(), expected, atol=tolerance * expected.abs().max())


@pytest.mark.parametrize("kv_dtype", HALVES)
def test_kernel_rows_do_not_depend_on_what_shares_the_call(kv_dtype):
    generator = torch.Generator().manual_seed(3)
    starts, lengths = [40, 0, 70], [9, 5, 17]
    layers = [filled_layer(start, 3, 64, kv_dtype, generator) for start in starts]
    query = torch.randn(1, 9, sum(lengths), 64, generator=generator)
    states = torch.randn(1, 3, sum(lengths), 64, generator=generator)
    first = 0
    for layer, n in zip(layers, lengths):
        layer.update(states[:, :, first : first + n], -states[:, :, first : first + n])
        first += n
    together = native_attention.native_attention(query, layers, PassRows(starts, lengths), 0.2)
    first = 0
    for layer, start, n in zip(layers, starts, lengths):
        for row in range(n):  # each row alone, as a one-token pass at its position
            alone = native_attention.native_attention(
                query[:, :, first + row : first + row + 1],
                [layer],
                PassRows([start + row], [1]),
                0.2,
            )
            assert torch.equal(alone[0, 0], together[0, first + row])
        first += n


# -- whole passes and generation --------------------------------------------------------------------


def test_the_quantized_engine_caches_float16_by_default_and_float32_on_request():
    lm = tiny_lm()
    assert lm.target.kv_dtype == torch.float16
    lm.target.forward([1, 2, 3])
    layer = lm.target.cache.layers[0]
    assert layer.key_storage.dtype == layer.value_buffer.dtype == torch.float16
    wide = tiny_lm(kv_dtype="float32").target
    assert wide.kv_dtype == torch.float32
    assert wide.kv_bytes_per_token == 2 * lm.target.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4
    # float32 models keep their own dtype unless asked (their reference is transformers').
    assert promptlookup.from_transformers(
        _tiny("llama", 32, 0, 1), TinyTokenizer(32)
    ).target.kv_dtype == (torch.float32)


def test_a_kv_dtype_is_checked_and_needs_our_row_invariant_passes():
    with pytest.raises(InvalidParameterError, match="kv_dtype must be"):
        tiny_lm(kv_dtype="float8")
    with pytest.raises(InvalidParameterError, match="row-invariant passes"):
        tiny_lm(kv_dtype="float16", row_invariant=False)
    assert tiny_lm(kv_dtype="float32", row_invariant=False).target.kv_dtype == torch.float32
    with pytest.raises(InvalidParameterError, match="kv_dtype must be"):
        promptlookup.load_model("no-such-model.gguf", kv_dtype="half")  # before any load


@pytest.mark.parametrize("kv_dtype", [*KV_DTYPES])
@pytest.mark.parametrize("one_call", [True, False])
def test_every_row_of_a_pass_is_a_one_token_passs_row(kv_dtype, one_call):
    """Passes of 1 to 20 tokens after a prompt, with rejected drafts cropped, in the layers'
    one C call and layer by layer in Python (torch rounds what that path stores)."""
    target = promptlookup.from_transformers(
        quantized_tiny(5), TinyTokenizer(64), kv_dtype=kv_dtype
    ).target
    if not one_call:
        target.decoder_pass.quantized_layers = None
    prompt = [(7 * i) % 64 for i in range(70)]  # the first pass ends past a key block
    target.forward(prompt)
    start = target.cache_length
    steps = [(5 * i + 3) % 64 for i in range(20)]
    alone = torch.cat([target.forward([token]) for token in steps])
    for count in (2, 5, 9, 17, 20):
        target.crop(start)
        target.forward([1, 2, 3])  # a rejected draft, cropped: its slots hold stale values
        target.crop(start)
        assert torch.equal(target.forward(steps[:count]), alone[:count]), count


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    phrase = [rng.randrange(1, 64) for _ in range(12)]
    return [[*phrase * 4, *(rng.randrange(1, 64) for _ in range(n))] for n in (1, 7, 20)]


@pytest.mark.parametrize("kv_dtype", ["float16", "bfloat16"])
def test_drafts_and_batches_give_plain_decodings_tokens_with_the_same_kv_dtype(kv_dtype):
    lm = tiny_lm(2, kv_dtype)
    prompts = _prompts(2)
    plain = [lm.generate(p, max_new_tokens=40, drafter="none").token_ids for p in prompts]
    drafted = 0
    for prompt, expected in zip(prompts, plain):
        for num_tokens in (1, 4, 11):
            result = lm.generate(
                prompt, max_new_tokens=40, speculation="fixed", num_tokens=num_tokens
            )
            assert result.token_ids == expected, num_tokens
            drafted += result.stats.drafted_tokens
    assert drafted > 0  # passes of many rows ran
    batched = lm.generate_batch(prompts, max_new_tokens=40, max_batch=2)
    assert [r.token_ids for r in batched] == plain


def test_the_prefix_cache_holds_16_bit_blocks_and_changes_no_token():
    lm = tiny_lm(3)
    prompts = _prompts(3)
    plain = [
        lm.generate(p, max_new_tokens=30, drafter="none", prefix_cache=False).token_ids
        for p in prompts
    ]
    cache = PrefixCache(mib=16, block_tokens=16)
    cached = [lm.generate(p, max_new_tokens=30, prefix_cache=cache) for p in prompts]
    assert [r.token_ids for r in cached] == plain
    assert cached[-1].stats.cached_tokens >= 48  # the shared phrase, in whole blocks
    # Every block the cache holds is float16 (no float32 copy), within what it counts (blocks
    # held in place: their buffers, each storage once).
    held = [tensor for tensor in _tensors(cache) if tensor.numel()]
    assert held and {tensor.dtype for tensor in held} == {torch.float16}
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}
    assert sum(storages.values()) <= cache.used_bytes
    # Restored keys and values are the stored ones, bit for bit.
    sequence, restored = lm.target.new_sequence(), lm.target.new_sequence()
    lm.target.forward_batch([sequence], [prompts[0]], [0])
    fresh = PrefixCache(mib=4, block_tokens=16)
    fresh.store(lm.target, sequence, prompts[0])
    assert fresh.restore(lm.target, restored, prompts[0]) == len(prompts[0])
    for before, after in zip(sequence.layers, restored.layers):
        assert after.keys.dtype == torch.float16 and torch.equal(after.keys, before.keys)
        assert torch.equal(after.values, before.values)


def _tensors(root) -> list[torch.Tensor]:
    """The floating-point tensors reachable from ``root`` through attributes and containers."""
    found, seen, todo = [], set(), [root]
    while todo:
        item = todo.pop()
        if id(item) in seen or isinstance(item, (str, bytes, int, float, type)):
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            found += [item] if item.is_floating_point() else []
        elif isinstance(item, dict):
            todo += [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple, set, frozenset)):
            todo += list(item)
        elif hasattr(item, "__dict__") and not callable(item):
            todo += list(vars(item).values())
        elif hasattr(item, "__slots__"):
            todo += [getattr(item, name, None) for name in item.__slots__]
    return found


def test_a_prefix_cache_holds_one_kv_dtype():
    cache = PrefixCache(mib=4, block_tokens=16)
    narrow, wide = tiny_lm(4).target, tiny_lm(4, "float32").target
    sequence = narrow.new_sequence()
    narrow.forward_batch([sequence], [list(range(1, 40))], [0])
    cache.store(narrow, sequence, list(range(1, 40)))
    with pytest.raises(InvalidParameterError):
        cache.restore(wide, wide.new_sequence(), list(range(1, 40)))


def test_the_commands_take_kv_dtype():
    for command in ("generate", "serve"):
        result = CliRunner().invoke(main, [command, "--help"])
        assert "--kv-dtype" in result.output and "float16" in result.output
    result = CliRunner().invoke(main, ["generate", "--kv-dtype", "float8", "hi"])
    assert result.exit_code == 2 and "float8" in result.output
    choices = next(p for p in main.commands["generate"].params if p.name == "kv_dtype").type.choices
    assert sorted(choices) == sorted(["auto", *KV_DTYPES])


@pytest.mark.slow
def test_the_default_model_caches_float16_and_drafts_give_plain_decodings_tokens(default_lm):
    target = default_lm.target
    assert target.kv_dtype == torch.float16
    assert target.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2  # 22.5 KiB; llama.cpp's float16
    prompt = default_lm.encode(
        [{"role": "user", "content": "Repeat this list twice: apple, pear, plum, fig, lime."}]
    )
    plain = default_lm.generate(prompt, max_new_tokens=48, drafter="none").token_ids
    result = default_lm.generate(prompt, max_new_tokens=48, speculation="fixed")
    assert result.token_ids == plain and result.stats.drafted_tokens > 0
