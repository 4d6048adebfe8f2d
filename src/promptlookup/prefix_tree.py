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
- *Eviction*: the tree holds at most ``budget_bytes`` of payloads and storages (the kept
  storage's besides: below); the least recently used block goes first (a storage's bytes go with its last block). Every use
  touches a block and all its ancestors, the deepest first, so a block is never used more
  recently than its parent and the least recently used block is a leaf: evicting it never
  orphans another. A namespace whose last block goes is dropped.
- *The kept storage*: the latest storage stored at more than the budget (an agent's long
  conversation) is kept whatever else comes, its bytes beside the budget
  (:attr:`BlockTree.limit_bytes`): eviction skips its blocks (they are not in its order at
  all, so skipping costs nothing), which hang from the root through each other only, and
  the budget bounds everything else; a later request that starts like it shares its blocks
  without taking them out of it. It is kept until a later storage larger than the budget is
  stored (then its blocks not shared with that one, and the blocks below them, become the
  least recently used: it goes first), or until its blocks leave it
  (:meth:`BlockTree.rehome`: those that leave go first, the others stay kept while they
  still hang from the root through it).

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
    __slots__ = ("tokens", "parent", "children", "payload", "storage", "used")

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
        self.used = 0  # when it was last used (a stamp of its tree's clock)


