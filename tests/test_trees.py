"""Token trees (:mod:`promptlookup.trees`): their layout and walk, the policy's tree rule, the
index's branches, and outputs identical to plain decoding when branches are verified (the
kernel's rows against one-token passes: ``test_quantized_layers.py``)."""

from __future__ import annotations

import pytest
import torch
from conftest import TinyTokenizer
from test_quantized import quantized_tiny

import promptlookup
from promptlookup.backends import quantized_layers
from promptlookup.drafters import CrossRequestIndex, SharedLookupDrafter
from promptlookup.drafters.base import Branch, Draft
from promptlookup.loop import GenerationStats, speculative_generate
from promptlookup.policy import SpeculationPolicy
from promptlookup.sampling import TokenChooser
from promptlookup.trees import TokenTree


def example_draft() -> Draft:
    return Draft([8, 9], branches=[Branch(1, Draft([5, 6]))])


def test_a_tree_is_laid_out_depth_first_with_the_main_draft_last_at_each_depth():
    tree = TokenTree.of(7, example_draft())
    assert tree.tokens == [7, 8, 5, 6, 9]
    assert tree.depths == [0, 1, 2, 3, 2]
    assert tree.parents == [-1, 0, 1, 2, 1]


@pytest.mark.parametrize(
    "choices, path, rejected",
    [
        ({0: 8, 1: 5, 2: 6, 3: 1}, [0, 1, 2, 3], None),  # the branch, whole, then a bonus
        ({0: 8, 1: 9, 4: 3}, [0, 1, 4], None),  # the main draft, whole
        ({0: 8, 1: 2}, [0, 1], 4),  # neither child: the main one counts as rejected
        ({0: 3}, [0], 1),  # nothing accepted
    ],
)
def test_the_walk_follows_the_targets_choices(choices, path, rejected):
    tree = TokenTree.of(7, example_draft())
    assert tree.walk(lambda row, _: choices[row]) == (path, rejected)


def test_cutting_a_draft_cuts_its_branches_to_the_same_depth():
    draft = Draft([1, 2, 3], branches=[Branch(0, Draft([4, 5, 6])), Branch(2, Draft([7, 8]))])
    cut = draft.cut(2)
    assert cut == [1, 2] and [(b.depth, list(b.draft)) for b in cut.branches] == [(0, [4, 5])]
    assert draft.cut(5) is draft and draft.chain().branches == ()


def calibrated_policy(seconds_per_row: float) -> SpeculationPolicy:
    """A policy whose passes cost 1 s plus ``seconds_per_row`` per row."""
    policy = SpeculationPolicy()
    for rows in (1, 2, 4, 8, 16, 32):
        for _ in range(3):
            policy.record_forward(rows, 1.0 + seconds_per_row * rows)
    return policy


def test_policy_verifies_branches_when_rows_are_nearly_free():
    policy = calibrated_policy(1e-4)
    shaped = policy.shape(Draft([1, 2, 3], match_length=2, branches=[Branch(0, Draft([4, 5]))]))
    assert shaped == [1, 2, 3] and [list(b.draft) for b in shaped.branches] == [[4, 5]]


def test_policy_drops_a_branch_that_cannot_pay():
    policy = calibrated_policy(1e-4)
    shaped = policy.shape(
        Draft([1, 2, 3], match_length=2, branches=[Branch(0, Draft([4, 5]), weight=0.0)])
    )
    assert shaped.branches == ()


def test_policy_drops_branches_when_rows_are_dear():
    policy = calibrated_policy(10.0)  # a row costs ten times a pass: drafts do not pay
    shaped = policy.shape(Draft([1, 2, 3], match_length=2, branches=[Branch(0, Draft([4, 5]))]))
    assert shaped == [] and shaped.branches == ()


def test_the_drafter_offers_the_other_sources_draft_and_the_indexs_alternatives():
    index = CrossRequestIndex()
    for _ in range(2):
        index.add([1, 2, 3, 4, 5])
    index.add([1, 2, 3, 9, 9])
    drafter = SharedLookupDrafter(index, branches=2)
    draft = drafter.propose([7, 2, 3], max_tokens=4)  # own context: nothing after 3
    assert draft == [4, 5]
    # the index's other continuation after 3, drafted on (9 follows 9 there)
    assert [(b.depth, list(b.draft)) for b in draft.branches] == [(0, [9, 9, 9, 9])]
    assert SharedLookupDrafter(index, branches=0).propose([7, 2, 3], 4).branches == ()


needs_kernel = pytest.mark.skipif(quantized_layers.kernel() is None, reason="no C compiler")


def tree_target():
    lm = promptlookup.from_transformers(quantized_tiny(5), TinyTokenizer(64))
    assert lm.target.tree_passes
    return lm.target


