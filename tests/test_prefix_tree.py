"""The prefix cache's index (promptlookup.prefix_tree) against a brute-force reference: the
same longest prefixes, the same evictions (least recently used first, never the path being
extended), always within its budget."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.prefix_tree import BlockTree
from promptlookup.prefix_tree import common_prefix_length as _common

BLOCK = 3


class Reference:
    """Every cached block as its whole path from the start, ``(namespace, tokens)``, with the
    time it was last used; a tail is a path of a length that is not a multiple of ``BLOCK``; a
    leaf is a tail, or a path no other extends."""

    def __init__(self, budget_blocks: int) -> None:
        self.budget = budget_blocks
        self.used: dict[tuple, int] = {}
        self.clock = 0

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

    def insert(self, namespace, tokens) -> int:
        k = self._whole(namespace, tokens)
        self._touch(namespace, tokens, k)
        path = {(namespace, tuple(tokens[: j * BLOCK])) for j in range(1, k + 1)}
        wanted = len(tokens) // BLOCK - k
        tail = len(tokens) % BLOCK and not any(
            ns == namespace and len(path) >= len(tokens) and path[: len(tokens)] == tuple(tokens)
            for ns, path in self.used
        )
        wanted += bool(tail)
        while len(self.used) + wanted > self.budget and self.used:
            leaves = [
                entry
                for entry in self.used
                if len(entry[1]) % BLOCK
                or not any(
                    other[0] == entry[0]
                    and len(other[1]) > len(entry[1])
                    and other[1][: len(entry[1])] == entry[1]
                    for other in self.used
                )
            ]
            victim = min(leaves, key=self.used.__getitem__)
            if victim in path:
                break
            del self.used[victim]
        room = max(0, min(wanted, self.budget - len(self.used)))
        for j in range(k + 1, k + room + 1):
            self.used[(namespace, tuple(tokens[: j * BLOCK]))] = 0
        if tail and room == wanted:  # the tail, touched before the whole blocks above it
            self.clock += 1
            self.used[(namespace, tuple(tokens))] = self.clock
        self._touch(namespace, tokens, min(k + room, len(tokens) // BLOCK))
        return room


operations = st.lists(
    st.tuples(
        st.booleans(),  # insert, else match
        st.sampled_from([None, "a", "b"]),  # the namespace
        st.lists(st.integers(0, 2), max_size=14),  # tokens of a small vocabulary
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(operations, st.integers(1, 8))
def test_block_tree_matches_the_brute_force_reference(ops, budget_blocks):
    tree = BlockTree(BLOCK, block_bytes=10, budget_bytes=10 * budget_blocks)
    reference = Reference(budget_blocks)
    for inserting, namespace, tokens in ops:
        if inserting:
            added = tree.insert(
                namespace,
                tokens,
                lambda start, stop, t=tuple(tokens): [
                    t[: (j + 1) * BLOCK] for j in range(start, stop)
                ],  # fmt: skip
            )
            assert added == reference.insert(namespace, tokens)
        else:
            payloads, matched = tree.match(namespace, tokens)
            assert matched == reference.match(namespace, tokens)
            # Each payload is the block it stands for: whole blocks of the prefix, then one
            # that starts with the matched tokens' rest.
            whole = matched // BLOCK
            for j, payload in enumerate(payloads[:whole]):
                assert payload == tuple(tokens[: (j + 1) * BLOCK])
            if len(payloads) > whole:
                assert _common(payloads[-1], tokens) >= matched
            assert len(payloads) == -(-matched // BLOCK)
        assert tree.used_bytes <= tree.budget_bytes
        assert tree.blocks == len(reference.used)


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
