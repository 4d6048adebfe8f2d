"""Sliding-window layers that keep only their window (Gemma 3's local layers: 5 of every 6).

A query at position ``p`` of a layer with window ``W`` attends keys ``p - W + 1 .. p`` only, so
a :class:`WindowedLayer` drops the keys and values before a pass's window: its buffers hold
positions ``offset .. length - 1`` (``offset`` a multiple of
:data:`~promptlookup.backends.gguf.row_invariant.KEY_BLOCK`), about ``W`` of them however long
the sequence, where a :class:`~promptlookup.backends.hf.cache.GrowingLayer` holds them all.
The kernels (``row_attention.c``, ``quantized_layers.c``) address a key by its position: they
are handed the buffers' pointers moved back by ``offset`` positions
(:func:`~promptlookup.backends.gguf.native_attention.cache_pointers`) and read only positions
from the first key block of a pass's window, which the layer holds. A row's bits do not
depend on where its sequence's buffer starts: keys before a row's window weigh exactly 0
(``row_attention.c``'s header), so every pass is bit for bit what it is over a whole layer.

*Rollback.* A pass that starts at position ``s`` keeps positions from
``s - W + 1 - margin`` (down to a key block) on, so ``crop(length)`` is exact for every
``length`` whose window the layer still holds, ``offset <= max(0, length - W + 1)``: every
length from the last pass's start on (its rejected draft tokens), which is every crop the
loop, the batch decoder and calibration make. A crop further back raises
:class:`WindowCropError`. Old positions go in amortised steps: the buffers have room for
``slack`` positions more than the window and the pass, and the held ones move to the front
when a pass does not fit (every ``slack`` tokens of decoding, about ``W`` positions moved).

*The prefix cache* (:class:`WindowedCache`). A later request can resume after a cached prefix
of ``m`` tokens only if its windowed layers get positions ``m - W + 1 .. m - 1``; nothing else
can rebuild them (their keys depend on every layer below, windowed ones included). So a block
(:meth:`WindowedCache.read_blocks`) carries the windowed layers' rows only over the last
``W - 1 + margin`` positions of the sequence when it is stored, and the whole layers' rows
always: its rows are the whole layers first, then the windowed ones, or the whole layers
alone (``block.shape[0]`` tells which). A request resumes at the longest
point of its match whose window the blocks carry (:meth:`WindowedCache.resume_point`), else
earlier, and prefills the rest. ``margin`` (:data:`MARGIN`) lets a conversation's next turn
resume a little before where its last turn was stored (a re-rendered end of turn).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import torch

from ..gguf.row_invariant import KEY_BLOCK
from .cache import GrowingCache, GrowingLayer, prepended, write_blocks

#: Positions a windowed layer keeps before a pass's window besides (at most its window):
#: where a later request may resume before the end of this sequence's cached blocks.
MARGIN = 128


class WindowCropError(ValueError):
    """A crop back past what a windowed layer still holds (see the module doc)."""


def _blocks_up(count: int) -> int:
    return -(-count // KEY_BLOCK) * KEY_BLOCK


def _blocks_down(count: int) -> int:
    return count // KEY_BLOCK * KEY_BLOCK


class WindowedLayer(GrowingLayer):
    """A sliding-window layer of window ``window`` that keeps only positions ``offset`` to
    ``length - 1`` (see the module doc); ``keys``/``values`` are views of those, in buffers
    ``(1, kv_heads, capacity, head_dim)`` (keys stored transposed with ``transposed_keys``)."""

    is_sliding = True

    def __init__(
        self,
        window: int,
        transposed_keys: bool = False,
        kv_dtype: torch.dtype | None = None,
        margin: int | None = None,
    ) -> None:
        super().__init__(transposed_keys, kv_dtype)
        if window < 1:
            raise ValueError(f"a windowed layer needs a window >= 1, got {window}")
        self.window = self.sliding_window = window
        #: Positions kept before a pass's first row's window (its window, less the row, and
        #: ``margin``), and room for this many more before the held ones move.
        self.keep = window - 1 + (min(MARGIN, window) if margin is None else margin)
        self.slack = _blocks_up(max(window // 2, KEY_BLOCK))
        self.offset = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.offset = 0

    @property
    def keys(self):
        buffer = getattr(self, "key_buffer", None)
        return self._keys if buffer is None else buffer[..., : self.length - self.offset, :]

    @keys.setter
    def keys(self, value) -> None:
        self._keys = value

    @property
    def values(self):
        buffer = getattr(self, "value_buffer", None)
        return self._values if buffer is None else buffer[..., : self.length - self.offset, :]

    @values.setter
    def values(self, value) -> None:
        self._values = value

    @property
    def capacity(self) -> int:
        return 0 if self.key_buffer is None else self.key_buffer.shape[-2]

    def _room(self, count: int, key_like: torch.Tensor, value_like: torch.Tensor) -> None:
        """Room for positions ``length .. length + count - 1``, dropping those before the
        pass's first window (less the margin)."""
        start, capacity = self.length, self.capacity
        keep_from = max(self.offset, _blocks_down(max(0, start - self.keep)))
        held, span = start - keep_from, start + count - keep_from
        wanted = _blocks_up(span + self.slack)
        if start + count - self.offset <= capacity <= 2 * wanted:
            return  # room enough where the positions are (and not twice too much)
        if span <= capacity <= 2 * wanted:  # move the held positions to the front
            for buffer in (self.key_buffer, self.value_buffer):
                buffer[..., :held, :] = buffer[
                    ..., keep_from - self.offset : start - self.offset, :
                ].clone()
        else:  # new buffers (the first, larger for a long pass, or smaller after one)
            buffers = []
            for old, like in ((self.key_buffer, key_like), (self.value_buffer, value_like)):
                transposed = self.transposed_keys and like is key_like
                dim = like.shape[-1]
                shape = (dim, wanted) if transposed else (wanted, dim)
                storage = like.new_empty(
                    1, like.shape[1], *shape, dtype=self.kv_dtype or like.dtype
                )
                buffer = storage.transpose(-1, -2) if transposed else storage
                if old is not None and held:
                    buffer[..., :held, :] = old[
                        ..., keep_from - self.offset : start - self.offset, :
                    ]
                buffer[..., held:, :].zero_()  # finite past the end: kernels read whole blocks
                buffers.append((storage, buffer))
            (self.key_storage, self.key_buffer), (_, self.value_buffer) = buffers
        self.offset = keep_from

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        count = key_states.shape[-2]
        self._room(count, key_states, value_states)
        first = self.length - self.offset
        self.key_buffer[..., first : first + count, :] = key_states
        self.value_buffer[..., first : first + count, :] = value_states
        self.length += count
        return self.keys, self.values

    def make_room(self, count: int, like: torch.Tensor) -> None:
        values_like = like.new_empty(like.shape)  # _room tells keys from values by identity
        if not self.is_initialized:
            self.lazy_initialization(like, values_like)
        self._room(count, like, values_like)

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions: exact where the layer still holds their
        window (``offset <= length - window + 1``) or for none, else :class:`WindowCropError`."""
        if length < 0:
            raise ValueError(f"WindowedLayer.crop takes a length to keep, got {length}")
        if self.is_initialized and length < self.length:
            if length == 0:  # nothing kept: exact whatever was dropped
                self.length = self.offset = 0
                return
            if self.offset > max(0, length - self.window + 1):
                raise WindowCropError(
                    f"a sliding-window layer holds positions from {self.offset} on; it cannot "
                    f"be cropped back to {length} (window {self.window})"
                )
            self.length = length

    def start_at(self, offset: int, length: int, like: torch.Tensor) -> None:
        """Empty buffers for positions ``offset .. length - 1`` (``offset`` a multiple of
        the key block), zeroed, for :meth:`WindowedCache.write_prefix` to fill."""
        values_like = like.new_empty(like.shape)
        if not self.is_initialized:
            self.lazy_initialization(like, values_like)
        self.key_buffer = self.value_buffer = self.key_storage = None
        self.length = self.offset = offset
        self._room(length - offset, like, values_like)
        self.length = length

    def reset(self) -> None:
        super().reset()
        self.offset = 0


class WindowedCache(GrowingCache):
    """A :class:`~promptlookup.backends.hf.cache.GrowingCache` some of whose layers are
    :class:`WindowedLayer`; its blocks hold the whole layers' rows, then the windowed
    layers' where the sequence still held them (see the module doc)."""

    #: Not lent in place (:func:`promptlookup.prefix_cache._shares`): a windowed layer drops
    #: the positions a view of its buffers would need, so the prefix cache copies blocks out.
    share_blocks = None

    @property
    def _order(self) -> tuple[list[int], list[int]]:
        """Indexes of the whole layers and of the windowed ones."""
        windowed = [i for i, layer in enumerate(self.layers) if isinstance(layer, WindowedLayer)]
        whole = [i for i in range(len(self.layers)) if i not in windowed]
        return whole, windowed

    def read_blocks(self, start: int, stop: int, block_tokens: int) -> list[torch.Tensor]:
        """Positions ``start`` to ``stop - 1`` as blocks of ``block_tokens`` positions (the
        last possibly shorter), each ``(layers, 2, kv_heads, n, head_dim)``: the whole layers'
        rows, then the windowed layers' for a block over the sequence's last ``keep``
        positions that every one still holds, else the whole layers' alone."""
        whole, windowed = self._order
        # Windowed rows for the blocks over the last ``keep`` positions (a later request's
        # window, up to ``margin`` before the end), where every windowed layer holds them.
        held_from = max(self.layers[i].offset for i in windowed)
        recent = self.get_seq_length() - max(self.layers[i].keep for i in windowed)
        keys = self.layers[(whole or windowed)[0]].keys  # (1, kv_heads, n, head_dim)
        kv_heads, head_dim = keys.shape[1], keys.shape[3]
        blocks = []
        for first in range(start, stop, block_tokens):
            last = min(first + block_tokens, stop)
            indexes = whole + windowed if first >= held_from and last > recent else whole
            block = keys.new_empty((len(indexes), 2, kv_heads, last - first, head_dim))
            for row, index in enumerate(indexes):
                layer = self.layers[index]
                shift = getattr(layer, "offset", 0)
                for kind, states in enumerate((layer.keys, layer.values)):
                    block[row, kind] = states[0, :, first - shift : last - shift]
            blocks.append(block)
        return blocks

    def resume_point(self, blocks: list[torch.Tensor], matched: int) -> int:
        """The longest ``length <= matched`` whose windows ``blocks`` (a prefix's, in order)
        carry: every block over positions ``length - window + 1 .. length - 1`` holds the
        windowed layers' rows (0 always qualifies: nothing resumed)."""
        whole, windowed = self._order
        window = max(self.layers[i].window for i in windowed)
        ends = list(itertools.accumulate(block.shape[3] for block in blocks))
        complete = [block.shape[0] == len(self.layers) for block in blocks]
        candidates = [matched, *(end for end in reversed(ends) if end < matched)]
        for length in candidates:
            low = max(0, length - window + 1)
            if all(
                complete[i]
                for i, end in enumerate(ends)
                if end > low and end - blocks[i].shape[3] < length
            ):
                return length
        return 0

    @torch.inference_mode()  # the buffers a forward pass made are inference tensors
    def write_prefix(self, blocks: Iterable[torch.Tensor], length: int) -> None:
        """Fill this empty cache with the first ``length`` positions of ``blocks``: every
        position of the whole layers, the windows before ``length`` of the windowed ones
        (:meth:`resume_point` says where that can be), each block written and let go before
        the next is read. Where the blocks end early the cache stays empty (the windows of
        an earlier length may lie in blocks let go)."""
        whole, windowed = self._order
        blocks = iter(blocks)
        first = next(blocks, None)
        if first is None:
            return
        like = first.new_empty((1, first.shape[2], 0, first.shape[4]))  # (1, kv_heads, 0, dim)
        layers = []  # (row in a block, layer, first position written)
        for row, index in enumerate(whole):
            self.layers[index].make_room(length, like)
            layers.append((row, self.layers[index], 0))
        for row, index in enumerate(windowed, start=len(whole)):
            layer = self.layers[index]
            offset = _blocks_down(max(0, length - layer.window + 1))
            layer.start_at(offset, length, like)  # zeroed: rows missing before the window
            layers.append((row, layer, offset))
        blocks, first = prepended(first, blocks), None  # held by none
        end = write_blocks(blocks, layers, 0, length)
        for index in whole:
            self.layers[index].advance(end)
        if end < length:
            self.crop(0)


def windowed_cache(cache: GrowingCache, windows: list[int], transposed_keys, kv_dtype):
    """``cache`` (a new sequence's, one layer per entry of ``windows``) with every layer of a
    window (not 0) a :class:`WindowedLayer`, as a :class:`WindowedCache`; unchanged where no
    layer has one."""
    if not any(windows):
        return cache
    windowed = WindowedCache.__new__(WindowedCache)
    windowed.__dict__.update(cache.__dict__)
    windowed.layers = [
        WindowedLayer(window, transposed_keys, kv_dtype) if window else layer
        for layer, window in zip(cache.layers, windows)
    ]
    return windowed
