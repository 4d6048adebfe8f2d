"""An exact prefix cache across requests: the keys and values of recent prompts and answers,
reused by any later request that starts with the same tokens, so that it prefills only its
new tokens (a conversation's next turn, an agent's next step, many requests with one system
prompt).

- *Exact*: reused only where the target says it :attr:`reuses_prefixes
  <promptlookup.backends.base.PrefixTarget.reuses_prefixes>` (row-invariant passes, whose keys
  and values of a token are bit for bit the same however its prefix was chunked or batched);
  a request's output with the cache is token for token its output without it (greedy, seeded
  sampling, logprobs: ``tests/test_prefix_cache.py``). Other targets (other ``transformers``
  models, CUDA, llama.cpp) may round a prompt chunk's rows differently from decoding steps,
  so nothing is reused there.
- *A seam*: the cache knows no layer, shape or dtype. A sequence's cache (the backend's
  :class:`~promptlookup.backends.base.BlockCache`) hands out blocks of keys and values
  (``read_blocks``) and takes a prefix of them back (``write_prefix``); this module only
  indexes, holds and saves them, as vLLM's KV cache manager hands the engine block tables.
- *Blocks*: sequences are kept in blocks of :data:`BLOCK_TOKENS` tokens, one tree per tenant
  (:mod:`promptlookup.prefix_tree`): a request takes the longest cached prefix, to the token;
  sequences that start alike share their blocks in the cache.
- *Held once*: a sequence's cache that can share its blocks in place
  (:class:`~promptlookup.backends.base.SharingBlockCache`, the native engines' caches) gives
  the cache views of its own buffers when its prompt is in and when it ends (no copy; it never
  rewrites those positions again). A request that :meth:`PrefixCache.join` s takes over the
  buffers its prefix lies in when no running request uses them and the blocks held there past
  its prefix are fewer than it (those are copied out first: copy on write); else, as with
  other caches, it copies its prefix into its own cache (a few milliseconds per thousand
  tokens): a conversation's next turn goes on in the buffers of the last, so its keys and
  values are held once. Blocks are read and handed over under the cache's lock.
- *Memory*: at most ``mib`` MiB of blocks (keys and values of every layer:
  ``kv_bytes_per_token`` each token: 22.5 KiB for SmolLM2-135M's float16 keys and values,
  45 KiB in float32), on top of the running requests' own caches. Buffers that blocks are
  held in count whole (spare room too), once, whether or not a running request uses them;
  they are freed with their last block. The latest sequence whose buffers alone are larger
  than the budget is kept in place beside it (:attr:`PrefixCache.limit_bytes`: the budget
  plus those buffers), whatever else comes, until another such sequence is stored: an
  agent's long conversation stays held once while the short requests between its turns
  evict each other within the budget (as llama-server keeps a slot's context; the others
  are read back from *Disk*).
- *Disk*: with a ``directory``, every block is also written there (in the background) within
  ``disk_mib`` MiB, and a request whose prefix goes on past what memory holds reads the rest
  from there: blocks evicted from memory, and a conversation's blocks after a restart
  (:mod:`promptlookup.prefix_disk`: content keys over the model, engine, KV dtype, tenant and
  tokens; files checked on reading).
- *Tenants*: a request reuses only entries of its own ``tenant`` (None is a tenant too), so
  that the speed of a reply cannot confirm another tenant's prompt; unless the cache is
  ``shared``.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Hashable, Sequence
from typing import Any

from .errors import InvalidParameterError
from .prefix_disk import DEFAULT_DISK_MIB, DiskTier
from .prefix_keys import chain, name_of, root_key, tail_name
from .prefix_tree import BlockTree, common_prefix_length

#: ``promptlookup serve``'s cache by default (``--prefix-cache-mib``): 1 GiB, about 45,000
#: tokens of SmolLM2-135M with float16 keys and values (22,000 in float32).
DEFAULT_MIB = 1024
#: ``promptlookup serve``'s memory budget with its disk tier (the default): the last few
#: short conversations (about 2,900 tokens of SmolLM2-135M), the others read back from disk
#: (about 0.12 s per 1,000 tokens); a longer one is held on its own (see *Memory*). 256 MiB
#: before: on Gemma 3 270M, whose windowed caches are copied into the cache, not held in
#: place, that held the race's last dozen prompts and put its peak at 1.53x llama-server's.
DEFAULT_MIB_WITH_DISK = 64
#: Tokens per block of the cache.
BLOCK_TOKENS = 32
#: Blocks the disk tier's copies are read out of a sequence at a time (then queued, within
#: the tier's bound on queued copies: :data:`~promptlookup.prefix_disk.QUEUED_COPIES_BYTES`).
DISK_RUN = 16


class PrefixCache:
    """Keys and values of earlier sequences, by tenant, within ``mib`` MiB, and within
    ``disk_mib`` MiB of files in ``directory`` if given (see the module doc).

    >>> cache = PrefixCache(mib=512, directory="~/.cache/my-prefixes")  # doctest: +SKIP
    >>> lm.generate(messages, prefix_cache=cache)                 # doctest: +SKIP
    >>> lm.prefix_cache = cache   # every generation's default   # doctest: +SKIP
    """

    def __init__(
        self,
        mib: float = DEFAULT_MIB,
        block_tokens: int = BLOCK_TOKENS,
        shared: bool = False,
        directory: str | os.PathLike | None = None,
        disk_mib: float = DEFAULT_DISK_MIB,
    ) -> None:
        if not mib > 0:
            raise InvalidParameterError(f"a prefix cache needs a budget > 0 MiB, got {mib!r}")
        if block_tokens < 1:
            raise InvalidParameterError(f"block_tokens must be >= 1, got {block_tokens}")
        if directory is not None and not disk_mib > 0:
            raise InvalidParameterError(
                f"a prefix cache's disk needs a budget > 0 MiB, got {disk_mib!r}"
            )
        self.budget_bytes, self.block_tokens = int(mib * 2**20), block_tokens
        #: Whether every tenant reuses every entry (one namespace; reply times then reveal
        #: whether someone sent a prompt before).
        self.shared = shared
        self._tree: BlockTree | None = None  # made by the first store (its block size known)
        self._lock = threading.Lock()
        self._layout: tuple | None = None  # the blocks' model: the first target's
        #: Finished sequences' caches that hold blocks in place (no running request uses
        #: them), each with the tokens whose keys and values it holds.
        self._finished: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        #: The disk tier, or None.
        self.disk = None
        if directory is not None:
            try:
                self.disk = DiskTier(os.path.expanduser(directory), int(disk_mib * 2**20))
            except OSError as error:
                raise InvalidParameterError(f"prefix cache folder {directory}: {error}") from None

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
        """Whether ``target``'s keys and values can be reused exactly: whether it says so
        (:attr:`~promptlookup.backends.base.PrefixTarget.reuses_prefixes`)."""
        return bool(getattr(target, "reuses_prefixes", False))

    def _check(self, target) -> None:
        """A named error for a target of another model than the cache's first (whose keys and
        values would not fit its sequences' caches)."""
        layout = (target.kv_layout, target.kv_bytes_per_token)
        with self._lock:
            self._layout = self._layout or layout
            if layout != self._layout:
                raise InvalidParameterError("a PrefixCache holds the keys and values of one model")

    @property
    def used_bytes(self) -> int:
        return 0 if self._tree is None else self._tree.used_bytes

    @property
    def limit_bytes(self) -> int:
        """What the cache may hold now: its budget, plus the buffers of the latest sequence
        larger than the budget while it holds them (see the module doc's *Memory*)."""
        return self.budget_bytes if self._tree is None else self._tree.limit_bytes

    def prepare(self, target) -> None:
        """Hash ``target``'s weights for the disk tier's keys (its :meth:`kv_identity
        <promptlookup.backends.base.PrefixTarget.kv_identity>`, about a second per GB) now, not
        in the first request; a no-op without a disk tier."""
        if self.disk is not None and self.applies(target):
            target.kv_identity()

    def flush(self) -> None:
        """Wait until every block given to the disk tier so far is written (no-op without)."""
        if self.disk is not None:
            self.disk.flush()

    def bytes_by_tenant(self) -> dict[str | None, int]:
        """The bytes each tenant's entries take (one entry, None, when the cache is shared)."""
        with self._lock:  # not while a request adds or evicts blocks
            return {} if self._tree is None else self._tree.bytes_by_namespace()

    def held(self, token_ids: Sequence[int], tenant: str | None = None) -> int:
        """How many of ``token_ids``' first tokens the cache holds now (of ``tenant``), as
        :meth:`restore` would find them: a streamed answer's usage before its prefill."""
        with self._lock:
            if self._tree is None:
                return 0
            return self._tree.match(None if self.shared else tenant, token_ids)[1]

    def restore(self, target, cache, token_ids: Sequence[int], tenant: str | None = None) -> int:
        """Fill the empty sequence ``cache`` of ``target`` with the keys and values of the
        longest cached prefix of ``token_ids`` (of ``tenant``), in memory or on disk; returns
        its length in tokens (0: none). Copies; :meth:`join` may take buffers over instead."""
        return self.join(target, cache, token_ids, tenant, take_over=False)[1]

    def join(
        self,
        target,
        cache,
        token_ids: Sequence[int],
        tenant: str | None = None,
        take_over: bool = True,
    ) -> tuple[Any, int]:
        """``(cache, matched)``: the cache a new sequence of ``target`` starts from, holding
        the keys and values of the longest cached prefix of ``token_ids`` (of ``tenant``),
        ``matched`` tokens long: the finished buffers that hold the prefix's start, taken over
        (see the module doc), or ``cache`` (empty) with the prefix copied in (as
        :meth:`restore`). The sequence's :meth:`store` with ``ended`` gives them back."""
        self._check(target)
        namespace, size = None if self.shared else tenant, self.block_tokens
        memory, failed = ([], 0), set()  # files found unusable while read back
        with self._lock:  # blocks held in place are read before anyone takes them over
            if self._tree is not None:
                memory = self._tree.match(namespace, token_ids)
            payloads, matched = self._planned(target, cache, namespace, token_ids, memory, failed)
            taken, start = (None, 0)
            if take_over and matched:
                taken, start = self._take_over(payloads, token_ids[:matched])
            if taken is not None:
                cache = taken
            while matched > start:  # the rest copied in, read from disk as it is written
                blocks = payloads[start // size :]
                if self.disk is not None:
                    blocks = self.disk.blocks(blocks, failed)
                known = len(failed)
                cache.write_prefix(blocks, matched)
                if cache.get_seq_length() >= matched or len(failed) == known:
                    break
                # A file failed as it was read (removed meanwhile, corrupt): planned again
                # without it, from the start.
                cache.crop(start)
                planned = self._planned(target, cache, namespace, token_ids, memory, failed)
                payloads, matched = planned[0], max(planned[1], start)
            matched = min(matched, cache.get_seq_length())
        return cache, matched

    def _planned(self, target, cache, namespace, token_ids, memory, failed) -> tuple[list, int]:
        """``(payloads, matched)``: the longest prefix of ``token_ids`` that ``memory`` (the
        tree's match) and the disk (its :class:`~promptlookup.prefix_disk.Stored` blocks, the
        files in ``failed`` left out) hold, as far as ``cache`` can resume (a windowed cache's
        windows)."""
        payloads, matched = memory
        if self.disk is not None:
            payloads, matched = self._from_disk(target, namespace, token_ids, *memory, failed)
        if matched and hasattr(cache, "resume_point"):  # windowed layers need their window
            matched = cache.resume_point(payloads, matched)
        return payloads, matched

    def _take_over(self, payloads: list, prefix: Sequence[int]) -> tuple[Any, int]:
        """``(buffers, start)``: the finished buffers among ``payloads``' that already hold the
        longest start of ``prefix`` (``start`` tokens, whole blocks or all of it), where
        copying out the blocks held there past it and copying in the prefix's rest costs
        least, and less than copying all of ``prefix`` (then done: the blocks past it now in
        their own storage); ``(None, 0)`` where none does."""
        size, best, cheapest = self.block_tokens, (None, 0, []), len(prefix)
        candidates = {id(p.storage): p.storage for p in payloads if hasattr(p, "storage")}
        for storage in candidates.values():
            if storage not in self._finished:
                continue  # in use (or its buffers never held in place)
            common = common_prefix_length(self._finished[storage], prefix)
            start = len(prefix) if common >= len(prefix) else common // size * size
            rest = payloads[start // size :] if start < len(prefix) else []  # copied in
            if any(getattr(p, "storage", None) is storage for p in rest):
                continue  # read and written at once: not this one
            past = [p for p in self._tree.payloads_in(storage) if p.stop > start]
            cost = sum(p.stop - p.start for p in past) + len(prefix) - start
            if cost < cheapest:
                best, cheapest = (storage, start, past), cost
        storage, start, past = best
        if storage is not None:
            if self.disk is not None:  # its blocks waiting to be written may read past ``start``
                self.disk.wait_for(storage)
            del self._finished[storage]
            self._tree.rehome(storage, lambda p: p.copy() if any(p is q for q in past) else p)
            storage.resume(start)
        return storage, start

    def store(
        self,
        target,
        cache,
        token_ids: Sequence[int],
        tenant: str | None = None,
        ended: bool = False,
    ) -> None:
        """Keep the keys and values of the blocks of ``token_ids`` (its last tokens as a tail)
        that ``cache`` (a sequence of ``target``) holds in its first positions and the cache
        lacks, for ``tenant``: in place where ``cache`` shares its blocks and its buffers fit
        the budget or are larger than it (then kept beside it), else copied (and write those
        the disk tier lacks there). ``ended``: the sequence is over, so that a later one may
        take its buffers over (:meth:`join`)."""
        self._check(target)
        length = min(cache.get_seq_length(), len(token_ids))
        if not length:
            return
        namespace, size = None if self.shared else tenant, self.block_tokens
        copied: dict[int, Any] = {}  # blocks read out of ``cache`` or in place, by index

        def blocks(start: int, stop: int) -> list:
            found = cache.read_blocks(start * size, min(stop * size, length), size)
            copied.update(zip(range(start, stop), found))
            return found

        def in_place(start: int, stop: int) -> list:
            found = cache.share_blocks(start * size, min(stop * size, length), size)
            copied.update(zip(range(start, stop), found))
            return found

        tokens = token_ids[:length]
        with self._lock:
            if self._tree is None:
                block_bytes = target.kv_bytes_per_token * self.block_tokens
                self._tree = BlockTree(self.block_tokens, block_bytes, self.budget_bytes)
            added = 0
            if _shares(cache):  # in place, all or nothing
                held = cache.held_bytes
                added = self._tree.insert(namespace, tokens, in_place, cache, held)
                if self._tree.counted(cache) not in (None, held):  # grown, not kept, no room
                    self._tree.rehome(cache, lambda payload: payload.copy())
            if not added:  # else copied (as many blocks as fit)
                self._tree.insert(namespace, tokens, blocks)
        if self.disk is not None:  # in place where it shares: read when written, no copy now
            self._to_disk(target, namespace, tokens, in_place if _shares(cache) else blocks, copied)
        if ended and _shares(cache):
            with self._lock:
                self._finished[cache] = list(tokens)

    def _keys(self, target, namespace: Hashable, tokens: Sequence[int]) -> list[bytes]:
        """The disk tier's keys: the root's, then those of the whole blocks of ``tokens``."""
        root = root_key(target.kv_identity(), namespace, self.block_tokens)
        return [root, *chain(root, tokens, self.block_tokens)]

    def _to_disk(self, target, namespace, tokens: Sequence[int], blocks, copied: dict) -> None:
        """Give the disk tier the blocks of ``tokens`` it lacks (those the memory tier just
        copied, the others from ``blocks``: copied out of the sequence's cache now, or in
        place, read when written: never rewritten before, as :meth:`_take_over` waits for the
        writes before a sequence resumes its buffers), its tail included."""
        size = self.block_tokens
        keys = self._keys(target, namespace, tokens)
        names = [name_of(key) for key in keys[1:]]
        if len(tokens) % size:
            names.append(tail_name(keys[-1], len(tokens) % size))
        missing = {index for index, name in enumerate(names) if self.disk.lacks(name)}
        for index in sorted(missing):
            if index not in copied:  # read with the run of missing blocks it starts, bounded
                end = min(index + DISK_RUN, len(names))
                blocks(index, next((i for i in range(index, end) if i not in missing), end))
            block = copied.pop(index)  # held by the disk tier's queue alone (or the tree's)
            self.disk.save(names[index], block, tokens[index * size : (index + 1) * size])
        self.disk.touch(names)  # once written: the root most recent

    def _from_disk(self, target, namespace, tokens, payloads: list, matched: int, failed=()):
        """``(payloads, matched)`` of the longest prefix of ``tokens`` held in memory
        (``payloads`` over ``matched`` tokens) or, past memory's whole blocks, on disk: its
        next whole blocks, then the longest tail below them that the next tokens start like.
        Planned from the files' headers (:class:`~promptlookup.prefix_disk.Stored` blocks,
        those named in ``failed`` left out): read as they are written into the sequence."""
        size = self.block_tokens
        if matched == len(tokens):
            return payloads, matched
        keys = self._keys(target, namespace, tokens)
        names = [name_of(key) for key in keys[1:]]
        found = list(payloads[: matched // size])  # memory's whole blocks
        while len(found) < len(names):  # then the disk's, while it has them
            index = len(found)
            stored = None if names[index] in failed else self.disk.header(names[index])
            if stored is None or stored.tokens != list(tokens[index * size : (index + 1) * size]):
                break
            found.append(stored)
        self.disk.touch(names[: len(found)])
        length = len(found) * size
        rest = list(tokens[length : length + size])
        best, common = None, 0  # then the tail that the next tokens start most like
        tail = min(len(rest), size - 1)
        while tail > common:  # a tail no longer than the best so far cannot beat it
            name = tail_name(keys[len(found)], tail)
            stored = None if name in failed else self.disk.header(name)
            shared = 0 if stored is None else common_prefix_length(stored.tokens, rest)
            if shared > common:
                best, common = stored, shared
            tail -= 1
        if best is not None:
            found, length = [*found, best], length + common
        return (found, length) if length > matched else (payloads, matched)


def _shares(cache) -> bool:
    """Whether ``cache`` (a sequence's) lends the prefix cache its blocks in place
    (:class:`~promptlookup.backends.base.SharingBlockCache`); a cache that drops positions (a
    windowed one) says ``share_blocks = None`` and its blocks are copied."""
    return callable(getattr(cache, "share_blocks", None))
