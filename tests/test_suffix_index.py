"""SuffixIndex and PromptLookupDrafter: the matching policy, checked against a brute-force
reference, and the drafter's draft rules (length caps, EOS, reference text, re-indexing)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.drafters import Match, PromptLookupDrafter, SuffixIndex, make_drafter
from promptlookup.drafters.prompt_lookup import SEPARATOR


def brute_force_match(tokens: list[int], min_match: int, max_match: int) -> Match | None:
    """The policy, literally: the longest suffix (``min_match``..``max_match`` tokens) that
    also ends at an earlier position; among its occurrences the one ending latest."""
    n = len(tokens)
    for length in range(min(n - 1, max_match), min_match - 1, -1):
        suffix = tokens[n - length :]
        for end in range(n - 1, length - 1, -1):  # ``end`` is exclusive and < n
            if tokens[end - length : end] == suffix:
                return Match(length, end)
    return None


# -- SuffixIndex against the reference ---------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.integers(1, 4).flatmap(
        lambda alphabet: st.lists(st.integers(0, alphabet - 1), max_size=60)
    ),
    min_match=st.integers(1, 4),
    extra=st.integers(0, 8),
)
def test_match_equals_brute_force_after_every_append(tokens, min_match, extra):
    max_match = min_match + extra
    index = SuffixIndex(min_match=min_match, max_match=max_match)
    for n, token in enumerate(tokens, start=1):
        index.append(token)
        expected = brute_force_match(tokens[:n], min_match, max_match)
        assert index.match() == expected, (tokens[:n], min_match, max_match)
        if expected is not None:
            assert (
                index.continuation(expected, 5) == tokens[expected.end : min(n, expected.end + 5)]
            )


@settings(max_examples=50, deadline=None)
@given(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=300))
def test_long_sequences_with_default_bounds(tokens):
    index = SuffixIndex()  # min_match=1, max_match=64
    index.extend(tokens)
    assert len(index) == len(tokens)
    assert index.match() == brute_force_match(tokens, 1, 64)


def test_picks_longest_then_most_recent_match():
    # a b c x a b c y b c | the suffix "b c" occurs three times; "a b c" is longer.
    a, b, c, x, y = range(5)
    index = SuffixIndex(min_match=1, max_match=8)
    index.extend([a, b, c, x, a, b, c, y, a, b, c])
    # Longest: "a b c" (3 tokens, "y a b c" is new); most recent earlier end is 7 (before y).
    assert index.match() == Match(length=3, end=7)
    assert index.continuation(index.match(), 4) == [y, a, b, c]
    # A longer match wins over a more recent shorter one.
    index = SuffixIndex(min_match=1, max_match=8)
    index.extend([a, b, c, x, y, b, c, x, a, b, c])
    # "b c" last ended at 7; "a b c" only at 3, and it is longer.
    assert index.match() == Match(length=3, end=3)


def test_respects_min_match():
    index = SuffixIndex(min_match=2, max_match=8)
    index.extend([1, 2, 3, 9, 3])  # only a 1-token suffix ("3") occurred before
    assert index.match() is None
    index.append(1)  # "3 1": new
    assert index.match() is None
    index.extend([2])  # "1 2" occurred before (ending at 2)
    assert index.match() == Match(length=2, end=2)
    with pytest.raises(ValueError):
        SuffixIndex(min_match=0)
    with pytest.raises(ValueError):
        SuffixIndex(min_match=3, max_match=2)


def test_caps_match_at_max_match():
    # With max_match=2, "1 2 3" and "9 2 3" look alike: the most recent "2 3" wins.
    index = SuffixIndex(min_match=1, max_match=2)
    index.extend([1, 2, 3, 7, 9, 2, 3, 8, 1, 2, 3])
    assert index.match() == Match(length=2, end=7)
    assert index.continuation(index.match(), 1) == [8]
    # Uncapped, the longer "1 2 3" wins and drafts the 7.
    index = SuffixIndex(min_match=1, max_match=3)
    index.extend([1, 2, 3, 7, 9, 2, 3, 8, 1, 2, 3])
    assert index.match() == Match(length=3, end=3)


def test_no_match_for_unseen_token():
    index = SuffixIndex()
    assert index.match() is None
    index.extend([1, 2, 3, 1, 2])
    assert index.match() == Match(length=2, end=2)
    index.append(42)
    assert index.match() is None


def test_overlapping_occurrence_of_a_run():
    index = SuffixIndex(min_match=1, max_match=64)
    index.extend([5, 5, 5, 5])
    # "5 5 5" also ends at 3 (overlapping the current suffix), continuation is the last 5.
    assert index.match() == Match(length=3, end=3)
    assert index.continuation(index.match(), 10) == [5]


# -- PromptLookupDrafter ------------------------------------------------------------------------


def test_draft_is_the_continuation_up_to_num_tokens_and_max_tokens():
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]
    assert PromptLookupDrafter(num_tokens=3).propose(tokens, max_tokens=10) == [3, 4, 5]
    assert PromptLookupDrafter(num_tokens=10).propose(tokens, max_tokens=2) == [3, 4]
    # A continuation that runs into the end of the sequence is chained: looking up again from
    # the draft's end finds the same occurrence one period later, so the draft repeats it.
    period = [3, 4, 5, 6, 7, 8, 9, 1, 2]
    assert PromptLookupDrafter(num_tokens=50).propose(tokens, max_tokens=12) == period + period[:3]
    assert PromptLookupDrafter(num_tokens=5).propose([7, 1, 2, 1, 2], max_tokens=10) == [
        1,
        2,
        1,
        2,
        1,
    ]
    assert PromptLookupDrafter().propose([1, 2, 3], max_tokens=10) == []  # no match
    assert PromptLookupDrafter().propose([], max_tokens=10) == []
    with pytest.raises(ValueError):
        PromptLookupDrafter(num_tokens=0)


def test_draft_cut_after_eos():
    tokens = [1, 2, 3, 0, 4, 5, 1, 2]
    drafter = PromptLookupDrafter(num_tokens=10, eos_token_ids=[0])
    assert drafter.propose(tokens, max_tokens=10) == [3, 0]  # the EOS is drafted, nothing after
    assert PromptLookupDrafter(num_tokens=4).propose(tokens, max_tokens=10) == [3, 0, 4, 5]
    # Several EOS ids: the first one in the continuation cuts.
    drafter = PromptLookupDrafter(num_tokens=10, eos_token_ids=[5, 4])
    assert drafter.propose(tokens, max_tokens=10) == [3, 0, 4]
    # A chained (repeating) draft is cut at its first EOS too.
    drafter = PromptLookupDrafter(num_tokens=10, eos_token_ids=[0])
    assert drafter.propose([5, 1, 2, 0, 1, 2], max_tokens=10) == [0]
    assert drafter.propose([4, 1, 2, 6, 1, 2], max_tokens=10) == [6, 1, 2, 6, 1, 2, 6, 1, 2, 6]


def test_min_and_max_match_options_reach_the_index():
    drafter = PromptLookupDrafter(num_tokens=2, min_match=2)
    assert drafter.propose([1, 2, 3, 9, 3], max_tokens=5) == []
    drafter = PromptLookupDrafter(num_tokens=1, max_match=2)
    assert drafter.propose([1, 2, 3, 7, 9, 2, 3, 8, 1, 2, 3], max_tokens=5) == [8]
    assert drafter.index.match() == Match(2, 7)  # the match the draft came from


def test_reference_match_inside_the_reference():
    reference = [10, 11, 12, 13, 14, 15]
    drafter = PromptLookupDrafter(num_tokens=3, reference_ids=reference)
    # The prompt ends with "11 12", which only occurs in the reference.
    assert drafter.propose([1, 2, 11, 12], max_tokens=10) == [13, 14, 15]


def test_reference_draft_never_crosses_the_separator():
    reference = [10, 11, 12]
    drafter = PromptLookupDrafter(num_tokens=3, reference_ids=reference)
    # "11 12" matches at the very end of the reference: what follows is the separator, and
    # after it the prompt itself; the draft must not run on into it.
    draft = drafter.propose([11, 12, 5, 6, 11, 12], max_tokens=10)
    assert draft == [5, 6, 11]  # the prompt's own earlier "11 12" is more recent
    drafter = PromptLookupDrafter(num_tokens=10, reference_ids=reference)
    draft = drafter.propose([7, 8, 11, 12], max_tokens=10)
    assert SEPARATOR not in draft
    assert draft == []  # the match's continuation is the separator: nothing to draft
    # A suffix never matches across the separator: the prompt "10 11 12" matches the whole
    # reference (3 tokens), not "12 | 10 11 12" or more.
    drafter = PromptLookupDrafter(num_tokens=10, reference_ids=[10, 11, 12])
    assert drafter.propose([10, 11, 12], max_tokens=10) == []
    assert drafter.index.match() == (3, 3)


def test_equal_length_match_prefers_the_prompt_over_the_reference():
    reference = [1, 2, 30, 31]
    drafter = PromptLookupDrafter(num_tokens=2, reference_ids=reference)
    assert drafter.propose([1, 2, 40, 41, 9, 1, 2], max_tokens=10) == [40, 41]
    # A longer match in the reference still wins.
    drafter = PromptLookupDrafter(num_tokens=2, reference_ids=[8, 1, 2, 30, 31])
    assert drafter.propose([1, 2, 40, 41, 8, 1, 2], max_tokens=10) == [30, 31]


def test_make_drafter_passes_reference_ids():
    drafter = make_drafter("prompt-lookup", reference_ids=[10, 11, 12, 13], num_tokens=2)
    assert drafter.propose([5, 11], max_tokens=10) == [12, 13]


def _fresh(tokens, **options):
    return PromptLookupDrafter(**options).propose(list(tokens), max_tokens=20)


@pytest.mark.parametrize("options", [{}, {"reference_ids": [3, 1, 2, 4, 1]}])
def test_incremental_sync_and_reindex_match_a_fresh_drafter(options):
    drafter = PromptLookupDrafter(num_tokens=20, **options)
    # One list object growing in place (as in the loop): indexed incrementally.
    tokens = [1, 2, 3, 1]
    for token in [2, 4, 1, 2, 3, 5, 1, 2]:
        tokens.append(token)
        assert drafter.propose(tokens, 20) == _fresh(tokens, **options)
    indexed = len(drafter.index)
    # A different list extending the same tokens: still incremental, same result.
    longer = tokens + [3, 1]
    assert drafter.propose(longer, 20) == _fresh(longer, **options)
    assert len(drafter.index) == indexed + 2
    # A different list with other tokens: re-indexed, as if fresh.
    other = [7, 8, 9, 7, 8]
    assert drafter.propose(other, 20) == _fresh(other, **options)
    # A shorter list (a new generation with a prefix of the old one).
    short = longer[:5]
    assert drafter.propose(short, 20) == _fresh(short, **options)
    # The same list object, truncated in place: re-indexed.
    assert drafter.propose(tokens, 20) == _fresh(tokens, **options)
    tokens[:] = [4, 4, 5, 4]
    assert drafter.propose(tokens, 20) == _fresh(tokens, **options)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=12), min_size=1, max_size=6))
def test_any_sequence_of_lists_matches_a_fresh_drafter(lists):
    drafter = PromptLookupDrafter(num_tokens=5)
    for tokens in lists:
        assert drafter.propose(tokens, 20) == _fresh(tokens, num_tokens=5)
