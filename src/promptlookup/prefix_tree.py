"""The index of a prefix cache (:mod:`promptlookup.prefix_cache`): token sequences cut into
blocks of ``block_tokens`` tokens, kept in one tree per namespace (a tenant), each block a node
holding a payload (its keys and values) of ``block_bytes`` bytes.

- *Longest prefix*: :meth:`BlockTree.match` walks the blocks that a sequence starts with, then
  takes the longest common start of its next tokens with one of that node's children, so a
  prefix is found to the token, not only to the block.
- *Sharing*: sequences that start alike share their first blocks; :meth:`BlockTree.insert`
  adds only the blocks not in the tree yet.
- *Tails*: a sequence's last tokens that do not fill a block are kept too, as a leaf of fewer
  tokens (its payload holds them only; it counts as a whole block in the budget). Nothing
  grows below it: a sequence that goes on gets a whole block beside it.
- *Storages*: a payload is its own storage (``block_bytes``), or a view into a *storage*
  that many blocks share (a sequence's own buffers, :meth:`BlockTree.insert`'s ``storage``):
  such a storage counts its own bytes once, as long as any block lives in it, and its blocks
  nothing more (:meth:`BlockTree.rehome` moves blocks out of one).
- *Eviction*: the tree holds at most ``budget_bytes`` of payloads and storages (or one
  storage alone, when it is larger: :attr:`BlockTree.limit_bytes`); the least
  recently used block goes first (a storage's bytes go with its last block). Every use
  touches a block and all its ancestors, the deepest first, so a block is never used more
  recently than its parent and the least recently used block is a leaf: evicting it never
  orphans another. A namespace whose last block goes is dropped.

It holds no tensors itself (payloads come from the caller), so that it can be tested against a
brute-force reference (``tests/test_prefix_tree.py``). Not thread-safe: its owner locks.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Sequence
from typing import Any


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists (binary search over C-speed
    slice comparisons: cheap even for long sequences)."""
    equal, unequal = 0, min(len(a), len(b))
    if list(a[:unequal]) == list(b[:unequal]):
        return unequal
    while unequal - equal > 1:  # invariant: a[:equal] == b[:equal], a[:unequal] != b[:unequal]
        mid = (equal + unequal) // 2
        if list(a[:mid]) == list(b[:mid]):
            equal = mid
        else:
            unequal = mid
    return equal


class _Block:
    __slots__ = ("tokens", "parent", "children", "payload", "storage")

    def __init__(
        self,
        tokens: tuple[int, ...],
        parent: _Block | None,
        payload: Any = None,
        storage: Hashable | None = None,
    ):
        self.tokens, self.parent, self.payload = tokens, parent, payload
        self.storage = storage  # the storage its payload is a view into; None: its own
        self.children: dict[tuple[int, ...], _Block] = {}


