"""How many tokens per forward pass would a *tree* of drafts add over one longer chain?

Replays the greedy outputs of a ``promptlookup bench`` run (the ``plain`` rows of its
results.jsonl, re-tokenised) through idealised drafters that see the true continuation only to
score it, and reports tokens per forward pass for the same number of verified draft tokens
(*nodes*):

- ``chain N``: one draft of N tokens, promptlookup's policy (the longest suffix match, most
  recent occurrence), what ``PromptLookupDrafter`` proposes;
- ``tree N/B``: the chain's first N/2 tokens plus continuations of up to B-1 other earlier
  occurrences of the current suffix that depart from it (longest suffixes first, most recent
  first), merged into a token trie and cut to N nodes in all; the longest branch the target
  would accept wins. Compare it with ``chain N/2`` (what the alternatives add) and ``chain N``
  (the same nodes spent on one longer draft).

The question it answers (issue "Drafts worth verifying"): where a forward pass over N tokens
costs about the same as over N/2, is it better spent on alternatives or on a longer chain?

    python benchmarks/studies/draft_headroom.py benchmarks/runs/xeon-float32-greedy-0.7.6 \\
        --data ../shared/data/code_edit.jsonl --data ../shared/data/summarization.jsonl \\
        --data ../shared/data/qa.jsonl --data ../shared/data/chat.jsonl --every 3
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

from promptlookup.drafters.prompt_lookup import PromptLookupDrafter


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def occurrences(tokens: list[int], max_match: int = 16, limit: int = 16) -> list[int]:
    """End indices of earlier occurrences of the current suffix: longest suffixes first, then
    most recent first (brute force: this is a study, not the hot path)."""
    n, found, seen = len(tokens), [], set()
    for length in range(min(max_match, n - 1), 0, -1):
        suffix = tokens[n - length :]
        for end in range(n - 1, length - 1, -1):
            if end not in seen and tokens[end - length : end] == suffix:
                seen.add(end)
                found.append(end)
                if len(found) >= limit:
                    return found
    return found


def tree_branches(tokens: list[int], nodes: int, branches: int) -> list[list[int]]:
    """Up to ``branches`` continuations whose trie has at most ``nodes`` nodes; the first
    (the chain policy's own draft) gets half the nodes."""
    first = PromptLookupDrafter(num_tokens=max(1, nodes // 2), max_match=16).propose(tokens, nodes)
    kept, used = ([first], len(first)) if first else ([], 0)
    for end in occurrences(tokens, limit=branches):
        if len(kept) >= branches or used >= nodes:
            break
        branch = tokens[end : end + nodes]
        if first and branch[: len(first)] == first:
            continue  # it only extends the first branch: that is the chain's business
        shared = max((common_prefix(branch, other) for other in kept), default=0)
        branch = branch[: shared + nodes - used]
        if len(branch) > shared:
            kept.append(branch)
            used += len(branch) - shared
    return kept


def replay(prompt: list[int], output: list[int], nodes: int, branches: int) -> int:
    """Forward passes to produce ``output`` after ``prompt`` (each pass: the longest accepted
    branch plus the bonus token)."""
    tokens, position, passes = list(prompt), 0, 0
    while position < len(output):
        truth = output[position:]
        if branches == 1:
            drafts = [PromptLookupDrafter(num_tokens=nodes, max_match=16).propose(tokens, nodes)]
        else:
            drafts = tree_branches(tokens, nodes, branches)
        accepted = min(max((common_prefix(d, truth) for d in drafts), default=0), len(truth) - 1)
        tokens.extend(truth[: accepted + 1])
        position += accepted + 1
        passes += 1
    return passes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a greedy promptlookup bench output folder")
    parser.add_argument("--data", action="append", required=True, help="the run's data files")
    parser.add_argument("--every", type=int, default=1, help="use every n-th prompt")
    parser.add_argument("--nodes", default="4,8,16,32")
    args = parser.parse_args()

    from replay_data import plain_outputs  # beside this script

    _, outputs = plain_outputs(args.run, args.data, args.every)
    settings = [(n, b) for n in map(int, args.nodes.split(",")) for b in (1, 2, 4)]
    totals = collections.defaultdict(lambda: [0, 0])  # (task, nodes, branches) -> tokens, passes
    for task, prompt, output in outputs:
        for nodes, branches in settings:
            total = totals[(task, nodes, branches)]
            total[0] += len(output)
            total[1] += replay(prompt, output, nodes, branches)
    tasks = list(dict.fromkeys(task for task, _, _ in outputs))
    print("| task | nodes | chain | tree, 2 branches | tree, 4 branches |")
    print("|---|---|---|---|---|")
    for task in tasks:
        for nodes in map(int, args.nodes.split(",")):
            cells = [totals[(task, nodes, b)] for b in (1, 2, 4)]
            print(f"| {task} | {nodes} | " + " | ".join(f"{t / p:.2f}" for t, p in cells) + " |")


if __name__ == "__main__":
    main()
