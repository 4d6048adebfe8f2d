"""Attention that computes every query row as a one-token pass computes it.

A verification *forward pass* scores a draft of k tokens in one call; a one-token pass scores
one. For the draft never to change a token, row i of the k-token pass must equal, bit for bit,
what a one-token pass over the same cache would give. Kernels that block their work by the
number of rows (flash attention's query and key splits, a BLAS that takes a different path for
a short matrix, a softmax over a longer masked row) round differently, and a near-tie then
flips a greedy choice. :func:`row_invariant_attention` fixes the computation of each row:

- A query at position ``p`` attends over the keys ``[0, L)`` with ``L`` = ``p + 1`` rounded up
  to :data:`KEY_BLOCK`; the keys after ``p`` are masked (their buffer slots hold zeros or stale
  finite values, see :class:`~promptlookup.backends.hf.cache.GrowingLayer`). So a row's scores,
  softmax and weighted sum always run over the same length, whatever else is in the pass.
- Scores and the weighted sum are ``torch.bmm`` over each key/value head with its query heads
  folded into rows, padded to a multiple of :data:`ROW_TILE` rows: the BLAS then takes its
  blocked path for every pass, one token included.
- The softmax is computed in float32 (as transformers' eager attention does) and rounded to
  the activations' dtype before the weighted sum.

Rows of a pass that share ``L`` (all of a draft, unless it crosses a block boundary; a block of a
prompt chunk) go into one product. That a row's result does not depend on its place among the
rows of a product is a property of the BLAS, not of arithmetic, so it is checked once per
process on random data (:func:`batched_rows_are_invariant`); where it fails, every row is
computed alone, in the very call a one-token pass makes: exact by construction, and slower.
"""

from __future__ import annotations

import functools

import torch

from .native_build import bounds

#: Keys are attended in lengths rounded up to a multiple of this (a query block of a prompt
#: chunk shares its length too).
KEY_BLOCK = bounds()["KEY_BLOCK"]
#: Folded query rows of a product are padded to a multiple of this.
ROW_TILE = 8


def key_length(position: int) -> int:
    """The number of keys a query at ``position`` is computed over (keys after it masked).

    >>> key_length(0), key_length(63), key_length(64)
    (64, 64, 128)
    """
    return (position // KEY_BLOCK + 1) * KEY_BLOCK


def row_invariant_attention(
    query: torch.Tensor,
    key_buffer: torch.Tensor,
    value_buffer: torch.Tensor,
    start: int,
    scaling: float,
    rows_alone: bool | None = None,
    window: int = 0,
) -> torch.Tensor:
    """Causal attention of ``query`` (1, heads, n, head_dim), the tokens at positions
    ``start .. start + n - 1``, over ``key_buffer``/``value_buffer`` (1, kv_heads, capacity,
    head_dim; of any dtype, read as ``query``'s) with capacity >= ``key_length(start + n - 1)``.
    Returns (1, n, heads, head_dim).

    ``rows_alone``: compute each row in a product of its own (None: only if this machine's
    batched products were found to depend on the rows beside them). ``window``: a sliding
    window's length (a row sees its last ``window`` keys, the earlier ones masked; 0: all).
    """
    _, heads, n, head_dim = query.shape
    kv_heads = key_buffer.shape[1]
    groups = heads // kv_heads
    dtype = query.dtype
    if rows_alone is None:
        rows_alone = rows_alone_needed(dtype, head_dim, groups)
    scaled = (query[0] * scaling).view(kv_heads, groups, n, head_dim)  # a scaled copy
    output = query.new_empty(n, kv_heads, groups, head_dim)
    first = 0
    while first < n:
        length = key_length(start + first)
        stop = first + 1 if rows_alone else min(n, length - start)  # rows sharing `length`
        rows = stop - first
        folded = scaled[:, :, first:stop].reshape(kv_heads, groups * rows, head_dim)
        padded = -(-groups * rows // ROW_TILE) * ROW_TILE
        if padded != groups * rows:  # (kv_heads, padded, head_dim)
            folded = torch.cat(
                [folded, folded.new_zeros(kv_heads, padded - groups * rows, head_dim)], dim=1
            )
        keys = key_buffer[0, :, :length].to(dtype)  # (kv_heads, length, head_dim); a 16-bit
        # cache (see GrowingLayer) read exactly in the queries' dtype
        scores = torch.bmm(folded, keys.transpose(1, 2))  # (kv_heads, padded, length)
        positions = torch.arange(start + first, start + stop, device=query.device)
        keys_at = torch.arange(length, device=query.device)[None, :]
        hidden = keys_at > positions[:, None]
        if window:
            hidden |= keys_at <= positions[:, None] - window
        scores[:, : groups * rows].masked_fill_(hidden.repeat(groups, 1), float("-inf"))
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
        values = value_buffer[0, :, :length].to(dtype)  # (kv_heads, length, head_dim)
        attended = torch.bmm(weights, values)[:, : groups * rows]  # (kv_heads, g * rows, d)
        output[first:stop] = attended.view(kv_heads, groups, rows, head_dim).permute(2, 0, 1, 3)
        first = stop
    return output.view(1, n, heads, head_dim)


@functools.cache
def batched_rows_are_invariant(
    dtype: torch.dtype, head_dim: int, groups: int, threads: int | None = None
) -> bool:
    """Whether :func:`row_invariant_attention` over many rows gives, on this machine, the rows
    it gives one at a time, on random data: every draft-sized count of rows (1-16, and 17
    across a key block's end) and a prompt chunk's two blocks. Checked once per process,
    dtype, head size, query heads per key/value head and thread count."""
    del threads  # part of the cache key only: the BLAS splits rows among threads
    generator = torch.Generator().manual_seed(0)
    kv_heads, capacity = 2, 3 * KEY_BLOCK

    def sample(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)

    keys, values = sample(1, kv_heads, capacity, head_dim), sample(1, kv_heads, capacity, head_dim)
    shapes = [(100, n) for n in range(1, 17)] + [(KEY_BLOCK - 5, 17), (0, 2 * KEY_BLOCK)]
    for start, n in shapes:
        query = sample(1, groups * kv_heads, n, head_dim)
        batched = row_invariant_attention(query, keys, values, start, 0.125, rows_alone=False)
        alone = row_invariant_attention(query, keys, values, start, 0.125, rows_alone=True)
        if not torch.equal(batched, alone):
            return False
    return True


def rows_alone_needed(dtype: torch.dtype, head_dim: int, groups: int) -> bool:
    """Whether this process must compute attention rows one at a time (see above)."""
    return not batched_rows_are_invariant(dtype, head_dim, groups, torch.get_num_threads())
