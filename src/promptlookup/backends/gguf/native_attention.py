"""Row-invariant attention over every sequence of a pass in one call: a small C kernel.

:func:`~promptlookup.backends.gguf.row_invariant.row_invariant_attention` gets row invariance from a
BLAS by padding (whole key blocks, row tiles) and checks on random data that the BLAS keeps it;
it costs a dozen tensor operations per sequence per layer, which dominate a batched pass over
many short drafts. ``row_attention.c`` computes each query row by one fixed formula (see its
header): invariant by construction, whatever shares the call, and one call per layer for all
sequences of a pass.

It is compiled on first use with the machine's C compiler (``$CC``, else ``cc``; OpenMP, built
for this CPU; :mod:`~promptlookup.backends.gguf.native_build`) into the cache folder, keyed by its
source and headers, the flags and the CPU's features.
Where no compiler works (or ``PROMPTLOOKUP_NATIVE_ATTENTION=0``), :func:`kernel` is None and
passes use the BLAS path: exact too, slower. The choice is made once per process, never by
timing, so every pass of a process computes a row the same way.

Keys and values are cached in float32, bfloat16 or float16 (the cache's ``kv_dtype``, see
:class:`~promptlookup.backends.hf.cache.GrowingLayer`), whatever the queries' dtype: the kernel
reads each as float32 (exactly) and computes in float32.

Keys go into the cache transposed (``[kv_heads][head_dim][capacity]``, see
:class:`~promptlookup.backends.hf.cache.GrowingLayer`), so that the kernel reads a block of keys as
one vector per dimension.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from .native_build import bounds, compiled

#: Set to 0 to use the BLAS path (the kernel is not compiled or loaded).
ENVIRONMENT = "PROMPTLOOKUP_NATIVE_ATTENTION"

_POINTER = ctypes.c_void_p


@functools.cache
def kernel() -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot be built here (see the module doc)."""
    library = compiled(
        ["row_attention.c"],
        ENVIRONMENT,
        "row-invariant attention kernel; using the slower BLAS path",
    )
    if library is None:
        return None
    function = library.row_attention
    function.restype = ctypes.c_int
    function.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        _POINTER,
        _POINTER,
        ctypes.c_int64,
        _POINTER,
        _POINTER,
        _POINTER,
        _POINTER,
        _POINTER,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_float,
        ctypes.c_int64,
        ctypes.c_int,
    ]
    for name in ("half_round", "half_widen"):  # for the tests
        getattr(library, name).restype = None
        getattr(library, name).argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            _POINTER,
            _POINTER,
            ctypes.c_int64,
        ]
    return library


#: The kernels' element types (``native/bounds.h``), of queries and of cached keys and values.
ELEMENT_TYPES = {
    torch.float32: bounds()["ELEMENT_FLOAT32"],
    torch.bfloat16: bounds()["ELEMENT_BFLOAT16"],
    torch.float16: bounds()["ELEMENT_FLOAT16"],
}

#: The kernel's static bounds (``native/bounds.h``): query heads per key/value head, head size.
MAX_GROUP, MAX_DIM = bounds()["MAX_GROUP"], bounds()["MAX_DIM"]


def kernel_takes(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> bool:
    """Whether passes of this attention shape and activation dtype can run in the kernel (built
    here), over keys and values of any dtype of :data:`ELEMENT_TYPES`."""
    return (
        dtype in (torch.float32, torch.bfloat16)
        and kv_heads >= 1
        and heads % kv_heads == 0
        and heads // kv_heads <= MAX_GROUP
        and head_dim <= MAX_DIM
        and kernel() is not None
    )


class PassRows:
    """What every layer of one pass tells the kernel about its rows: each row's sequence and
    position (``row_sequence``, ``row_position``: int64 tensors kept alive for the calls)."""

    def __init__(self, starts: list[int], lengths: list[int]) -> None:
        sequence, position = [], []
        for index, (start, length) in enumerate(zip(starts, lengths)):
            sequence += [index] * length
            position += range(start, start + length)
        self.row_sequence = torch.tensor(sequence, dtype=torch.int64)
        self.row_position = torch.tensor(position, dtype=torch.int64)


def cache_pointers(layer) -> tuple[int, int, int]:
    """Where the kernels find one sequence's cache layer: the addresses of its keys (stored
    transposed) and values and its capacity in positions. A layer that holds positions from
    ``offset`` on (:class:`~promptlookup.backends.hf.window.WindowedLayer`) gives addresses
    ``offset`` positions before its buffers, so that position ``p`` is where the kernels
    look for it; they read only positions it holds (its passes' windows)."""
    values = layer.value_buffer  # (1, kv_heads, capacity, head_dim), contiguous
    shift = getattr(layer, "offset", 0) * values.element_size()
    return (
        layer.key_storage.data_ptr() - shift,  # keys [kv_heads][head_dim][capacity]
        values.data_ptr() - shift * values.shape[-1],  # values [kv_heads][capacity][head_dim]
        values.shape[-2],
    )


def native_attention(
    query: torch.Tensor, cache_layers: list, rows: PassRows, scaling: float, window: int = 0
) -> torch.Tensor:
    """Attention of ``query`` (1, heads, total, head_dim), the new rows of every sequence of a
    pass, each over its own ``cache_layers[i]`` (already holding this pass's keys and values,
    keys transposed), for a shape :func:`kernel_takes`; ``window``: a sliding window's length
    (each row sees its last ``window`` keys; 0: all). Returns (1, total, heads, head_dim)."""
    library = kernel()
    _, heads, total, head_dim = query.shape
    queries = query.transpose(1, 2)  # (1, total, heads, head_dim): the layout the kernel reads
    if not queries.is_contiguous():
        queries = queries.contiguous()
    out = torch.empty_like(queries)
    key_pointers, value_pointers, capacities = torch.tensor(
        [cache_pointers(layer) for layer in cache_layers], dtype=torch.int64
    ).T.contiguous()
    values = cache_layers[0].value_buffer  # (1, kv_heads, capacity, head_dim)
    kv_heads = values.shape[1]
    status = library.row_attention(
        ELEMENT_TYPES[query.dtype],
        ELEMENT_TYPES[values.dtype],
        queries.data_ptr(),
        out.data_ptr(),
        total,
        rows.row_sequence.data_ptr(),
        rows.row_position.data_ptr(),
        key_pointers.data_ptr(),
        value_pointers.data_ptr(),
        capacities.data_ptr(),
        heads,
        kv_heads,
        head_dim,
        scaling,
        window,
        torch.get_num_threads(),
    )
    if status != 0:
        raise MemoryError("row-invariant attention kernel: out of memory or an unchecked shape")
    return out