class BlockTree:
    """Token blocks in a tree per namespace, within a byte budget (see the module doc)."""

    def __init__(self, block_tokens: int, block_bytes: int, budget_bytes: int) -> None:
        self.block_tokens, self.block_bytes, self.budget_bytes = (
            block_tokens,
            block_bytes,
            budget_bytes,
        )
        self._roots: dict[Hashable, _Block] = {}
        #: Every block, least recently used first (never before its descendants).
        self._recency: collections.OrderedDict[_Block, Hashable] = collections.OrderedDict()
        #: Shared storages: their bytes and the blocks living in them; and the blocks that
        #: are their own storage.
        self._storages: dict[Hashable, tuple[int, set[_Block]]] = {}
        self._own = 0

    @property
    def blocks(self) -> int:
        return len(self._recency)

    @property
    def used_bytes(self) -> int:
        shared = sum(nbytes for nbytes, _ in self._storages.values())
        return self._own * self.block_bytes + shared

    def bytes_by_namespace(self) -> dict[Hashable, int]:
        """The bytes each namespace's blocks take (a storage's: its blocks' namespace's)."""
        found: collections.Counter = collections.Counter()
        for block, namespace in self._recency.items():
            found[namespace] += self.block_bytes if block.storage is None else 0
        for nbytes, blocks in self._storages.values():
            found[self._recency[next(iter(blocks))]] += nbytes
        return dict(found)

    def counted(self, storage: Hashable) -> int | None:
        """The bytes ``storage`` is counted at (None: no block lives in it)."""
        return self._storages[storage][0] if storage in self._storages else None

    def payloads_in(self, storage: Hashable) -> list[Any]:
        """The payloads of the blocks that live in ``storage``."""
        return [block.payload for block in self._storages.get(storage, (0, ()))[1]]

    def rehome(self, storage: Hashable, moved: Callable[[Any], Any]) -> None:
        """Give each block living in ``storage`` the payload ``moved(payload)``: the same one
        (it stays there), or one in its own storage; then evict to fit the budget again."""
        for block in list(self._storages.get(storage, (0, ()))[1]):
            payload = moved(block.payload)
            if payload is not block.payload:
                self._leave(block)
                block.payload, block.storage = payload, None
                self._own += 1
        while self.used_bytes > self.limit_bytes and self._recency:
            self._evict(*next(iter(self._recency.items())))

    @property
    def limit_bytes(self) -> int:
        """What the tree may hold now: its budget, or one storage larger than the budget while
        it is all the tree holds (a sequence too large for the budget is held alone)."""
        if self._own == 0 and len(self._storages) == 1:
            return max(self.budget_bytes, next(iter(self._storages.values()))[0])
        return self.budget_bytes

    def match(self, namespace: Hashable, tokens: Sequence[int]) -> tuple[list[Any], int]:
        """The payloads of the blocks ``tokens`` starts with and how many of its tokens they
        hold: whole blocks, then possibly the first tokens of one more (its payload last).
        The whole blocks are touched (most recently used now)."""
        node, size = self._roots.get(namespace), self.block_tokens
        path: list[_Block] = []
        # Whole blocks, as long as they are in the tree.
        while node is not None:
            key = tuple(tokens[len(path) * size : (len(path) + 1) * size])
            child = node.children.get(key) if len(key) == size else None  # a tail: below
            if child is None:
                break
            path.append(child)
            node = child
        self._touch(path)
        matched = len(path) * size
        payloads = [block.payload for block in path]
        # Then the child that shares the longest start with the next tokens, if any.
        rest = tokens[matched : matched + size]
        if node is not None and rest:
            best, common = None, 0
            for child in node.children.values():
                n = common_prefix_length(child.tokens, rest)
                if n > common:
                    best, common = child, n
            if best is not None:
                payloads.append(best.payload)
                matched += common
        return payloads, matched

    def insert(
        self,
        namespace: Hashable,
        tokens: Sequence[int],
        payloads: Callable[[int, int], list[Any]],
        storage: Hashable | None = None,
        storage_bytes: int = 0,
    ) -> int:
        """Add the blocks of ``tokens`` that the tree lacks, its tail included, evicting the
        least recently used others to make room (as many as fit when not all do, the whole
        blocks first). ``payloads(start, stop)`` gives the payloads of blocks ``start`` to
        ``stop - 1`` of ``tokens`` (the last one possibly a tail). With a ``storage``, they
        are views into it, of ``storage_bytes`` bytes now (counted once; all of them added or
        none), and the blocks already there move into it too. Returns the number of blocks
        added."""
        size = self.block_tokens
        node = self._roots.get(namespace)
        # The blocks already there: touched, so that eviction spares them.
        path: list[_Block] = []
        while node is not None:
            key = tuple(tokens[len(path) * size : (len(path) + 1) * size])
            if len(key) < size or key not in node.children:
                break
            node = node.children[key]
            path.append(node)
        self._touch(path)
        wanted = len(tokens) // size - len(path)
        tail = tuple(tokens[len(tokens) // size * size :])
        if tail and not self._holds(node if wanted == 0 else None, tail):
            wanted += 1  # the tail, last: added only if every whole block before it is
        # Room: evict least recently used blocks outside the path, then add what fits.
        if storage is None:
            room = self._make_room(wanted, set(path))
        else:  # the path's blocks move into the storage too (their old storages may go)
            moved = [index for index, block in enumerate(path) if block.storage is not storage]
            fits = self._make_room_in(storage, storage_bytes, wanted + len(moved), set(path))
            room = wanted if fits else 0
            if fits and moved:
                views = payloads(moved[0], moved[-1] + 1)
                for index in moved:
                    self._leave(path[index])
                    path[index].payload = views[index - moved[0]]
                    path[index].storage = storage
                    self._storages[storage][1].add(path[index])
        if room and not path:  # a namespace's first block (its root may have just gone)
            node = self._roots.setdefault(namespace, _Block((), None))
        start = len(path)
        for offset, payload in enumerate(payloads(start, start + room) if room else ()):
            key = tuple(tokens[(start + offset) * size : (start + offset + 1) * size])
            node.children[key] = node = _Block(key, node, payload, storage)
            path.append(node)
            self._recency[node] = namespace
            if storage is None:
                self._own += 1
            else:
                self._storages[storage][1].add(node)
        self._touch(path)
        return room

    @staticmethod
    def _holds(node: _Block | None, tail: tuple[int, ...]) -> bool:
        """Whether a child of ``node`` starts with ``tail`` (so keeping it adds nothing)."""
        if node is None:
            return False
        return any(child.tokens[: len(tail)] == tail for child in node.children.values())

    def _make_room(self, wanted: int, keep: set[_Block]) -> int:
        """Evict until ``wanted`` more blocks fit (or only ``keep`` is left); how many fit."""
        while self.used_bytes + wanted * self.block_bytes > self.budget_bytes and self._recency:
            block, namespace = next(iter(self._recency.items()))
            if block in keep:  # only the path being extended is left
                break
            self._evict(block, namespace)
        return max(0, min(wanted, (self.budget_bytes - self.used_bytes) // self.block_bytes))

    def _make_room_in(self, storage: Hashable, nbytes: int, wanted: int, keep: set) -> bool:
        """Evict until ``storage``, at ``nbytes`` bytes now, fits (or only ``keep`` is left);
        whether it does (then it is counted at ``nbytes`` from now on). A storage larger than
        the budget fits alone: everything else is evicted."""
        if storage not in self._storages and not wanted:
            return True  # nothing to add, nothing to count
        limit = max(self.budget_bytes, nbytes)

        def over() -> bool:
            counted = self._storages.get(storage, (0,))[0]
            return self.used_bytes - counted + nbytes > limit

        while over() and self._recency:
            block, namespace = next(iter(self._recency.items()))
            if block in keep:  # only the path being extended is left
                break
            self._evict(block, namespace)
        if over():
            return False
        self._storages[storage] = (nbytes, self._storages.get(storage, (0, set()))[1])
        return True

    def _leave(self, block: _Block) -> None:
        """Count ``block`` out of its storage (the storage's bytes go with its last block)."""
        if block.storage is None:
            self._own -= 1
            return
        blocks = self._storages[block.storage][1]
        blocks.discard(block)
        if not blocks:
            del self._storages[block.storage]

    def _evict(self, block: _Block, namespace: Hashable) -> None:
        del self._recency[block]
        self._leave(block)
        parent = block.parent
        del parent.children[block.tokens]
        if parent.parent is None and not parent.children:
            del self._roots[namespace]

    def _touch(self, path: list[_Block]) -> None:
        """Mark ``path`` (root to leaf) used now, its deepest block first."""
        for block in reversed(path):
            self._recency.move_to_end(block)
