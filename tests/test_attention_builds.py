"""The native attention kernel computes the same bits however it is built: for this CPU (its
vector paths: the softmax weights eight lanes at a time, the micro-kernels) and for a plain
x86-64 or any CPU with no vector extension beyond the baseline (every step the scalar C of the
formula in row_attention.c's header, fmaf in software), over long rows, sliding windows whose
first key falls inside a run of lanes, and every element type of keys and values."""

from __future__ import annotations

import platform

import pytest
import torch

from promptlookup.backends.gguf.native_attention import ELEMENT_TYPES, kernel
from promptlookup.backends.gguf.native_build import FLAGS, compiled

pytestmark = pytest.mark.skipif(kernel() is None, reason="no C compiler on this machine")

#: The package's flags with the CPU's own instructions taken away.
PORTABLE = tuple("-march=x86-64" if flag == "-march=native" else flag for flag in FLAGS) + (
    "-mno-fma",
)


@pytest.fixture(scope="module")
def builds():
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the portable build's flags are x86-64's")
    portable = compiled(["row_attention.c"], "PROMPTLOOKUP_NATIVE_ATTENTION", "", PORTABLE)
    if portable is None:
        pytest.skip("the portable build does not compile here")
    for library in (portable, kernel()):
        library.row_attention.restype = kernel().row_attention.restype
        library.row_attention.argtypes = kernel().row_attention.argtypes
    return kernel(), portable


def attend(library, query, keys, values, positions, window, scale=0.17):
    """One call over one sequence's cache: ``query`` (rows, heads, dim) float32, ``keys``
    (kv_heads, dim, capacity), ``values`` (kv_heads, capacity, dim), rows at ``positions``."""
    rows, heads, dim = query.shape
    out = torch.empty_like(query)
    sequence = torch.zeros(rows, dtype=torch.int64)
    key_pointer, value_pointer = torch.tensor([keys.data_ptr()]), torch.tensor([values.data_ptr()])
    capacity = torch.tensor([keys.shape[-1]])
    status = library.row_attention(
        ELEMENT_TYPES[torch.float32], ELEMENT_TYPES[keys.dtype], query.data_ptr(), out.data_ptr(),
        rows, sequence.data_ptr(), positions.data_ptr(), key_pointer.data_ptr(),
        value_pointer.data_ptr(), capacity.data_ptr(), heads, keys.shape[0], dim, scale, window, 2,
    )  # fmt: skip
    assert status == 0
    return out


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("dim", "window"), [(64, 0), (64, 77), (96, 0), (32, 150), (40, 33)])
@pytest.mark.parametrize(("kv_heads", "heads"), [(2, 6), (1, 5)])
def test_the_cpus_build_and_the_portable_build_give_the_same_bits(
    builds, kv_dtype, dim, window, kv_heads, heads
):
    # Groups of 3 and 5 query heads: tasks of 72 and 70 query vectors, the latter with some
    # beyond the six-wide kernels (the two-wide and one-wide ones take them).
    native, portable = builds
    generator = torch.Generator().manual_seed(dim + window)
    capacity = 384
    # Scores spread widely, so that some weights underflow (exp below -87) and some are 1.
    query = torch.randn(40, heads, dim, generator=generator) * 3
    keys = (torch.randn(kv_heads, dim, capacity, generator=generator) * 2).to(kv_dtype)
    values = torch.randn(kv_heads, capacity, dim, generator=generator).to(kv_dtype)
    # Rows late in a long cache and rows at its start, out of order, in one call.
    positions = torch.tensor(
        [*range(300, 330), *range(0, 5), 63, 64, 65, 200, 17], dtype=torch.int64
    )
    got = attend(native, query, keys, values, positions, window)
    expected = attend(portable, query, keys, values, positions, window)
    assert torch.isfinite(got).all()
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))
