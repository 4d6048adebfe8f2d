"""The prefix cache's seam: it knows no layer, shape or dtype. A target says that it reuses
prefixes, and its sequences' caches hand out and take back blocks of their own making; any
target that does (here one whose "keys and values" are plain Python tuples) gets the longest
cached prefix of its own tenant, its contents exactly as stored."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.backends.base import BlockCache, PrefixTarget
from promptlookup.prefix_cache import PrefixCache


class TupleCache:
    """A sequence's cache whose entry for a position is ``(position, token)``."""

    def __init__(self, tokens=()) -> None:
        self.entries = [(position, token) for position, token in enumerate(tokens)]

    def get_seq_length(self) -> int:
        return len(self.entries)

    def crop(self, max_length: int) -> None:
        del self.entries[max_length:]

    def read_blocks(self, start: int, stop: int, block_tokens: int) -> list:
        return [
            tuple(self.entries[i : min(i + block_tokens, stop)])
            for i in range(start, stop, block_tokens)
        ]

    def write_prefix(self, blocks, length: int) -> None:
        assert not self.entries
        self.entries = [entry for block in blocks for entry in block][:length]


class TupleTarget:
    """A target that reuses prefixes, without torch."""

    reuses_prefixes = True
    kv_layout = "tuples"
    kv_bytes_per_token = 16
    max_context, can_crop, row_invariant = 1 << 20, True, True

    def kv_identity(self) -> str:
        return "tuples"

    def new_sequence(self) -> TupleCache:
        return TupleCache()


def test_the_transformers_target_and_its_caches_speak_the_seam():
    from conftest import tiny_llama

    from promptlookup.backends.hf.target import TorchTarget

    target = TorchTarget(tiny_llama(seed=1))
    assert isinstance(target, PrefixTarget) and isinstance(target.new_sequence(), BlockCache)
    assert target.reuses_prefixes and PrefixCache.applies(target)
    assert not PrefixCache.applies(TorchTarget(tiny_llama(seed=1), row_invariant=False))
    assert isinstance(TupleTarget().new_sequence(), BlockCache)


sequences = st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=20), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(
    stored=sequences, asked=st.lists(st.integers(1, 3), max_size=24), tenant=st.sampled_from("ab")
)
def test_any_target_that_speaks_the_seam_gets_its_longest_prefix_exactly(stored, asked, tenant):
    target, cache = TupleTarget(), PrefixCache(mib=1, block_tokens=4)
    for index, tokens in enumerate(stored):
        cache.store(target, TupleCache(tokens), tokens, tenant="ab"[index % 2])
    restored = target.new_sequence()
    found = cache.restore(target, restored, asked, tenant=tenant)
    own = [tokens for index, tokens in enumerate(stored) if "ab"[index % 2] == tenant]
    longest = max(
        (
            next((n for n in range(min(len(s), len(asked)), -1, -1) if s[:n] == asked[:n]))
            for s in own
        ),
        default=0,
    )
    assert found == longest
    assert restored.entries == list(enumerate(asked[:found]))
