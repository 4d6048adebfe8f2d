"""The tree-vs-chain study script (benchmarks/studies/draft_headroom.py) counts what it claims."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "studies" / "draft_headroom.py"
spec = importlib.util.spec_from_file_location("draft_headroom", SCRIPT)
headroom = importlib.util.module_from_spec(spec)
spec.loader.exec_module(headroom)


def trie_nodes(branches):
    return len({tuple(branch[: i + 1]) for branch in branches for i in range(len(branch))})


def test_occurrences_are_longest_suffix_first_then_most_recent():
    #        0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 7, 9, 2, 8, 1, 2, 5, 1, 2]
    # suffix "1 2" ends at 2 and 8 (most recent first); then suffix "2" adds the ends 5.
    assert headroom.occurrences(tokens) == [8, 2, 5]


def test_tree_keeps_the_chain_first_then_departing_branches_within_the_node_budget():
    tokens = [1, 2, 7, 9, 2, 8, 3, 1, 2, 5, 6, 1, 2]
    branches = headroom.tree_branches(tokens, nodes=4, branches=4)
    assert branches[0] == [5, 6]  # the chain's own draft: most recent "1 2" -> 5 6
    assert [7, 9] in [b[:2] for b in branches[1:]]  # the older "1 2" departs from it
    assert trie_nodes(branches) <= 4


def test_replay_counts_one_pass_per_token_without_matches_and_fewer_when_copying():
    prompt = [10, 11, 12, 13, 14, 15, 16, 17]
    novel = [20, 21, 22, 23]
    assert headroom.replay(prompt, novel, nodes=8, branches=1) == len(novel)
    copied = [10, 11, 12, 13, 14, 15, 16]
    # "10" matches once the first token is out: then the rest is drafted and accepted.
    assert headroom.replay(prompt, copied, nodes=8, branches=1) == 2
    # A tree gives its first branch half the nodes (4) and finds no departing alternative.
    assert headroom.replay(prompt, copied, nodes=8, branches=2) == 3
