"""CrossRequestIndex and SharedLookupDrafter: the index's counts against a brute-force model of
its documents and eviction rule, its bounds, files and thread safety; the drafter's choice of
source; tenants that never share; and outputs identical to plain decoding with the index on."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import promptlookup
from promptlookup.drafters import (
    CrossRequestIndex,
    PromptLookupDrafter,
    SharedLookupDrafter,
    TenantIndexes,
    make_drafter,
)
from promptlookup.drafters.cross_request import SHARED, Document
from promptlookup.errors import InvalidParameterError

ORDERS = (1, 2, 3, 5)


class ReferenceIndex:
    """The documented rules, literally: documents in the order they (re)joined, the oldest
    evicted whole past the budget, an evicted document restarting empty on its next token;
    lookups count every occurrence in what is held."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.documents: list[list[int]] = []  # held, oldest first
        self.handles: list[list[int] | None] = []  # per document handle: its held tokens

    def append(self, handle: int, token: int) -> None:
        tokens = self.handles[handle]
        if tokens is None or not any(tokens is held for held in self.documents):
            tokens = self.handles[handle] = []
            self.documents.append(tokens)
        tokens.append(token)
        while sum(map(len, self.documents)) > self.max_tokens:
            self.documents.pop(0)

    def lookup(self, context: list[int], orders=ORDERS) -> tuple[int, dict[int, int]]:
        for n in sorted(orders, reverse=True):
            if n > len(context):
                continue
            counts = Counter(
                tokens[i]
                for tokens in self.documents
                for i in range(n, len(tokens))
                if tokens[i - n : i] == context[len(context) - n :]
            )
            if counts:
                return n, dict(counts)
        return 0, {}

    def entries(self, orders=ORDERS) -> int:
        return len(
            {
                tuple(tokens[i - n : i])
                for tokens in self.documents
                for n in orders
                for i in range(n, len(tokens))
            }
        )


