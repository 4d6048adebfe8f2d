"""The *target*: the model being accelerated, seen through the narrow interface the decoding
loop needs. A backend owns a KV cache over the tokens fed so far; it runs forward passes over
new tokens and can crop the cache back after rejected drafts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

#: Prompt tokens a target takes in one forward pass at most (bounding activation memory): a
#: longer prompt is fed in chunks of this many, unless the target has a ``prefill_chunk`` of
#: its own (see :class:`Target`).
PREFILL_CHUNK = 2048


@runtime_checkable
class Target(Protocol):
    """What the decoding loop needs from a model backend.

    Positions are implicit: the i-th token fed after a ``reset`` sits at position i. A
    target may say how many prompt tokens one of its passes takes at most,
    ``prefill_chunk`` (optional, so not a protocol member; any size gives the same tokens).
    """

    #: Longest sequence (prompt + generated tokens) the model accepts.
    max_context: int
    #: Whether :meth:`crop` is supported; without it only plain decoding is possible.
    can_crop: bool

    def reset(self) -> None:
        """Empty the cache (start a new sequence)."""

    def prefill(self, token_ids: Sequence[int]) -> None:
        """Feed tokens into the cache without returning logits (the prompt). A backend may
        hold some back and run them at the start of the next :meth:`forward` (one pass
        instead of two); ``cache_length`` counts them either way."""

    def forward(self, token_ids: Sequence[int]) -> torch.Tensor:
        """One forward pass over ``token_ids`` appended to the cache.

        Returns float32 logits of shape ``(len(token_ids), vocab)``: row i predicts the token
        after ``token_ids[i]``.
        """

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` positions of the cache."""

    def prepare(self, sizes: Sequence[int]) -> None:
        """Set up for forward passes over these numbers of tokens, before they are timed (the
        torch target chooses its kernels); a no-op for a backend with nothing to set up.
        The loop calls it before every pass, the cost calibration before its passes."""

    @property
    def cache_length(self) -> int:
        """Number of positions in the cache."""


class SequenceCache(Protocol):
    """One sequence's KV cache in a :class:`BatchTarget` (a transformers ``DynamicCache``)."""

    def get_seq_length(self) -> int:
        """Number of positions in the cache."""

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` positions (as :meth:`Target.crop`)."""


@runtime_checkable
class BatchTarget(Target, Protocol):
    """A target that runs one forward pass over several sequences, each with its own cache
    (continuous batching, :mod:`promptlookup.batching`)."""

    #: Whether a sequence's logits in a pass over several are bit for bit those it gets
    #: alone (row-invariant passes); when false, batched outputs may differ from single ones.
    row_invariant: bool
    #: Bytes of KV cache one token of one sequence takes.
    kv_bytes_per_token: int

    def new_sequence(self) -> SequenceCache:
        """An empty cache for one more sequence."""

    def forward_batch(
        self,
        caches: Sequence[SequenceCache],
        token_ids: Sequence[Sequence[int]],
        logits_to_keep: Sequence[int],
    ) -> list[torch.Tensor]:
        """One forward pass: ``token_ids[i]`` appended to ``caches[i]``. Returns, per sequence,
        float32 logits ``(logits_to_keep[i], vocab)`` of its last ``logits_to_keep[i]`` tokens
        (0: none, a prompt chunk)."""


@runtime_checkable
class BlockCache(SequenceCache, Protocol):
    """A sequence's cache that a prefix cache (:mod:`promptlookup.prefix_cache`) can read
    blocks of keys and values from and write a prefix into. A *block* is positions
    ``start`` to ``stop - 1`` of every layer, one tensor in the cache's own dtype and layout
    (the prefix cache only holds, saves and hands back the tensors)."""

    def read_blocks(self, start: int, stop: int, block_tokens: int) -> list[torch.Tensor]:
        """Positions ``start`` to ``stop - 1`` as blocks of ``block_tokens`` positions each,
        the last one shorter where the span is not a multiple; each in its own storage."""

    def write_prefix(self, blocks: Sequence[torch.Tensor], length: int) -> None:
        """Fill this cache's next positions, up to ``length``, with the positions that
        ``blocks`` hold one after another (as :meth:`read_blocks` gave them; the last possibly
        in part): an empty cache's first ``length``."""


@runtime_checkable
class SharingBlockCache(BlockCache, Protocol):
    """A :class:`BlockCache` whose keys and values a prefix cache can hold *in place*, so that
    they are held once: its blocks are views of its own buffers, and a later sequence may take
    the buffers over (the prefix cache's ``join``)."""

    #: Bytes its buffers take now (what holding its blocks in place costs).
    held_bytes: int

    def share_blocks(self, start: int, stop: int, block_tokens: int) -> list:
        """Positions ``start`` to ``stop - 1`` as blocks of ``block_tokens`` positions in place
        (no copy), each with ``storage`` (this cache), ``start``, ``stop``, ``copy()`` (the
        block in its own storage, as :meth:`read_blocks` gives one), ``dtype`` and ``bits()`` (its
        bits in a numpy array of the same layout, read without torch); :meth:`write_prefix` takes
        them too. The first ``stop`` positions are never rewritten from then on (a crop below
        them is an error) until :meth:`resume`."""

    def resume(self, length: int) -> None:
        """Keep the first ``length`` positions, the only ones blocks in place hold from now on,
        for a new sequence that goes on after them."""


@runtime_checkable
class PrefixTarget(BatchTarget, Protocol):
    """A target whose sequences' caches can start from an earlier sequence's keys and values,
    and still give every token exactly as without them."""

    #: Whether a prefix's keys and values reused from another sequence are bit for bit those
    #: a prefill of it would make (row-invariant passes), so that reusing them is exact; its
    #: :meth:`new_sequence` then gives :class:`BlockCache` caches.
    reuses_prefixes: bool
    #: What a block's keys and values are made of, for caches that hold one model's blocks:
    #: the engine, the layers' shapes and the keys' and values' dtype (not the weights).
    kv_layout: str

    def kv_identity(self) -> str:
        """A digest of everything that makes its keys and values what they are: the weights,
        the engine and its rounding, the KV layout and dtype (the key of blocks kept on disk,
        which a later process may find). Computed once."""

    def new_sequence(self) -> BlockCache:
        """An empty cache for one more sequence."""
