"""A key/value cache that appends in place: each forward pass copies only its new tokens.

transformers' ``DynamicLayer`` appends by ``torch.cat``, copying a layer's whole cache in
every layer on every forward pass (about 15% of a one-token pass of SmolLM2-135M after a
2,000-token prompt on CPU). :class:`GrowingLayer` keeps the keys and values in buffers with
spare room, growing by a quarter when full, and hands attention a view of the filled part;
cropping after rejected draft tokens only moves the end. Attention sees the same numbers
either way.

Capacity is a multiple of :data:`~promptlookup.backends.gguf.row_invariant.KEY_BLOCK`, zeroed
past the positions being written: row-invariant attention reads whole key blocks past a
sequence's end (masked), so the slots there must hold finite values (zeros, or a rejected
draft's keys and values).

The buffers hold ``kv_dtype`` (None: the states' own dtype): float16 or bfloat16 halve a
float32 model's cache. Each key and value is rounded (to nearest even) as it is stored, by
itself, so what a token's keys and values hold never depends on the pass that computed them;
whoever reads them converts them back exactly (the native kernel does, as it reads them).

With ``transposed_keys`` the keys are stored ``(batch, kv_heads, head_dim, capacity)``
(``key_storage``), the layout :mod:`~promptlookup.backends.gguf.native_attention` reads;
``key_buffer`` is then a transposed view of it, so everything else sees the usual shape.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ...prefix_disk import bits
from ..gguf.row_invariant import KEY_BLOCK

#: Room for this many tokens is reserved at first (or for the first pass's tokens, if more).
MIN_CAPACITY = 256
#: A full buffer grows by 1 / GROWTH of its size (or to the pass's need): a quarter wastes at
#: most a fifth of the room (doubling: half; Gemma 3 270M holds 36 KiB a token in float32)
#: for a copy of the cache every quarter more tokens, a small cost beside the passes between.
GROWTH = 4
#: Blocks :meth:`GrowingCache.read_blocks` copies out of the layers at a time.
COPY_BLOCKS = 16


class GrowingLayer(DynamicLayer):
    """A :class:`~transformers.cache_utils.DynamicLayer` over buffers of shape
    ``(batch, kv_heads, capacity, head_dim)``; ``keys``/``values`` are views of the first
    ``length`` positions, in ``kv_dtype`` (None: the states' dtype)."""

    def __init__(self, transposed_keys: bool = False, kv_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.transposed_keys, self.kv_dtype = transposed_keys, kv_dtype

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.key_buffer = self.value_buffer = self.key_storage = None
        self.length = 0

    def _reserve(self, needed: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        capacity = 0 if self.key_buffer is None else self.key_buffer.shape[-2]
        if needed <= capacity:
            return
        wanted = max(needed, capacity + capacity // GROWTH, MIN_CAPACITY)
        capacity = -(-wanted // KEY_BLOCK) * KEY_BLOCK
        buffers = []
        for old, new in ((self.key_buffer, key_states), (self.value_buffer, value_states)):
            transposed = self.transposed_keys and new is key_states
            shape = (capacity, new.shape[-1]) if not transposed else (new.shape[-1], capacity)
            storage = new.new_empty(*new.shape[:-2], *shape, dtype=self.kv_dtype or new.dtype)
            buffer = storage.transpose(-1, -2) if transposed else storage
            if old is not None:
                buffer[..., : self.length, :] = old[..., : self.length, :]
            # Positions up to ``needed`` are written by the caller next; the rest start zeroed.
            buffer[..., needed:, :].zero_()
            buffers.append((storage, buffer))
        (self.key_storage, self.key_buffer), (_, self.value_buffer) = buffers

    # keys and values: views of the filled part of the buffers, made when asked (a pass of the
    # one-call quantized layers appends to every layer and reads none of them).
    @property
    def keys(self):
        buffer = getattr(self, "key_buffer", None)
        return self._keys if buffer is None else buffer[..., : self.length, :]

    @keys.setter
    def keys(self, value) -> None:  # DynamicLayer's own assignments, before the buffers exist
        self._keys = value

    @property
    def values(self):
        buffer = getattr(self, "value_buffer", None)
        return self._values if buffer is None else buffer[..., : self.length, :]

    @values.setter
    def values(self, value) -> None:
        self._values = value

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        self._reserve(end, key_states, value_states)
        self.key_buffer[..., self.length : end, :] = key_states
        self.value_buffer[..., self.length : end, :] = value_states
        self.length = end
        return self.keys, self.values

    def make_room(self, count: int, like: torch.Tensor) -> None:
        """Room for ``count`` more positions, for a kernel that writes them itself (``like``:
        an empty tensor of the states' dtype, batch, heads and head size); :meth:`advance`
        then counts them."""
        if self.is_initialized and self.key_buffer is not None:
            if self.length + count <= self.key_buffer.shape[-2]:
                return  # room enough
        values_like = like.new_empty(like.shape)  # _reserve tells keys from values by identity
        if not self.is_initialized:
            self.lazy_initialization(like, values_like)
        self._reserve(self.length + count, like, values_like)

    def advance(self, count: int) -> None:
        """Count ``count`` positions written into the room :meth:`make_room` made."""
        self.length += count

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions (every ``crop`` of ours takes a length, not
        transformers' negative count of positions to remove)."""
        if length < 0:
            raise ValueError(f"GrowingLayer.crop takes a length to keep, got {length}")
        if self.is_initialized:
            self.length = min(self.length, length)

    def reset(self) -> None:
        self.key_buffer = self.value_buffer = self.key_storage = None
        self.length = 0
        super().reset()

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("GrowingLayer holds one sequence")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("GrowingLayer holds one sequence")


class SharedBlock:
    """Positions ``start`` to ``stop - 1`` of every layer of ``storage`` (a
    :class:`GrowingCache`) in place: views of its buffers, no copy
    (:meth:`GrowingCache.share_blocks`). It reads the buffers the cache has when read, so it
    follows them when they grow."""

    __slots__ = ("storage", "start", "stop")

    def __init__(self, storage: GrowingCache, start: int, stop: int) -> None:
        self.storage, self.start, self.stop = storage, start, stop

    def rows(self, layer: int, kind: int) -> torch.Tensor:
        """Layer ``layer``'s keys (``kind`` 0) or values (1): (kv_heads, stop - start, dim)."""
        cache_layer = self.storage.layers[layer]
        buffer = cache_layer.value_buffer if kind else cache_layer.key_buffer
        return buffer[0, :, self.start : self.stop]

    def copy(self) -> torch.Tensor:
        """The block in its own storage, as :meth:`GrowingCache.read_blocks` gives one."""
        return self.storage.read_blocks(self.start, self.stop, self.stop - self.start)[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.storage.layers[0].key_buffer.dtype

    def bits(self) -> np.ndarray:
        """The block's bits, ``(layers, 2, kv_heads, stop - start, head_dim)`` integers of its
        dtype's width, copied by numpy alone, for the disk tier's writer thread (see
        :func:`promptlookup.prefix_disk.bits` for why not by torch)."""
        layers = range(len(self.storage.layers))
        return np.stack([np.stack([bits(self.rows(layer, kind)) for kind in (0, 1)])
                         for layer in layers])  # fmt: skip


def _rows(block, layer: int, kind: int) -> torch.Tensor:
    """(kv_heads, positions, dim) of a block, a tensor or a :class:`SharedBlock`."""
    return block.rows(layer, kind) if isinstance(block, SharedBlock) else block[layer, kind]


class GrowingCache(DynamicCache):
    """One sequence's cache of :class:`GrowingLayer` layers (all of the same head shape), which
    hands out and takes in its keys and values as *blocks* for a prefix cache
    (:class:`~promptlookup.backends.base.BlockCache`): a block is positions ``start`` to
    ``stop - 1`` of every layer, one tensor ``(layers, 2, kv_heads, stop - start, head_dim)``
    (keys, then values) in the buffers' dtype, whatever it is, in its own storage; or, held
    once, a :class:`SharedBlock` of its own positions in place
    (:class:`~promptlookup.backends.base.SharingBlockCache`)."""

    #: Positions that shared blocks hold in place: never rewritten (cropping below is an error)
    #: until :meth:`resume`.
    frozen = 0

    @property
    def held_bytes(self) -> int:
        """Bytes its layers' buffers take now (spare room included)."""
        buffers = [
            buffer
            for layer in self.layers
            for buffer in (getattr(layer, "key_buffer", None), getattr(layer, "value_buffer", None))
            if buffer is not None
        ]
        return sum(buffer.untyped_storage().nbytes() for buffer in buffers)

    def share_blocks(self, start: int, stop: int, block_tokens: int) -> list[SharedBlock]:
        """Positions ``start`` to ``stop - 1`` as :class:`SharedBlock` blocks of
        ``block_tokens`` positions (the last one shorter where the span is not a multiple),
        in place; the first ``stop`` positions are never rewritten from now on."""
        self.frozen = max(self.frozen, stop)
        return [
            SharedBlock(self, first, min(first + block_tokens, stop))
            for first in range(start, stop, block_tokens)
        ]

    def resume(self, length: int) -> None:
        """Keep the first ``length`` positions, the only ones shared blocks hold now, and let
        a new sequence write after them."""
        self.frozen = length
        self.crop(length)

    def crop(self, max_length: int) -> None:
        if max_length < self.frozen:
            raise ValueError(
                f"cropping to {max_length} positions would rewrite {self.frozen} held in place"
            )
        super().crop(max_length)

    def read_blocks(self, start: int, stop: int, block_tokens: int) -> list[torch.Tensor]:
        """Positions ``start`` to ``stop - 1`` as blocks of ``block_tokens`` positions, the
        last one shorter where ``stop - start`` is not a multiple; copied out
        :data:`COPY_BLOCKS` at a time, so that a long sequence needs little memory besides."""
        size, keys, blocks = block_tokens, self.layers[0].keys, []
        layers, kv_heads, head_dim = len(self.layers), keys.shape[1], keys.shape[3]
        whole = start + (stop - start) // size * size  # the end of the whole blocks
        for first in range(start, whole, COPY_BLOCKS * size):
            count = min(COPY_BLOCKS, (whole - first) // size)
            part = keys.new_empty((count, layers, 2, kv_heads, size, head_dim))
            for index, layer in enumerate(self.layers):
                for kind, states in enumerate((layer.keys, layer.values)):
                    rows = states[0, :, first : first + count * size]  # (kv_heads, n, head_dim)
                    part[:, index, kind] = rows.unflatten(1, (count, size)).transpose(0, 1)
            blocks += [block.clone() for block in part]  # each in its own storage
        if stop > whole:  # the last, shorter block
            part = keys.new_empty((layers, 2, kv_heads, stop - whole, head_dim))
            for index, layer in enumerate(self.layers):
                for kind, states in enumerate((layer.keys, layer.values)):
                    part[index, kind] = states[0, :, whole:stop]
            blocks.append(part)
        return blocks

    @torch.inference_mode()  # the buffers a forward pass made are inference tensors
    def write_prefix(self, blocks: Iterable, length: int) -> None:
        """Fill this cache's next positions, up to ``length``, with the positions that
        ``blocks`` hold one after another (the last block possibly in part), as
        :meth:`read_blocks` or :meth:`share_blocks` gave them: an empty cache's first ones.
        ``blocks`` may be read as they come (a prefix cache's read-back from disk): the
        buffers are sized once, for ``length`` and a quarter more of room for the tokens
        that follow (those of a new turn: no regrowth copy right after), and each block is
        written and let go before the next; where they end early, the cache ends there."""
        have, blocks = self.get_seq_length(), iter(blocks)
        first = next(blocks, None)
        if first is None:
            return
        rows = _rows(first, 0, 1)  # (kv_heads, block_tokens, head_dim)
        like = rows.new_empty((1, rows.shape[0], 0, rows.shape[2]))  # (1, kv_heads, 0, dim)
        room = length + (length - have) // GROWTH  # the prefix, then the next tokens'
        for layer in self.layers:
            layer.make_room(room - have, like)
        step = rows.shape[1]
        blocks, first, rows = prepended(first, blocks), None, None  # held by none
        layers = [(index, layer, have) for index, layer in enumerate(self.layers)]
        end = write_blocks(blocks, layers, have, length)
        for layer in self.layers:
            for buffer in (layer.key_buffer, layer.value_buffer):
                zero(buffer[0], end, room, step)  # finite past the end: kernels read whole blocks
            layer.advance(end - have)


def prepended(first, rest: Iterator) -> Iterator:
    """``first``, then ``rest``; ``first`` let go once the next is asked for (an
    ``itertools.chain`` holds it to its end)."""
    yield first
    del first
    yield from rest


def write_blocks(blocks: Iterator, layers: list, have: int, length: int) -> int:
    """Write positions ``have`` to ``length - 1`` of ``blocks`` (one after another from
    position ``have``; the last possibly in part) into ``layers``: ``(row, layer, low)``, the
    block's row ``row`` into ``layer``'s buffers (sized for ``length``, position ``p`` at
    ``p - layer.offset``) from position ``low`` on, where the block has that row. Each block
    is let go before the next is asked for; returns the end reached (``length`` unless the
    blocks end early: then the buffers past it are zeroed, finite for the kernels)."""
    begin = have
    for block in blocks:
        stop = min(begin + _rows(block, 0, 1).shape[1], length)
        for row, layer, low in layers:
            start, shift = max(begin, low), getattr(layer, "offset", 0)
            if start < stop and (isinstance(block, SharedBlock) or row < block.shape[0]):
                for kind, buffer in enumerate((layer.key_buffer, layer.value_buffer)):
                    rows = _rows(block, row, kind)  # (kv_heads, block_tokens, head_dim)
                    buffer[0, :, start - shift : stop - shift] = rows[
                        :, start - begin : stop - begin
                    ]
        rows = block = None  # let go (a view holds its block) before the next is read
        begin = stop
        if begin >= length:
            break
    if begin < length:  # ended early
        for _, layer, low in layers:
            shift = getattr(layer, "offset", 0)
            for buffer in (layer.key_buffer, layer.value_buffer):
                zero(buffer[0], max(begin, low) - shift, length - shift, KEY_BLOCK)
    return begin


def zero(buffer: torch.Tensor, start: int, stop: int, step: int) -> None:
    """Zero positions ``start`` to ``stop - 1`` of ``buffer`` (kv_heads, capacity, head_dim)
    ``step`` positions at a time: each piece small enough for one thread (a parallel fill
    waits for torch's other threads, about 10 ms on a busy machine: 0.7 s for a read-back's
    room left after 5,000 tokens of the default model, where a block at a time takes 20 ms)."""
    for first in range(start, stop, step):
        buffer[:, first : min(first + step, stop)].zero_()


def growing_cache(
    config, transposed_keys: bool = False, kv_dtype: torch.dtype | None = None
) -> GrowingCache:
    """``DynamicCache(config=config)`` with each plain ``DynamicLayer`` made a :class:`GrowingLayer`
    (sliding-window and other special layers stay as transformers makes them)."""
    cache = GrowingCache(config=config)
    cache.layers = [
        GrowingLayer(transposed_keys, kv_dtype) if type(layer) is DynamicLayer else layer
        for layer in cache.layers
    ]
    if getattr(cache, "layer_class_to_replicate", None) is DynamicLayer:
        cache.layer_class_to_replicate = functools.partial(GrowingLayer, transposed_keys, kv_dtype)
    return cache