operations = st.lists(
    st.tuples(st.integers(0, 3), st.lists(st.integers(0, 3), min_size=1, max_size=8)),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(
    ops=operations,
    max_tokens=st.integers(1, 40),
    contexts=st.lists(st.lists(st.integers(0, 3), max_size=7), min_size=1, max_size=6),
)
def test_lookups_equal_brute_force_under_eviction(ops, max_tokens, contexts):
    index = CrossRequestIndex(max_tokens=max_tokens, orders=ORDERS)
    reference = ReferenceIndex(max_tokens)
    documents = [Document() for _ in range(4)]
    reference.handles = [None] * 4
    for handle, tokens in ops:
        index.extend(documents[handle], tokens)
        for token in tokens:
            reference.append(handle, token)
        assert index.documents == [list(tokens) for tokens in reference.documents]
        assert len(index) == sum(map(len, reference.documents)) <= max_tokens
        assert index.entries == reference.entries() <= len(ORDERS) * max_tokens
        for context in contexts:
            expected = reference.lookup(context)
            assert index.lookup(context) == expected
            draft = index.draft(context, max_tokens=4)
            if expected[0]:
                assert draft.match_length == expected[0] and draft.source == SHARED
                assert expected[1][draft[0]] == max(expected[1].values())
            else:
                assert draft == []


def test_draft_follows_the_most_frequent_continuation_and_the_latest_on_ties():
    index = CrossRequestIndex(orders=(1, 2))
    index.add([1, 2, 3])
    index.add([1, 2, 4])
    assert index.draft([9, 1, 2], max_tokens=1) == [4]  # a tie: the one counted last
    index.add([1, 2, 3])
    assert index.draft([9, 1, 2], max_tokens=1) == [3]  # now more frequent
    assert index.lookup([1, 2]) == (2, {4: 1, 3: 2})
    assert index.lookup([7], min_match=2) == (0, {})


def test_draft_stops_after_an_end_token_and_at_max_tokens():
    index = CrossRequestIndex()
    index.add([5, 6, 7, 0, 8, 9])
    assert index.draft([5], max_tokens=10, stop_tokens=[0]) == [6, 7, 0]
    assert index.draft([5], max_tokens=2) == [6, 7]


def test_open_keeps_the_prompt_tail_or_the_whole_prompt():
    prompt = list(range(100, 150))
    tail = CrossRequestIndex(orders=(1, 4))
    tail.extend(tail.open(prompt), [1, 2])
    assert tail.documents == [prompt[-4:] + [1, 2]]
    whole = CrossRequestIndex(orders=(1, 4), include_prompts=True)
    whole.extend(whole.open(prompt), [1, 2])
    assert whole.documents == [prompt + [1, 2]]


def test_memory_stays_bounded_over_a_long_run():
    index = CrossRequestIndex(max_tokens=500)
    for request in range(200):
        document = index.open([request % 7, 1, 2])
        index.extend(document, [(request * 31 + i * 17) % 97 for i in range(40)])
        assert len(index) <= 500
        assert index.entries <= len(index.orders) * 500
    assert all(len(tokens) <= 500 for tokens in index.documents)


def test_save_and_load(tmp_path):
    index = CrossRequestIndex(max_tokens=100, orders=(1, 3))
    index.add([1, 2, 3, 4], context=[9])
    index.add([5, 6])
    index.save(tmp_path / "index.json")
    loaded = CrossRequestIndex.load(tmp_path / "index.json")
    assert loaded.documents == index.documents and loaded.orders == (1, 3)
    assert loaded.lookup([2, 3]) == index.lookup([2, 3])
    assert CrossRequestIndex.load(tmp_path / "index.json", max_tokens=2).documents == [[5, 6]]
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(InvalidParameterError, match="cannot load"):
        CrossRequestIndex.load(tmp_path / "bad.json")
    with pytest.raises(InvalidParameterError, match="cannot load"):
        CrossRequestIndex.load(tmp_path / "missing.json")


def test_bad_settings_are_named_errors():
    with pytest.raises(InvalidParameterError, match="max_tokens"):
        CrossRequestIndex(max_tokens=0)
    with pytest.raises(InvalidParameterError, match="orders"):
        CrossRequestIndex(orders=(0, 2))
    with pytest.raises(InvalidParameterError, match="sharing"):
        TenantIndexes("everyone")
    with pytest.raises(InvalidParameterError, match="CrossRequestIndex"):
        make_drafter("prompt-lookup", cross_request="index.json")


def test_threads_share_one_index():
    index = CrossRequestIndex(max_tokens=2000, orders=(1, 2, 4))

    def writer(seed: int) -> None:
        document = index.open([seed])
        for i in range(300):
            index.extend(document, [(seed + i) % 11])
            index.draft([seed, i % 11], max_tokens=8)

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reference = ReferenceIndex(2000)
    reference.documents = index.documents
    assert len(index) == 4 * 301
    assert index.entries == reference.entries(orders=(1, 2, 4))
    assert index.lookup([3, 4]) == reference.lookup([3, 4], orders=(1, 2, 4))


# -- the drafter --------------------------------------------------------------------------------


def test_drafter_takes_its_own_context_first_and_shared_on_a_longer_match():
    index = CrossRequestIndex()
    index.add([1, 2, 3, 4, 5, 6])
    drafter = SharedLookupDrafter(index)  # no policy: a strictly longer match wins
    own = drafter.propose([7, 3, 8, 9, 3], max_tokens=3)  # own: "3" -> 8 9 3; shared: "3" -> 4
    assert own == [8, 9, 3] and own.source is None
    drafter = SharedLookupDrafter(index)
    shared = drafter.propose([7, 2, 3], max_tokens=3)  # own: nothing; shared "2 3" -> 4 5 6
    assert shared == [4, 5, 6] and shared.source == SHARED and shared.match_length == 2


def test_drafter_publishes_accepted_tokens_as_one_document():
    index = CrossRequestIndex(orders=(1, 2))
    drafter = SharedLookupDrafter(index)
    tokens = [10, 11, 12]
    drafter.propose(tokens, 4)
    tokens += [13, 14]
    drafter.update([13], 1)
    tokens += [15]
    drafter.propose(tokens, 4)
    assert index.documents == [[11, 12, 13, 14, 15]]  # the prompt's last max(orders) tokens


def test_a_source_that_does_not_pay_is_not_drafted_from():
    from promptlookup.policy import Speculation, SpeculationPolicy

    index = CrossRequestIndex()
    index.add([2, 7, 9, 4, 5, 6])
    speculation = Speculation(SpeculationPolicy())  # one request's side of the policy
    context = [5, 8, 7, 9, 2, 7, 9]  # own: "7 9" -> 2 7 9 (length 2); shared: "2 7 9" -> 4 5 6
    assert SharedLookupDrafter(index, policy=speculation).propose(context, 3).source == SHARED
    for _ in range(200):  # shared drafts from 3-token matches, never accepted
        speculation.policy.learn(speculation.entry(3, 3, SHARED), 0)
    draft = SharedLookupDrafter(index, policy=speculation).propose(context, 3)
    assert draft.source is None and draft == [2, 7, 9]
    assert speculation.expected_accepted(3, 3) > speculation.expected_accepted(3, 3, SHARED)


def test_make_drafter_builds_the_shared_drafter_only_with_an_index():
    index = CrossRequestIndex()
    assert isinstance(make_drafter("prompt-lookup", cross_request=index), SharedLookupDrafter)
    plain = make_drafter("prompt-lookup", cross_request=None)
    assert type(plain) is PromptLookupDrafter
    with pytest.raises(InvalidParameterError, match="takes no option cross_request"):
        make_drafter("none", cross_request=index)
    assert promptlookup.CrossRequestIndex is CrossRequestIndex


# -- tenants ------------------------------------------------------------------------------------


def test_a_second_key_never_drafts_from_the_first_keys_outputs(tiny_lm):
    indexes = TenantIndexes("per-tenant", max_tokens=10_000)
    first = tiny_lm.generate("abcabdabe", max_new_tokens=40, cross_request=indexes.for_tenant("a"))
    assert len(indexes.for_tenant("a")) > 0
    assert len(indexes.for_tenant("b")) == 0
    output_context = first.prompt_ids + first.token_ids
    for cut in range(1, len(output_context)):
        assert indexes.for_tenant("b").draft(output_context[:cut], 8) == []
    a_documents = indexes.for_tenant("a").documents
    tiny_lm.generate("cabcab", max_new_tokens=40, cross_request=indexes.for_tenant("b"))
    assert indexes.for_tenant("a").documents == a_documents  # b added nothing to a's index
    assert not set(map(tuple, a_documents)) & set(map(tuple, indexes.for_tenant("b").documents))
    shared = TenantIndexes("global")
    assert shared.for_tenant("a") is shared.for_tenant("b") is shared.for_tenant(None)
    assert TenantIndexes("per-tenant").for_tenant(None) is not None  # no key: one tenant


def test_least_recently_used_tenant_is_forgotten():
    indexes = TenantIndexes("per-tenant", max_tenants=2)
    a = indexes.for_tenant("a")
    indexes.for_tenant("b")
    assert indexes.for_tenant("a") is a
    indexes.for_tenant("c")  # "b" was used least recently
    assert indexes.for_tenant("a") is a and len(indexes._indexes) == 2


# -- exactness ----------------------------------------------------------------------------------

PROMPTS = ["abcabcabd", "abdabcabc", "cabcabcab", "abcabdabe", "bcabcabca"]


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "seed": 3}])
def test_outputs_identical_to_plain_decoding_with_the_index_on(tiny_lm, sampling):
    index = CrossRequestIndex(max_tokens=300)
    drafted = 0
    for prompt in PROMPTS * 2:
        plain = tiny_lm.generate(prompt, max_new_tokens=48, drafter="none", **sampling)
        shared = tiny_lm.generate(prompt, max_new_tokens=48, cross_request=index, **sampling)
        assert shared.token_ids == plain.token_ids
        drafted += shared.stats.drafted_tokens
    assert len(index) > 0 and drafted > 0


def test_batch_outputs_identical_to_plain_decoding_with_the_index_on(tiny_lm):
    index = CrossRequestIndex(max_tokens=300)
    plain = [tiny_lm.generate(p, max_new_tokens=32, drafter="none").token_ids for p in PROMPTS]
    for _ in range(2):
        results = tiny_lm.generate_batch(PROMPTS, max_new_tokens=32, cross_request=index)
        assert [result.token_ids for result in results] == plain
    assert len(index) > 0