@needs_kernel
@pytest.mark.parametrize("with_policy", [False, True])
def test_outputs_identical_to_plain_decoding_with_trees(with_policy, monkeypatch):
    """An index that holds the target's own output once and wrong variants of it more often:
    the right continuation is a branch, and trees take it (a branch's rows are copied into the
    cache, and the next passes read them), yet every token is plain decoding's."""
    target = tree_target()
    prompt = [(5 * i + 2) % 64 for i in range(12)]
    plain = list(speculative_generate(target, prompt, max_new_tokens=40))
    index = CrossRequestIndex()
    index.add(plain, prompt)
    for shift in (1, 2):  # wrong variants, each counted twice: the main drafts miss
        for _ in range(2):
            index.add([(token + shift) % 64 if i % 5 == 4 else token for i, token in
                       enumerate(plain)], prompt)  # fmt: skip
    copies = []
    keep = target.written_out.keep_tree_rows
    monkeypatch.setattr(target.written_out, "keep_tree_rows",
                        lambda caches, rows: (copies.extend(rows), keep(caches, rows)))  # fmt: skip
    policy = calibrated_policy(1e-4) if with_policy else None
    if policy is not None:
        policy.start = lambda *args, **kwargs: None  # keep the calibration above
    stats = GenerationStats()
    drafter = SharedLookupDrafter(index, branches=3, policy=policy)
    out = list(
        speculative_generate(target, prompt, max_new_tokens=40, drafter=drafter, stats=stats,
                             policy=policy)
    )  # fmt: skip
    assert out == plain
    if policy is None:  # every branch verified (the policy, trusting long matches, may not)
        assert copies, "no branch was accepted"
        assert stats.forward_passes < len(plain) / 2


@needs_kernel
def test_sampling_keeps_chains(monkeypatch):
    target = tree_target()
    monkeypatch.setattr(target, "forward", _no_trees(target.forward))
    index = CrossRequestIndex()
    index.add(list(range(30)))
    index.add(list(range(0, 60, 2)))
    chooser = TokenChooser(None, do_sample=True, generator=torch.Generator().manual_seed(3))
    drafter = SharedLookupDrafter(index, branches=2)
    list(speculative_generate(target, [0, 1, 2], max_new_tokens=20, drafter=drafter,
                              chooser=chooser))  # fmt: skip


def _no_trees(forward):
    def checked(token_ids, offsets=None):
        assert offsets is None, "a tree pass while sampling"
        return forward(token_ids)

    return checked


def test_targets_without_tree_passes_get_chains(tiny_lm):
    assert not getattr(tiny_lm.target, "tree_passes", False)
    index = CrossRequestIndex()
    index.add([1, 2, 3, 4])
    index.add([1, 2, 5, 6])
    plain = tiny_lm.generate([1, 2], max_new_tokens=12, drafter="none").token_ids
    out = tiny_lm.generate([1, 2], max_new_tokens=12, cross_request=index).token_ids
    assert out == plain


@needs_kernel
def test_batched_trees_give_every_sequence_its_plain_tokens(monkeypatch):
    """Three sequences in shared passes, each drafting trees from an index that holds wrong
    variants of its answer more often than the answer: branches are taken (rows copied into
    place) and every sequence's tokens are its plain decoding's."""
    from promptlookup.batching import BatchDecoder, BatchSequence

    target = tree_target()
    prompts = [[(5 * i + 2) % 64 for i in range(12)], [3, 1, 4, 1, 5, 9, 2, 6], [60, 50, 40]]
    plain = [list(speculative_generate(target, p, max_new_tokens=30)) for p in prompts]
    index = CrossRequestIndex()
    for prompt, answer in zip(prompts, plain):
        index.add(answer, prompt)
        for shift in (1, 2):
            for _ in range(2):
                index.add([(t + shift) % 64 if i % 5 == 4 else t for i, t in enumerate(answer)],
                          prompt)  # fmt: skip
    copies = []
    keep = target.written_out.keep_tree_rows
    monkeypatch.setattr(target.written_out, "keep_tree_rows",
                        lambda caches, rows: (copies.extend(rows), keep(caches, rows)))  # fmt: skip
    decoder = BatchDecoder(target, None, max_batch=3)
    sequences = [
        decoder.add(BatchSequence(p, 30, drafter=SharedLookupDrafter(index, branches=3)))
        for p in prompts
    ]
    for _ in decoder.run():
        pass
    assert [s.tokens[len(p) :] for s, p in zip(sequences, prompts)] == plain
    assert copies, "no branch was accepted"


def test_policy_stops_verifying_branches_that_are_not_taken():
    """Branches recorded as wrong where they were the only hope (source "branch") lose
    their gains: the same tree, verified whole before, is verified as a chain after."""
    from promptlookup.drafters.base import BRANCH

    policy = calibrated_policy(0.05)
    branch = Branch(0, Draft([4, 5], match_length=2), weight=1.0)
    draft = Draft([1, 2, 3], match_length=2, branches=[branch])
    for _ in range(3):
        policy.record_acceptance(2, 3, 0)  # the main drafts miss at once
    assert policy.shape(draft).branches
    for _ in range(50):
        policy.record_acceptance(2, 2, 0, source=BRANCH)
    assert policy.shape(draft).branches == ()


def test_a_branch_is_recorded_only_where_it_was_the_only_hope():
    from promptlookup.loop import DecodingSequence
    from promptlookup.trees import accept_tree

    recorded = []

    class Policy:
        def record_acceptance(self, *args, **kwargs):
            recorded.append((args, kwargs.get("source")))

    tree = TokenTree.of(7, example_draft())  # rows: 7, 8, 5, 6, 9
    for choices, expected in [
        ({0: 8, 1: 5, 2: 6, 3: 1}, [(2, 2)]),  # main's 9 rejected, the branch taken whole
        ({0: 8, 1: 9, 4: 1}, []),  # main's 9 right: the branch had no chance
        ({0: 3}, []),  # its parent 8 not reached
    ]:
        recorded.clear()
        logits = torch.full((5, 16), -1.0)
        for row, token in choices.items():
            logits[row, token] = 1.0
        sequence = DecodingSequence([7], max_new_tokens=10)
        accept_tree(sequence, tree, example_draft(), logits, Policy())
        branch = [(args[1], args[2]) for args, source in recorded if source == "branch"]
        assert branch == expected, choices
