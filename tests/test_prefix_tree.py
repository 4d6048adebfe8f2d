"""The prefix cache's index (promptlookup.prefix_tree) against a brute-force reference: the
same longest prefixes, the same evictions (least recently used leaf first, never the path
being extended nor the kept storage's blocks), always within its budget beside the kept
storage; and an agent's long conversation kept while short requests come and go."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.prefix_tree import BlockTree
from promptlookup.prefix_tree import common_prefix_length as _common

BLOCK = 3
BYTES = 10  # a block's own bytes


class Reference:
    """Every cached block as its whole path from the start, ``(namespace, tokens)``, with the
    time it was last used and its storage (None: its own); a tail is a path of a length that
    is not a multiple of ``BLOCK``; a leaf is a tail, or a path no other extends. The kept
    storage: the latest stored at more than the budget, its bytes beside it."""

    def __init__(self, budget_blocks: int) -> None:
        self.budget = BYTES * budget_blocks
        self.used: dict[tuple, int] = {}
        self.home: dict[tuple, str | None] = {}
        self.size: dict[str, int] = {}  # each storage's bytes, counted while blocks live in it
        self.kept: str | None = None
        self.clock = self.first = 0

    # Bytes: each block its own, or its storage's once.
    def live(self) -> set:
        return set(self.home.values()) - {None}

    def kept_bytes(self) -> int:
        return self.size[self.kept] if self.kept in self.live() else 0

    def bytes(self) -> int:
        own = sum(home is None for home in self.home.values())
        return BYTES * own + sum(self.size[storage] for storage in self.live())

    def others(self) -> int:
        return self.bytes() - self.kept_bytes()

    def limit(self) -> int:
        return self.budget + self.kept_bytes()

    # Paths.
    @staticmethod
    def below(entry, other) -> bool:
        """Whether ``other`` hangs below ``entry`` (nothing hangs below a tail)."""
        return (
            len(entry[1]) % BLOCK == 0
            and other[0] == entry[0]
            and len(other[1]) > len(entry[1])
            and other[1][: len(entry[1])] == entry[1]
        )

    @staticmethod
    def parent(entry):
        return entry[0], entry[1][: (len(entry[1]) - 1) // BLOCK * BLOCK]

    def _touch(self, namespace, tokens, blocks: int) -> None:
        for j in range(blocks, 0, -1):  # the deepest first
            self.clock += 1
            self.used[(namespace, tuple(tokens[: j * BLOCK]))] = self.clock

    def _whole(self, namespace, tokens) -> int:
        k = 0
        while (namespace, tuple(tokens[: (k + 1) * BLOCK])) in self.used and (k + 1) * BLOCK <= len(
            tokens
        ):
            k += 1
        return k

    # Eviction: the least recently used leaf outside the kept storage.
    def _evict_one(self, path) -> bool:
        """Evict the least recently used leaf the budget bounds, unless it is on ``path``;
        whether one went."""
        leaves = [
            entry
            for entry in self.used
            if (self.kept is None or self.home[entry] != self.kept)
            and not any(self.below(entry, other) for other in self.used)
        ]
        if not leaves or (victim := min(leaves, key=self.used.__getitem__)) in path:
            return False
        del self.used[victim], self.home[victim]
        return True

    def _demote(self, entries) -> None:
        """``entries`` and the blocks below them: least recently used, in their order."""
        group = {o for o in self.used for e in entries if o == e or self.below(e, o)}
        for entry in sorted(group, key=self.used.__getitem__, reverse=True):
            self.first -= 1
            self.used[entry] = self.first

    def _closed(self, storage, path) -> bool:
        return all(
            entry in path
            or not self.parent(entry)[1]
            or self.home[self.parent(entry)] == storage
            or self.parent(entry) in path
            for entry in self.used
            if self.home[entry] == storage
        )

    def match(self, namespace, tokens) -> int:
        k = self._whole(namespace, tokens)
        self._touch(namespace, tokens, k)
        head, rest = tuple(tokens[: k * BLOCK]), tokens[k * BLOCK : (k + 1) * BLOCK]
        extra = [
            _common(path[k * BLOCK :], rest)
            for ns, path in self.used
            if ns == namespace
            and k * BLOCK < len(path) <= (k + 1) * BLOCK
            and path[: k * BLOCK] == head
        ]
        return k * BLOCK + max(extra, default=0)

    def insert(self, namespace, tokens, storage=None, nbytes=0) -> int:
        k = self._whole(namespace, tokens)
        self._touch(namespace, tokens, k)
        path = [(namespace, tuple(tokens[: j * BLOCK])) for j in range(1, k + 1)]
        wanted = len(tokens) // BLOCK - k
        tail = len(tokens) % BLOCK and not any(
            ns == namespace and len(path) >= len(tokens) and path[: len(tokens)] == tuple(tokens)
            for ns, path in self.used
        )
        wanted += bool(tail)
        if storage is None:
            while self.others() + wanted * BYTES > self.budget and self._evict_one(path):
                pass
            room = max(0, min(wanted, (self.budget - self.others()) // BYTES))
        else:
            room = self._room_in(storage, nbytes, wanted, path)
        for j in range(k + 1, k + room + 1):
            self.used[(namespace, tuple(tokens[: j * BLOCK]))] = 0
            self.home[(namespace, tuple(tokens[: j * BLOCK]))] = storage
        if tail and room == wanted:  # the tail, touched before the whole blocks above it
            self.clock += 1
            self.used[(namespace, tuple(tokens))] = self.clock
        self._touch(namespace, tokens, min(k + room, len(tokens) // BLOCK))
        return room

    def _room_in(self, storage, nbytes, wanted, path) -> int:
        """Room for ``wanted`` blocks in ``storage`` (all or none), ``path`` moved into it."""
        kept = self.kept if self.kept in self.live() else None
        keeping = storage == kept or nbytes > self.budget
        moved = [
            entry
            for entry in path
            if self.home[entry] != storage and (keeping or kept is None or self.home[entry] != kept)
        ]
        if storage not in self.live() and not wanted and not moved:
            return 0
        if keeping and not self._closed(storage, path):
            return 0
        if not keeping:

            def over() -> bool:
                counted = self.size[storage] if storage in self.live() else 0
                return self.others() - counted + nbytes > self.budget

            while over() and self._evict_one(path):
                pass
            if over():
                return 0
        self.size[storage] = nbytes
        for entry in moved:
            self.home[entry] = storage
        if keeping:
            old = self.kept if self.kept in self.live() else None
            self.kept = storage
            if old is not None and old != storage:
                self._demote([entry for entry in self.used if self.home[entry] == old])
            while self.others() > self.budget and self._evict_one([]):
                pass
        return wanted

    def rehome(self, storage, cut: int) -> None:
        """The blocks of ``storage`` longer than ``cut`` tokens copied out of it."""
        kept = self.kept is not None and self.kept == storage and storage in self.live()
        left = [e for e in self.used if self.home[e] == storage and len(e[1]) > cut]
        for entry in left:
            self.home[entry] = None
        if kept:
            rest = [e for e in self.used if self.home[e] == storage]
            if not rest or not self._closed(storage, []):
                self.kept, left = None, [*left, *rest]
            self._demote(left)
        while self.bytes() > self.limit() and self._evict_one([]):
            pass


def views(tokens):
    """Payloads: each block its whole path from the start."""
    return lambda start, stop, t=tuple(tokens): [t[: (j + 1) * BLOCK] for j in range(start, stop)]


def held(tree: BlockTree) -> dict[tuple, bool]:
    """Every block of ``tree`` as the reference names it, whether it is kept; and checks that
    each hangs from its namespace's root."""
    kept = getattr(tree, "_kept_blocks", {})
    found = {}
    for block, namespace in [*tree._recency.items(), *kept.items()]:
        tokens, node = [], block
        while node.parent is not None:
            assert node.parent.children[node.tokens] is node  # still linked
            tokens[:0] = node.tokens
            node = node.parent
        assert node is tree._roots[namespace]  # never orphaned
        found[(namespace, tuple(tokens))] = block in kept
    return found


