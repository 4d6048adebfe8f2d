"""Token trees: a draft and its branches verified in one forward pass.

A :class:`~promptlookup.drafters.base.Draft` with branches is laid out as the rows of one pass,
depth-first, each row at the position of its depth after the cache. The target computes every
row bit for bit as a one-token pass over its own path (its ancestors) would
(``backends/quantized_layers.c``), so the target's choice at a row is plain decoding's after
that path. Acceptance walks from the root: while the target's choice at the current row is the
token of one of its children, that child is accepted; the first choice that is no child's is
the bonus token. The accepted path is then a chain, and :meth:`DecodingSequence.accept
<promptlookup.loop.DecodingSequence.accept>` takes it as one.

Example: after the context ``... 7``, the draft ``[8, 9]`` with a branch ``[5, 6]`` at depth 1
(instead of ``9``)::

    row     0    1    2    3    4
    token   7    8    5    6    9         depth-first, the main draft's token last at a depth
    depth   0    1    2    3    2
    parent  -    0    1    2    1

If the target chooses 8 at row 0 and 5 at row 1, the path is rows 0, 1, 2 and the walk goes on
from row 2. The main draft's tokens come last at each depth, so the cache already holds the
main path after the pass, and only an accepted branch's rows are copied into place
(:meth:`~promptlookup.backends.transformers_backend.TransformersTarget.keep_tree_path`).

Trees are verified greedily only: sampling keeps chains (exact multi-draft speculative sampling
needs the drafts' distributions, which lookup drafters do not have).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .drafters.base import BRANCH, Draft


@dataclass(frozen=True)
class TokenTree:
    """The rows of one tree pass: ``tokens[0]`` the last accepted token (the root), then the
    draft's tokens depth-first; ``depths[i]`` row i's depth (its position after the cache);
    ``parents[i]`` its parent's row (-1 for the root)."""

    tokens: list[int]
    depths: list[int]
    parents: list[int]
    #: Per row: 0 for the root and the main draft, i for the draft's branch i - 1.
    parts: list[int]

    @classmethod
    def of(cls, root: int, draft: Draft) -> TokenTree:
        """The rows of ``draft`` and its branches after ``root``: at each depth the branches
        that leave there, each whole, before the main draft's token."""
        tree = cls([root], [0], [-1], [0])
        main_row = 0  # the main draft's row at the current depth
        for depth in range(len(draft) + 1):
            for part, branch in enumerate(draft.branches, start=1):
                if branch.depth != depth:
                    continue
                parent = main_row
                for offset, token in enumerate(branch.draft):
                    parent = tree._add(token, depth + 1 + offset, parent, part)
            if depth < len(draft):
                main_row = tree._add(draft[depth], depth + 1, main_row, 0)
        return tree

    def _add(self, token: int, depth: int, parent: int, part: int) -> int:
        self.tokens.append(token)
        self.depths.append(depth)
        self.parents.append(parent)
        self.parts.append(part)
        return len(self.tokens) - 1

    def walk(self, choose: Callable[[int, list[int]], int]) -> tuple[list[int], int | None]:
        """The rows the target agrees with, root first, and the row of a rejected child of
        the last of them (None if it has no children). ``choose(row, path_tokens)``: the
        target's token after ``row``, whose path's tokens after the root are ``path_tokens``."""
        children: dict[int, list[int]] = {}
        for row, parent in enumerate(self.parents):
            children.setdefault(parent, []).append(row)
        path, tokens = [0], []
        while True:
            chosen = choose(path[-1], tokens)
            kids = children.get(path[-1], [])
            agreed = [row for row in kids if self.tokens[row] == chosen]
            if not agreed:
                return path, kids[-1] if kids else None
            path.append(agreed[0])
            tokens.append(chosen)


def accept_tree(
    sequence, tree: TokenTree, draft: Draft, target_logits: torch.Tensor, policy=None
) -> tuple[list[int], list[int]]:
    """Steps 4 and 5 of a tree pass for ``sequence`` (a
    :class:`~promptlookup.loop.DecodingSequence`; ``target_logits`` (rows, vocab)): the path
    the target agrees with, accepted as a chain (its tokens, then one rejected token where
    there was one) by ``sequence.accept``. Returns the new tokens and the rows (root first)
    whose keys and values the cache must hold: the root's and the accepted tokens'."""
    path, rejected = tree.walk(greedy_chooser(sequence.chooser, sequence.tokens, target_logits))
    rows = path + ([rejected] if rejected is not None else [])
    chain = Draft([tree.tokens[row] for row in rows[1:]], None, draft.match_length, draft.source)
    sequence.stats.drafted_tokens += len(tree.tokens) - len(rows)  # the branches not taken
    new_tokens = sequence.accept(chain, target_logits[rows], policy)
    if policy is not None:
        _record_branches(sequence, tree, draft, path, policy)
    return new_tokens, path[: len(new_tokens)]


def _record_branches(sequence, tree: TokenTree, draft: Draft, path: list[int], policy) -> None:
    """Tell the policy how each branch fared where it was the only hope: its parent on the
    path and the main draft's token after that parent rejected (source :data:`BRANCH`)."""
    on_path = set(path)
    for part, branch in enumerate(draft.branches, start=1):
        rows = [row for row, owner in enumerate(tree.parts) if owner == part]
        parent = tree.parents[rows[0]]
        main_child = next(
            (r for r, p in enumerate(tree.parents) if p == parent and tree.parts[r] == 0), None
        )
        if parent not in on_path or (main_child is not None and main_child in on_path):
            continue
        accepted = sum(row in on_path for row in rows)
        sequence.record(policy, branch.draft.match_length, len(rows), accepted, BRANCH)


def greedy_chooser(chooser, tokens: list[int], target_logits: torch.Tensor):
    """``choose(row, path_tokens)`` for :meth:`TokenTree.walk` with a greedy ``chooser``."""
    if chooser.plain_argmax:
        choices = target_logits.argmax(dim=-1).tolist()
        return lambda row, path_tokens: choices[row]

    def choose(row: int, path_tokens: list[int]) -> int:
        input_ids = torch.tensor([[*tokens, *path_tokens]], device=target_logits.device)
        return chooser.choose(input_ids, target_logits[row])

    return choose
