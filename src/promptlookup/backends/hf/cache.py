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

With ``transposed_keys`` the keys are stored ``(batch, kv_heads, head_dim, capacity)``
(``key_storage``), the layout :mod:`~promptlookup.backends.gguf.native_attention` reads;
``key_buffer`` is then a transposed view of it, so everything else sees the usual shape.
"""

from __future__ import annotations

import functools

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ..gguf.row_invariant import KEY_BLOCK

#: Room for this many tokens is reserved at first (or for the first pass's tokens, if more).
MIN_CAPACITY = 256
#: A full buffer grows by 1 / GROWTH of its size (or to the pass's need): a quarter wastes at
#: most a fifth of the room (doubling: half; Gemma 3 270M holds 36 KiB a token in float32)
#: for a copy of the cache every quarter more tokens, a small cost beside the passes between.
GROWTH = 4


class GrowingLayer(DynamicLayer):
    """A :class:`~transformers.cache_utils.DynamicLayer` over buffers of shape
    ``(batch, kv_heads, capacity, head_dim)``; ``keys``/``values`` are views of the first
    ``length`` positions."""

    def __init__(self, transposed_keys: bool = False) -> None:
        super().__init__()
        self.transposed_keys = transposed_keys

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
            storage = new.new_empty(*new.shape[:-2], *shape)
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


def growing_cache(config, transposed_keys: bool = False) -> DynamicCache:
    """``DynamicCache(config=config)`` with each plain ``DynamicLayer`` made a :class:`GrowingLayer`
    (sliding-window and other special layers stay as transformers makes them)."""
    cache = DynamicCache(config=config)
    cache.layers = [
        GrowingLayer(transposed_keys) if type(layer) is DynamicLayer else layer
        for layer in cache.layers
    ]
    if getattr(cache, "layer_class_to_replicate", None) is DynamicLayer:
        cache.layer_class_to_replicate = functools.partial(GrowingLayer, transposed_keys)
    return cache
