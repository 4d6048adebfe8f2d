"""Keys and values held once (promptlookup.prefix_cache, docs/design.md): the prefix cache holds
a sequence's blocks in its own buffers, and a later sequence takes those buffers over where
nobody else uses them. Every output equals the output without the cache (greedy, token for
token) across joins, ends, evictions and concurrent requests sharing a prefix; whatever a
sequence starts from is exactly its prompt's keys and values (a brute-force reference over
any order of requests); the budget counts every buffer once."""

from __future__ import annotations

import gc
import random
import weakref

import pytest
import torch
from _fixtures import one_thread  # noqa: F401 (fixture)
from hypothesis import given, settings
from hypothesis import strategies as st
from test_prefix_cache import tiny
from test_prefix_seam import TupleCache, TupleTarget

from promptlookup.backends.base import SharingBlockCache
from promptlookup.prefix_cache import PrefixCache


class View:
    """Positions ``start`` to ``stop - 1`` of a :class:`SharingTupleCache`, in place."""

    def __init__(self, storage, start: int, stop: int) -> None:
        self.storage, self.start, self.stop = storage, start, stop

    def copy(self) -> tuple:
        return tuple(self.storage.entries[self.start : self.stop])


class SharingTupleCache(TupleCache):
    """A :class:`TupleCache` that shares its blocks in place and checks that nobody rewrites
    a position a view holds."""

    def __init__(self, tokens=()) -> None:
        super().__init__(tokens)
        self.frozen = 0

    @property
    def held_bytes(self) -> int:
        return 16 * (len(self.entries) + 8)  # spare room too

    def share_blocks(self, start: int, stop: int, block_tokens: int) -> list:
        self.frozen = max(self.frozen, stop)
        return [
            View(self, a, min(a + block_tokens, stop)) for a in range(start, stop, block_tokens)
        ]

    def resume(self, length: int) -> None:
        self.frozen = length
        self.crop(length)

    def crop(self, max_length: int) -> None:
        assert max_length >= self.frozen, "a position held in place would be rewritten"
        super().crop(max_length)

    def extend(self, tokens) -> None:
        """A forward pass: the next positions' entries."""
        self.entries += [(len(self.entries) + i, token) for i, token in enumerate(tokens)]

    def write_prefix(self, blocks, length: int) -> None:
        rows = [e for b in blocks for e in (b.copy() if isinstance(b, View) else b)]
        self.entries += rows[: length - len(self.entries)]


class SharingTupleTarget(TupleTarget):
    def new_sequence(self) -> SharingTupleCache:
        return SharingTupleCache()


def counted_bytes(cache: PrefixCache, block_bytes: int) -> int:
    """The cache's bytes counted again from its blocks: each buffer once, each copy alone."""
    tree = cache._tree
    storages, own = {}, 0
    for block in [*tree._recency, *tree._kept_blocks]:
        if block.storage is None:
            own += 1
        else:
            storages[id(block.storage)] = block.storage.held_bytes
    return own * block_bytes + sum(storages.values())


