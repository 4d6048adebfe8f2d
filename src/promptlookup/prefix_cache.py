"""An exact prefix cache across requests: the keys and values of recent prompts and answers,
reused by any later request that starts with the same tokens, so that it prefills only its
new tokens (a conversation's next turn, an agent's next step, many requests with one system
prompt).

- *Exact*: reused only on a target with ``row_invariant`` passes
  (:meth:`PrefixCache.applies`), whose keys and values of a token are bit for bit the same
  however its prefix was chunked or batched; a request's output with the cache is token for
  token its output without it (greedy, seeded sampling, logprobs:
  ``tests/test_prefix_cache.py``). Other targets (other ``transformers`` models, CUDA,
  llama.cpp) may round a prompt chunk's rows differently from decoding steps, so nothing is
  reused there.
- *Blocks*: sequences are kept in blocks of :data:`BLOCK_TOKENS` tokens, one tree per tenant
  (:mod:`promptlookup.prefix_tree`): a request takes the longest cached prefix, to the token;
  sequences that start alike share their blocks in the cache.
- *Copy on join*: a request copies its prefix's keys and values into its own KV cache when it
  starts (a few milliseconds per thousand tokens), and its prompt and answer are copied into
  the cache's blocks once its prompt is in (so requests that join later reuse it) and when it
  ends. Running requests therefore hold no block of the cache, and eviction (least recently
  used first) can take any block; a request that copies holds its blocks' tensors alive until
  its copy is made.
- *Memory*: at most ``mib`` MiB of blocks (keys and values of every layer:
  ``kv_bytes_per_token`` each token, 46 KB for SmolLM2-135M in float32), on top of the running
  requests' own caches.
- *Tenants*: a request reuses only entries of its own ``tenant`` (None is a tenant too), so
  that the speed of a reply cannot confirm another tenant's prompt; unless the cache is
  ``shared``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from .errors import InvalidParameterError
from .prefix_tree import BlockTree

#: ``promptlookup serve``'s cache by default (``--prefix-cache-mib``): 1 GiB, about 22,000
#: tokens of SmolLM2-135M in float32.
DEFAULT_MIB = 1024
#: Tokens per block of the cache.
BLOCK_TOKENS = 32
#: Blocks a store copies out of a sequence's cache at a time.
COPY_BLOCKS = 16


class PrefixCache:
    """Keys and values of earlier sequences, by tenant, within ``mib`` MiB (see the module doc).

    >>> cache = PrefixCache(mib=512)
    >>> lm.generate(messages, prefix_cache=cache)                 # doctest: +SKIP
    >>> lm.prefix_cache = cache   # every generation's default   # doctest: +SKIP
    """

    def __init__(
        self, mib: float = DEFAULT_MIB, block_tokens: int = BLOCK_TOKENS, shared: bool = False
    ) -> None:
        if not mib > 0:
            raise InvalidParameterError(f"a prefix cache needs a budget > 0 MiB, got {mib!r}")
        if block_tokens < 1:
            raise InvalidParameterError(f"block_tokens must be >= 1, got {block_tokens}")
        self.budget_bytes, self.block_tokens = int(mib * 2**20), block_tokens
        #: Whether every tenant reuses every entry (one namespace; reply times then reveal
        #: whether someone sent a prompt before).
        self.shared = shared
        self._tree: BlockTree | None = None  # made by the first store (its block size known)
        self._lock = threading.Lock()

    @classmethod
    def chosen(cls, option, default: PrefixCache | None, target) -> PrefixCache | None:
        """The prefix cache a generation of ``target`` uses, from its ``prefix_cache``
        option: ``True`` the model's ``default``, ``False`` or None none, or the one given;
        none where :meth:`applies` says no."""
        if option is True:
            option = default
        elif option is False:
            option = None
        if option is not None and not isinstance(option, cls):
            raise InvalidParameterError(
                f"prefix_cache must be a PrefixCache, True or False, got {type(option).__name__}"
            )
        return option if option is not None and cls.applies(target) else None

    @staticmethod
    def applies(target) -> bool:
        """Whether ``target``'s keys and values can be reused exactly: a
        :class:`~promptlookup.backends.hf.target.TransformersTarget` (its sequences'
        caches are ours) whose passes are row-invariant."""
        from .backends.hf.target import TransformersTarget

        return isinstance(target, TransformersTarget) and target.row_invariant

    def _check(self, target) -> None:
        """A named error for a target of another model than the cache's first (whose keys and
        values would not fit its sequences' caches)."""
        shape = (target.config.num_hidden_layers, *target.attention.shape)
        signature = (*shape, target.kv_bytes_per_token)
        with self._lock:
            self._signature = getattr(self, "_signature", None) or signature
            if signature != self._signature:
                raise InvalidParameterError("a PrefixCache holds the keys and values of one model")

    @property
    def used_bytes(self) -> int:
        return 0 if self._tree is None else self._tree.used_bytes

    def held(self, token_ids: Sequence[int], tenant: str | None = None) -> int:
        """How many of ``token_ids``' first tokens the cache holds now (of ``tenant``), as
        :meth:`restore` would find them: a streamed answer's usage before its prefill."""
        with self._lock:
            if self._tree is None:
                return 0
            return self._tree.match(None if self.shared else tenant, token_ids)[1]

    def restore(self, target, cache, token_ids: Sequence[int], tenant: str | None = None) -> int:
        """Fill the empty sequence ``cache`` of ``target`` with the keys and values of the
        longest cached prefix of ``token_ids`` (of ``tenant``); returns its length in tokens
        (0: none)."""
        self._check(target)
        with self._lock:
            if self._tree is None:
                return 0
            payloads, matched = self._tree.match(None if self.shared else tenant, token_ids)
        if not matched:
            return 0
        # The payloads are never written, and held here: copied outside the lock, block by
        # block straight into the cache's buffers (the last block possibly in part).
        first = payloads[0]
        like = first.new_empty((1, first.shape[2], 0, first.shape[4]))  # (1, kv_heads, 0, dim)
        buffers = []
        for layer in cache.layers:
            layer.make_room(matched, like)
            buffers.append((layer.key_buffer[0], layer.value_buffer[0]))  # (kv_heads, room, dim)
        whole = len(payloads) if matched % self.block_tokens == 0 else len(payloads) - 1
        start, tail = whole * self.block_tokens, payloads[whole:]  # tail: a block in part
        for index, (layer, (keys, values)) in enumerate(zip(cache.layers, buffers)):
            for kind, buffer in enumerate((keys, values)):
                if whole:  # every whole block's rows in one call
                    rows = [payload[index, kind] for payload in payloads[:whole]]
                    torch.cat(rows, dim=1, out=buffer[:, :start])
                for payload in tail:  # (layers, 2, kv_heads, block_tokens, head_dim)
                    buffer[:, start:matched] = payload[index, kind, :, : matched - start]
            layer.advance(matched)
        return matched

    def store(self, target, cache, token_ids: Sequence[int], tenant: str | None = None) -> None:
        """Keep the keys and values of the blocks of ``token_ids`` (its last tokens as a tail)
        that ``cache`` (a sequence of ``target``) holds in its first positions and the cache
        lacks, for ``tenant``."""
        self._check(target)
        length = min(cache.get_seq_length(), len(token_ids))
        if not length:
            return
        with self._lock:
            if self._tree is None:
                block_bytes = target.kv_bytes_per_token * self.block_tokens
                self._tree = BlockTree(self.block_tokens, block_bytes, self.budget_bytes)
            self._tree.insert(
                None if self.shared else tenant,
                token_ids[:length],
                lambda start, stop: self._blocks(cache, start, stop, length),
            )

    def _blocks(self, cache, start: int, stop: int, length: int) -> list[torch.Tensor]:
        """Blocks ``start`` to ``stop - 1`` of the first ``length`` positions of ``cache``,
        each ``(layers, 2, kv_heads, block_tokens, head_dim)`` in its own storage (evicting one
        frees it), copied out :data:`COPY_BLOCKS` at a time (so that a long sequence needs
        little memory besides); a last block past ``length // block_tokens`` is the tail,
        ``(layers, 2, kv_heads, length % block_tokens, head_dim)``."""
        size, keys, blocks = self.block_tokens, cache.layers[0].keys, []
        whole = min(stop, length // size)
        for first in range(start, whole, COPY_BLOCKS):
            count = min(COPY_BLOCKS, whole - first)
            part = keys.new_empty((count, len(cache.layers), 2, keys.shape[1], size, keys.shape[3]))
            for index, layer in enumerate(cache.layers):
                for kind, states in enumerate((layer.keys, layer.values)):
                    rows = states[0, :, first * size : (first + count) * size]  # (heads, n, dim)
                    part[:, index, kind] = rows.unflatten(1, (count, size)).transpose(0, 1)
            blocks += [block.clone() for block in part]
        if stop > whole:  # the tail
            rest = length - whole * size
            part = keys.new_empty((len(cache.layers), 2, keys.shape[1], rest, keys.shape[3]))
            for index, layer in enumerate(cache.layers):
                for kind, states in enumerate((layer.keys, layer.values)):
                    part[index, kind] = states[0, :, whole * size : length]
            blocks.append(part)
        return blocks