tokens = st.lists(st.integers(0, 2), max_size=14)  # a small vocabulary
operations = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["insert", "match"]), st.sampled_from([None, "a", "b"]), tokens),
        # A sequence's own buffers (one of three), its first tokens, its bytes in blocks.
        st.tuples(st.just("store"), st.integers(0, 2), st.integers(0, 14), st.integers(1, 12)),
        # Its blocks past a point copied out of its buffers.
        st.tuples(st.just("rehome"), st.integers(0, 2), st.integers(0, 14)),
    ),
    max_size=40,
)
#: The namespace of each sequence whose buffers hold blocks.
OWNERS = [None, "a", None]


@settings(max_examples=400, deadline=None)
@given(operations, tokens, st.lists(tokens, min_size=3, max_size=3), st.integers(1, 8))
def test_block_tree_matches_the_brute_force_reference(ops, start, ends, budget_blocks):
    """Copies, sequences' buffers (that start alike: ``start``), rehoming and matches in any
    order: the same blocks, the same ones kept, the same bytes."""
    sequences = [[*start, *end] for end in ends]
    tree = BlockTree(BLOCK, block_bytes=BYTES, budget_bytes=BYTES * budget_blocks)
    reference = Reference(budget_blocks)
    storages = [object() for _ in OWNERS]
    for kind, first, second, *more in ops:
        if kind == "insert":
            assert tree.insert(first, second, views(second)) == reference.insert(first, second)
        elif kind == "store":
            namespace, seq = OWNERS[first], sequences[first][:second]
            added = tree.insert(namespace, seq, views(seq), storages[first], BYTES * more[0])
            assert added == reference.insert(namespace, seq, f"s{first}", BYTES * more[0])
        elif kind == "rehome":
            tree.rehome(
                storages[first], lambda p, cut=second: tuple(list(p)) if len(p) > cut else p
            )
            reference.rehome(f"s{first}", second)
        else:
            payloads, matched = tree.match(first, second)
            assert matched == reference.match(first, second)
            # Each payload is the block it stands for: whole blocks of the prefix, then one
            # that starts with the matched tokens' rest.
            whole = matched // BLOCK
            for j, payload in enumerate(payloads[:whole]):
                assert payload == tuple(second[: (j + 1) * BLOCK])
            if len(payloads) > whole:
                assert _common(payloads[-1], second) >= matched
            assert len(payloads) == -(-matched // BLOCK)
        # The same blocks, the same kept ones, the same bytes, within the limit.
        kept = {e for e in reference.used if reference.kept and reference.home[e] == reference.kept}
        assert held(tree) == {entry: entry in kept for entry in reference.used}
        assert tree.used_bytes == reference.bytes() <= tree.limit_bytes == reference.limit()
        assert sum(tree.bytes_by_namespace().values()) == tree.used_bytes


def test_a_tenant_never_finds_another_tenants_blocks():
    tree = BlockTree(BLOCK, block_bytes=1, budget_bytes=100)
    tree.insert("a", list(range(12)), lambda start, stop: list(range(start, stop)))
    assert tree.match("a", list(range(12)))[1] == 12
    assert tree.match("b", list(range(12))) == ([], 0)
    assert tree.match(None, list(range(12))) == ([], 0)


def test_sequences_that_start_alike_share_their_blocks():
    tree = BlockTree(BLOCK, block_bytes=1, budget_bytes=100)
    assert tree.insert(None, [1, 2, 3, 4, 5, 6], lambda a, b: list(range(a, b))) == 2
    assert tree.insert(None, [1, 2, 3, 4, 5, 6, 7, 8, 9], lambda a, b: list(range(a, b))) == 1
    assert tree.blocks == 3
    # A prefix found to the token: the first tokens of a block.
    assert tree.match(None, [1, 2, 3, 4, 5, 0]) == ([0, 1], 5)


def side_request(tree: BlockTree, index: int, storage: object | None = None) -> list[int]:
    """A short request of its own (two blocks and a tail, tokens no other starts with),
    copied or in its own buffers of two blocks' bytes; its tokens."""
    tokens = [1000 + index, *range(6)]
    tree.insert(None, tokens, views(tokens), storage, 2 * BYTES if storage else 0)
    return tokens


def test_a_long_conversation_is_kept_while_side_requests_evict_each_other():
    """An agent's conversation larger than the budget stays whatever comes after it; the
    budget bounds the short requests between its turns, which evict each other."""
    tree = BlockTree(BLOCK, block_bytes=BYTES, budget_bytes=10 * BYTES)
    conversation, agent = list(range(3 * 650)), object()  # 650 blocks in its buffers
    assert tree.insert(None, conversation, views(conversation), agent, 700 * BYTES) == 650
    assert tree.limit_bytes == 710 * BYTES
    sides = []
    for index in range(300):  # copies and buffers of their own, in turn
        sides.append(side_request(tree, index, object() if index % 2 else None))
        assert tree.used_bytes - 700 * BYTES <= tree.budget_bytes
        assert tree.match(None, [*conversation, 5])[1] == len(conversation)
    assert tree.match(None, sides[-1])[1] == len(sides[-1])  # the latest ones held
    assert tree.match(None, sides[0])[1] == 0  # the first ones gone
    assert len(held(tree)) == tree.blocks  # every block hanging from its root


def test_a_later_long_conversation_is_kept_instead_and_the_first_goes_first():
    """A second conversation larger than the budget is kept instead: the first, now larger
    than anything the budget holds, goes before the short requests stored after it; the
    blocks the second shares with it move into its buffers and stay."""
    tree = BlockTree(BLOCK, block_bytes=BYTES, budget_bytes=10 * BYTES)
    first, second = list(range(60)), [*range(30), *range(500, 530)]  # sharing 10 blocks
    assert tree.insert(None, first, views(first), object(), 30 * BYTES) == 20
    sides = [side_request(tree, index) for index in range(3)]  # 9 blocks' bytes
    assert tree.insert(None, second, views(second), object(), 25 * BYTES) == 10
    assert tree.limit_bytes == 35 * BYTES and tree.used_bytes == 34 * BYTES
    assert tree.match(None, first)[1] == 30  # its own blocks gone, the shared ones kept
    assert all(tree.match(None, side)[1] == len(side) for side in sides)
    assert tree.match(None, second)[1] == 60


def test_eviction_never_orphans_a_block_below_or_beside_the_kept_conversation():
    """Requests that go on from the kept conversation's blocks (copied, or in buffers of
    their own, sharing its blocks without taking them) are evicted leaves first; when
    another conversation is kept instead, the first one's blocks go after those below
    them."""
    tree = BlockTree(BLOCK, block_bytes=BYTES, budget_bytes=6 * BYTES)
    conversation, agent = list(range(30)), object()
    tree.insert(None, conversation, views(conversation), agent, 20 * BYTES)
    for index in range(12):  # branches off its blocks at various depths
        branch = [*conversation[: 3 * (index % 10)], 100 + index, 7, 7, 7]
        storage = object() if index % 3 == 0 else None
        tree.insert(None, branch, views(branch), storage, 2 * BYTES if storage else 0)
        assert tree.used_bytes - 20 * BYTES <= tree.budget_bytes
        assert all(
            kept
            for path, kept in held(tree).items()
            if len(path[1]) <= 30 and path[1] == tuple(conversation[: len(path[1])])
        )
    other = list(range(200, 230))
    tree.insert(None, other, views(other), object(), 20 * BYTES)
    found = held(tree)  # each hanging from its root
    assert tree.match(None, conversation)[1] == 0 and tree.match(None, other)[1] == 30
    assert tree.used_bytes <= tree.limit_bytes == 26 * BYTES and len(found) == tree.blocks


def test_buffers_whose_blocks_hang_below_another_storage_are_not_kept():
    """Buffers stored at more than the budget with a block hanging below another storage's
    (not on the path stored now) are not kept (eviction could orphan that block): nothing is
    added, and the caller copies instead."""
    tree = BlockTree(BLOCK, block_bytes=BYTES, budget_bytes=8 * BYTES)
    first, second, tokens = object(), object(), [0, 1, 2] * 3
    assert tree.insert(None, tokens, views(tokens), first, 2 * BYTES) == 3
    tree.insert(None, tokens[:6], views(tokens), second, 2 * BYTES)  # its first two blocks
    assert tree.insert(None, tokens[:3], views(tokens), first, 9 * BYTES) == 0
    assert tree.limit_bytes == tree.budget_bytes and tree.counted(first) == 2 * BYTES