requests = st.lists(
    st.tuples(
        st.lists(st.integers(1, 3), min_size=1, max_size=14),  # prompt
        st.lists(st.integers(1, 3), max_size=6),  # answer
        st.sampled_from("ab"),  # tenant
        st.integers(0, 2),  # how many later requests start before it ends
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=150, deadline=None)
@given(requests=requests, budget_blocks=st.sampled_from([3, 12, 1000]), grow=st.booleans())
def test_any_order_of_requests_starts_each_from_exactly_its_prompt(requests, budget_blocks, grow):
    """Requests join (taking over finished buffers or copying), store their prompt, overlap and
    end in any order: each starts from exactly the entries of its own prompt's first tokens, at
    least as many as any stored sequence of its tenant still alive shares with it (all of them,
    with room for everything), no position held in place is ever rewritten, and the budget
    counts every buffer once."""
    target = SharingTupleTarget()
    block_bytes = target.kv_bytes_per_token * 4
    cache = PrefixCache(mib=budget_blocks * block_bytes / 2**20, block_tokens=4)
    stored: dict[str, list[list[int]]] = {"a": [], "b": []}
    running: list[tuple] = []  # (cache, tokens, tenant, steps left)
    history = [list(prompt) for prompt, *_ in requests]
    for index, (prompt, answer, tenant, overlap) in enumerate(requests):
        if grow and index:  # a conversation: the last prompt, its answer, then this one
            prompt = [*history[index - 1], *requests[index - 1][1], *prompt]
            history[index] = prompt
        sequence, found = cache.join(target, target.new_sequence(), prompt, tenant)
        assert sequence.entries == list(enumerate(prompt[:found]))
        if budget_blocks == 1000:  # nothing evicted: the longest stored prefix
            longest = max(
                (
                    next(n for n in range(min(len(s), len(prompt)), -1, -1) if s[:n] == prompt[:n])
                    for s in stored[tenant]
                ),
                default=0,
            )
            assert found == longest
        sequence.extend(prompt[found:])
        cache.store(target, sequence, prompt, tenant)  # its prompt, while it runs
        stored[tenant].append(prompt)
        running.append((sequence, [*prompt, *answer], tenant, overlap))
        for entry in list(running):  # the ones whose overlap is over end
            done, tokens, who, left = entry
            running.remove(entry)
            if left:
                running.append((done, tokens, who, left - 1))
                continue
            done.extend(tokens[done.get_seq_length() :])
            cache.store(target, done, tokens, who, ended=True)
            stored[who].append(tokens)
        assert cache.used_bytes == counted_bytes(cache, block_bytes) <= cache.limit_bytes
    for done, tokens, who, _ in running:
        done.extend(tokens[done.get_seq_length() :])
        cache.store(target, done, tokens, who, ended=True)
        assert cache.used_bytes == counted_bytes(cache, block_bytes) <= cache.limit_bytes


def test_the_native_engines_caches_share_their_blocks():
    lm = tiny("float32")
    assert isinstance(lm.target.new_sequence(), SharingBlockCache)


def finished_turn():
    """A tiny model's target, a 90-token prompt, a prefix cache and the finished sequence of
    that prompt, stored in it (its buffers held in place)."""
    lm = tiny("float32")
    target, prompt = lm.target, list(range(1, 31)) * 3  # 90 tokens
    cache = PrefixCache(mib=64, block_tokens=16)
    first = target.new_sequence()
    target.forward_batch([first], [prompt], [0])
    cache.store(target, first, prompt, ended=True)
    return target, prompt, cache, first


def test_a_conversations_next_turn_takes_its_buffers_over_and_copies_nothing():
    target, prompt, cache, first = finished_turn()
    assert cache.used_bytes == first.held_bytes  # the buffers, counted once
    keys = [layer.keys.clone() for layer in first.layers]
    # The next turn: the whole prompt, then more; it goes on in the same buffers.
    joined, found = cache.join(target, target.new_sequence(), [*prompt, 5, 6])
    assert joined is first and found == 90
    for layer, before in zip(joined.layers, keys):
        assert torch.equal(layer.keys, before)
    # While it runs, another request with the same prefix copies it.
    other, found = cache.join(target, target.new_sequence(), [*prompt, 7])
    assert other is not first and found == 90
    for layer, before in zip(other.layers, keys):
        assert torch.equal(layer.keys, before)
    with pytest.raises(ValueError, match="held in place"):
        joined.crop(80)


def test_blocks_past_a_taken_over_prefix_are_copied_out_first():
    target, prompt, cache, first = finished_turn()
    keys = [layer.keys.clone() for layer in first.layers]
    # Another request shares 70 tokens (mid-block), then says something else.
    branch = [*prompt[:70], 9, 9, 9, 9]
    joined, found = cache.join(target, target.new_sequence(), branch)
    assert joined is first and found == 70  # the 20 positions after: copied out
    target.forward_batch([joined], [branch[70:]], [0])  # rewrites positions 70 to 73
    cache.store(target, joined, branch, ended=True)
    # The first sequence's blocks are still exactly its own.
    again, found = cache.join(target, target.new_sequence(), [*prompt, 3])
    assert found == 90
    for layer, before in zip(again.layers, keys):
        assert torch.equal(layer.keys, before)


def test_a_buffer_goes_with_its_last_block():
    lm = tiny("float32")
    target = lm.target
    budget = 2 * first_bytes(lm)  # room for two sequences' buffers
    cache = PrefixCache(mib=budget / 2**20, block_tokens=16)
    rng = random.Random(3)
    prompts = [[rng.randrange(1, 32) for _ in range(100)] for _ in range(3)]
    sequences = []
    for prompt in prompts:
        sequence = target.new_sequence()
        target.forward_batch([sequence], [prompt], [0])
        cache.store(target, sequence, prompt, ended=True)
        sequences.append(weakref.ref(sequence))
        assert cache.used_bytes == sequence.held_bytes * min(len(sequences), 2) <= budget
    del sequence
    gc.collect()
    assert sequences[0]() is None and sequences[2]() is not None  # the oldest one freed


@pytest.mark.parametrize("disk", [False, True], ids=["memory", "with-disk"])
def test_a_sequence_larger_than_the_budget_is_kept_in_place_beside_it(disk, tmp_path):
    """One conversation too long for the budget is still held once, in place, beside the
    budget: short requests between its turns evict each other, never it, and its next turn
    goes on in its buffers (not read back from disk); a later conversation too long for the
    budget is kept instead, and the first one goes."""
    lm = tiny("float32")
    target, rng = lm.target, random.Random(5)
    folder = tmp_path if disk else None
    cache = PrefixCache(mib=1.5 * first_bytes(lm) / 2**20, block_tokens=16, directory=folder)

    def stored(tokens: list[int]):
        sequence = target.new_sequence()
        target.forward_batch([sequence], [tokens], [0])
        cache.store(target, sequence, tokens, ended=True)
        return sequence

    short, long, other = ([rng.randrange(1, 32) for _ in range(n)] for n in (40, 600, 500))
    first, big = stored(short), stored(long)
    assert big.held_bytes > cache.budget_bytes
    # Both held: the long one beside the budget, counted once.
    assert cache.limit_bytes == cache.budget_bytes + big.held_bytes
    assert cache.used_bytes == first.held_bytes + big.held_bytes
    assert cache.held([*short, 1]) == 40 and cache.held([*long, 1]) == 600
    # Short side requests: each evicts the one before, never the long conversation.
    for _ in range(5):
        side = stored([rng.randrange(1, 32) for _ in range(30)])
        assert cache.used_bytes == side.held_bytes + big.held_bytes <= cache.limit_bytes
        assert cache.held([*long, 1]) == 600
    assert cache.held([*short, 1]) == 0
    # Its next turn takes its buffers over (nothing copied) and is kept again when stored.
    joined, found = cache.join(target, target.new_sequence(), [*long, 7])
    assert joined is big and found == 600
    target.forward_batch([joined], [[7]], [0])
    cache.store(target, joined, [*long, 7], ended=True)
    side = stored([rng.randrange(1, 32) for _ in range(30)])
    assert cache.held([*long, 7]) == 601
    # Another long conversation is kept instead: the first one goes, the budget bounds the rest.
    second = stored(other)
    assert cache.limit_bytes == cache.budget_bytes + second.held_bytes
    assert cache.held([*long, 1]) == 0 and cache.held([*other, 1]) == 500
    assert cache.used_bytes == side.held_bytes + second.held_bytes


def first_bytes(lm) -> int:
    """The bytes of one short sequence's buffers (their first reservation)."""
    sequence = lm.target.new_sequence()
    lm.target.forward_batch([sequence], [[1, 2, 3]], [0])
    return sequence.held_bytes


def conversations(lm, cache, count: int, turns: int, concurrent: bool) -> list:
    """``count`` conversations of ``turns`` turns (each turn's prompt the last one, its answer
    and new tokens), one at a time or all at once each turn; their token ids."""
    rng = random.Random(11)
    vocab = lm.tokenizer.vocab_size
    system = [rng.randrange(1, vocab) for _ in range(40)]  # shared by every conversation
    prompts = [
        [*system, *(rng.randrange(1, vocab) for _ in range(30 + 9 * i))] for i in range(count)
    ]
    outputs = []
    for _ in range(turns):
        if concurrent:
            results = lm.generate_batch(prompts, max_batch=3, prefix_cache=cache, max_new_tokens=12)
        else:
            results = [lm.generate(p, prefix_cache=cache, max_new_tokens=12) for p in prompts]
        outputs.append([r.token_ids for r in results])
        prompts = [
            [*p, *r.token_ids, *(rng.randrange(1, vocab) for _ in range(7))]
            for p, r in zip(prompts, results)
        ]
    return outputs


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "quantized"])
@pytest.mark.parametrize("concurrent", [False, True], ids=["one-by-one", "at-once"])
@pytest.mark.parametrize("room", [64, 2.5], ids=["room", "evicting"])
def test_conversations_held_once_answer_as_without_the_cache(kind, concurrent, room):
    """Four conversations of four turns sharing a system prompt, one by one or at once, with
    room for all of them or for about two sequences' buffers (evicting), against the cache
    off."""
    lm = tiny(kind)
    without = conversations(lm, False, 4, 4, concurrent)
    mib = 64 if room == 64 else room * first_bytes(lm) / 2**20
    cache = PrefixCache(mib=mib, block_tokens=16)
    assert conversations(lm, cache, 4, 4, concurrent) == without
    assert cache.used_bytes <= cache.limit_bytes


def test_a_conversation_from_disk_and_memory_answers_as_without_the_cache(tmp_path):
    """Memory holds about one sequence's buffers, the disk the rest: later turns take buffers
    over or read blocks back from disk, and answer as with the cache off."""
    lm = tiny("float32")
    without = conversations(lm, False, 3, 3, concurrent=False)
    cache = PrefixCache(mib=1.5 * first_bytes(lm) / 2**20, block_tokens=16, directory=tmp_path)
    assert conversations(lm, cache, 3, 3, concurrent=False) == without
    cache.flush()
    assert cache.used_bytes <= cache.limit_bytes and list(tmp_path.iterdir())