class BlockTree:
    """Token blocks in a tree per namespace, within a byte budget (see the module doc)."""

    def __init__(self, block_tokens: int, block_bytes: int, budget_bytes: int) -> None:
        self.block_tokens, self.block_bytes, self.budget_bytes = (
            block_tokens,
            block_bytes,
            budget_bytes,
        )
        self._roots: dict[Hashable, _Block] = {}
        #: The blocks eviction may take, least recently used first (never before their
        #: descendants); and those of the kept storage (see :attr:`limit_bytes`), which it
        #: may not: each with its namespace.
        self._recency: collections.OrderedDict[_Block, Hashable] = collections.OrderedDict()
        self._kept_blocks: dict[_Block, Hashable] = {}
        self._kept: Hashable | None = None
        #: Shared storages: their bytes and the blocks living in them; and the blocks that
        #: are their own storage.
        self._storages: dict[Hashable, tuple[int, set[_Block]]] = {}
        self._own = 0
        #: The last use stamp given, and the first (blocks put before all others go below it).
        self._clock = self._first = 0

    @property
    def blocks(self) -> int:
        return len(self._recency) + len(self._kept_blocks)

    @property
    def used_bytes(self) -> int:
        shared = sum(nbytes for nbytes, _ in self._storages.values())
        return self._own * self.block_bytes + shared

    @property
    def limit_bytes(self) -> int:
        """What the tree may hold now: its budget, and beside it the kept storage's bytes (the
        latest storage stored at more than the budget, while blocks live in it)."""
        return self.budget_bytes + self._kept_bytes()

    def _kept_bytes(self) -> int:
        return self._storages[self._kept][0] if self._kept in self._storages else 0

    def bytes_by_namespace(self) -> dict[Hashable, int]:
        """The bytes each namespace's blocks take (a storage's: its blocks' namespace's)."""
        found: collections.Counter = collections.Counter()
        for block, namespace in (*self._recency.items(), *self._kept_blocks.items()):
            found[namespace] += self.block_bytes if block.storage is None else 0
        for storage, (nbytes, blocks) in self._storages.items():
            some = next(iter(blocks))
            found[(self._kept_blocks if storage is self._kept else self._recency)[some]] += nbytes
        return dict(found)

    def counted(self, storage: Hashable) -> int | None:
        """The bytes ``storage`` is counted at (None: no block lives in it)."""
        return self._storages[storage][0] if storage in self._storages else None

    def payloads_in(self, storage: Hashable) -> list[Any]:
        """The payloads of the blocks that live in ``storage``."""
        return [block.payload for block in self._storages.get(storage, (0, ()))[1]]

    def rehome(self, storage: Hashable, moved: Callable[[Any], Any]) -> None:
        """Give each block living in ``storage`` the payload ``moved(payload)``: the same one
        (it stays there), or one in its own storage; then evict to fit the budget again. Blocks
        that leave the kept storage are no longer kept (nor is the rest, unless each of its
        blocks still hangs from the root through it): they go first."""
        left, was_kept = [], storage is not None and storage is self._kept
        for block in list(self._storages.get(storage, (0, ()))[1]):
            payload = moved(block.payload)
            if payload is not block.payload:
                self._leave(block)
                block.payload, block.storage = payload, None
                self._own += 1
                left.append(block)
        if was_kept:
            rest = self._storages.get(storage, (0, set()))[1]
            if not self._closed(storage, rest, set()):
                left, self._kept = [*left, *rest], None
            self._demote(left)
        while self.used_bytes > self.limit_bytes and self._recency:
            self._evict(*next(iter(self._recency.items())))

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
            room = self._make_room_in(storage, storage_bytes, wanted, path, payloads)
        if room and not path:  # a namespace's first block (its root may have just gone)
            node = self._roots.setdefault(namespace, _Block((), None))
        start = len(path)
        kept = storage is not None and storage is self._kept
        for offset, payload in enumerate(payloads(start, start + room) if room else ()):
            key = tuple(tokens[(start + offset) * size : (start + offset + 1) * size])
            node.children[key] = node = _Block(key, node, payload, storage)
            path.append(node)
            (self._kept_blocks if kept else self._recency)[node] = namespace
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

    def _others(self) -> int:
        """The bytes held within the budget: all but the kept storage's."""
        return self.used_bytes - self._kept_bytes()

    def _make_room(self, wanted: int, keep: set[_Block]) -> int:
        """Evict until ``wanted`` more blocks fit (or only ``keep`` is left); how many fit."""
        while self._others() + wanted * self.block_bytes > self.budget_bytes and self._recency:
            block, namespace = next(iter(self._recency.items()))
            if block in keep:  # only the path being extended is left
                break
            self._evict(block, namespace)
        return max(0, min(wanted, (self.budget_bytes - self._others()) // self.block_bytes))

    def _make_room_in(
        self, storage: Hashable, nbytes: int, wanted: int, path: list[_Block], payloads: Callable
    ) -> int:
        """Make room for ``wanted`` more blocks in ``storage``, at ``nbytes`` bytes now, and
        move ``path``'s blocks into it: all or none; how many are added (``wanted`` or 0).
        Stored at more than the budget (or kept already), it is kept: it always fits, beside
        the budget, after ``path``'s blocks move into it (the storage kept before, if another,
        goes first: :meth:`_demote`). Else it fits within the budget or not at all, and the
        kept storage's blocks on ``path`` stay where they are."""
        kept = storage is self._kept or nbytes > self.budget_bytes
        moved = [
            index
            for index, block in enumerate(path)
            if block.storage is not storage and (kept or block not in self._kept_blocks)
        ]
        if storage not in self._storages and not wanted and not moved:
            return 0  # nothing to add, nothing to count
        held, keep = self._storages.get(storage, (0, set()))[1], set(path)
        if kept and not self._closed(storage, held, keep):
            return 0  # a block of it would hang below one it cannot keep
        if not kept:  # evict until it fits within the budget

            def over() -> bool:
                counted = self._storages.get(storage, (0,))[0]
                return self._others() - counted + nbytes > self.budget_bytes

            while over() and self._recency:
                block, namespace = next(iter(self._recency.items()))
                if block in keep:  # only the path being extended is left
                    break
                self._evict(block, namespace)
            if over() or (storage not in self._storages and not wanted and not moved):
                return 0  # too large, or nothing to add and its blocks gone
            held = self._storages.get(storage, (0, set()))[1]
        self._storages[storage] = (nbytes, held)
        views = payloads(moved[0], moved[-1] + 1) if moved else []
        for index in moved:
            self._leave(path[index])
            path[index].payload = views[index - moved[0]]
            path[index].storage = storage
            held.add(path[index])
        if kept:  # then whatever else is evicted to fit the budget
            self._keep(storage)
            while self._others() > self.budget_bytes and self._recency:
                self._evict(*next(iter(self._recency.items())))
        return wanted

    @staticmethod
    def _closed(storage: Hashable, blocks: set[_Block], path: set[_Block]) -> bool:
        """Whether each of ``blocks`` hangs from its root through blocks of ``storage`` or
        ``path`` only (so that keeping them never keeps a block below one evicted)."""
        return all(
            block in path
            or block.parent.parent is None
            or block.parent.storage is storage
            or block.parent in path
            for block in blocks
        )

    def _keep(self, storage: Hashable) -> None:
        """Keep ``storage``'s blocks from eviction (and no longer the kept storage's before)."""
        old, self._kept = self._kept, storage
        if old is not None and old is not storage:
            self._demote(list(self._storages.get(old, (0, ()))[1]))
        for block in self._storages[storage][1]:
            if block in self._recency:
                self._kept_blocks[block] = self._recency.pop(block)

    def _demote(self, blocks: list[_Block]) -> None:
        """Make ``blocks`` (no longer kept) and the blocks below them the least recently used,
        in the order they were used (a block still after its descendants)."""
        group: dict[_Block, Hashable] = {}
        todo = list(blocks)
        while todo:
            block = todo.pop()
            if block not in group:
                kept = block in self._kept_blocks
                group[block] = (self._kept_blocks if kept else self._recency).pop(block)
                todo.extend(block.children.values())
        for block in sorted(group, key=lambda block: block.used, reverse=True):
            self._first -= 1  # each before all others, the most recently used first
            block.used = self._first
            self._recency[block] = group[block]
            self._recency.move_to_end(block, last=False)

    def _leave(self, block: _Block) -> None:
        """Count ``block`` out of its storage (the storage's bytes go with its last block)."""
        if block.storage is None:
            self._own -= 1
            return
        blocks = self._storages[block.storage][1]
        blocks.discard(block)
        if not blocks:
            del self._storages[block.storage]
            if block.storage is self._kept:
                self._kept = None

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
            self._clock += 1
            block.used = self._clock
            if block in self._recency:
                self._recency.move_to_end(block)
