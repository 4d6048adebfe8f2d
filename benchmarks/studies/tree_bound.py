"""What token trees can gain on the session workload, and what their rows cost.

Two measurements on the default model (or ``--model``), one thread by default:

1. **Pass cost**: forward passes over ``rows`` rows after a 300-token context, as a chain and
   as a tree of three branches of equal depth (the same rows, depth-first), interleaved,
   median of ``--repeats``.
2. **The bound on trees**: the sessions of ``benchmarks/sessions.py`` (same kinds and
   settings) with a global cross-request index, one session at a time, three ways interleaved
   request by request: chains (``branches=0``), the policy's trees (the default), and *every*
   branch the drafter offers verified (up to ``--branch-tokens`` tokens each; the main draft
   still cut by the policy). The last shows the most passes trees could save on this workload,
   whatever their cost. Every output must equal the chains' output.

    python benchmarks/studies/tree_bound.py --out benchmarks/runs/trees-0.14.0/tree_bound.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


def pass_costs(lm, rows_list, repeats: int) -> list[tuple[int, float, float]]:
    """(rows, chain ms, tree ms) per row count, interleaved."""
    target = lm.target
    target.prepare([max(rows_list)])
    context = list(range(100, 400))
    times: dict[tuple[int, str], list[float]] = {}
    for _ in range(repeats):
        for rows in rows_list:
            tokens = list(range(500, 500 + rows))
            depth = max(1, (rows - 1) // 3)
            shapes = {"chain": None, "tree": [0] + [1 + i % depth for i in range(rows - 1)]}
            for shape, offsets in shapes.items():
                target.reset()
                target.prefill(context)
                target.forward([5])
                start = time.perf_counter()
                target.forward(tokens, offsets)
                times.setdefault((rows, shape), []).append(time.perf_counter() - start)
    return [
        (rows, *(1e3 * statistics.median(times[(rows, shape)]) for shape in ("chain", "tree")))
        for rows in rows_list
    ]


def every_branch(branch_tokens: int):
    """A policy ``shape`` that cuts the main draft as the policy does and keeps every branch."""
    from promptlookup.drafters.base import Branch, Draft
    from promptlookup.policy import SpeculationPolicy

    def shape(self, draft):
        main = draft.chain().cut(self.draft_length(draft, draft.match_length))
        branches = [
            Branch(b.depth, b.draft.cut(branch_tokens), b.weight)
            for b in draft.branches
            if b.depth <= len(main)
        ]
        return Draft(main, None, draft.match_length, draft.source, branches)

    return shape, SpeculationPolicy.shape


def sessions_bound(lm, args) -> tuple[dict, bool]:
    """Per way: [new tokens, passes, seconds]; and whether every output was the chains'."""
    import promptlookup
    from promptlookup.bench import sessions as workload
    from promptlookup.policy import SpeculationPolicy

    forced, policy_shape = every_branch(args.branch_tokens)
    ways = ("chains", "trees", "every-branch")
    indexes = {way: promptlookup.CrossRequestIndex() for way in ways}
    totals = {way: [0, 0, 0.0] for way in ways}
    identical = True
    built = workload.build_sessions(args.kinds.split(","), args.per_kind, args.requests)
    for turn, session in enumerate(s for s in built for _ in range(args.requests)):
        step = len(session.answers)
        outputs = {}
        for way in ways[turn % 3 :] + ways[: turn % 3]:
            SpeculationPolicy.shape = forced if way == "every-branch" else policy_shape
            start = time.perf_counter()
            result = lm.generate(
                session.messages(step), max_new_tokens=args.max_new_tokens,
                cross_request=indexes[way], branches=0 if way == "chains" else args.branches,
            )  # fmt: skip
            totals[way][2] += time.perf_counter() - start
            totals[way][0] += result.stats.new_tokens
            totals[way][1] += result.stats.forward_passes
            outputs[way] = result
        SpeculationPolicy.shape = policy_shape
        identical &= len({tuple(result.token_ids) for result in outputs.values()}) == 1
        session.answers.append(outputs["chains"].text)
        print(f"{session.name} step {step + 1}", file=sys.stderr, flush=True)
    return totals, identical


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", default="1,2,4,8,12,16,24")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--kinds", default="file_edits,agent,unit_tests,extraction")
    parser.add_argument("--per-kind", type=int, default=2)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--branches", type=int, default=3, help="branches offered per draft")
    parser.add_argument("--branch-tokens", type=int, default=8, help="every-branch: tokens each")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import torch

    import promptlookup

    torch.set_num_threads(args.threads)
    lm = promptlookup.load_model(args.model)
    lm.warm_up()
    costs = pass_costs(lm, [int(r) for r in args.rows.split(",")], args.repeats)
    totals, identical = sessions_bound(lm, args)
    command = "python benchmarks/studies/tree_bound.py " + " ".join(argv or sys.argv[1:])
    lines = [
        f"# Token trees: pass cost and bound ({lm.name}, {args.threads} thread(s))",
        "",
        f"Command: `{command}`",
        "",
        "| rows | chain pass, ms | tree pass (3 branches), ms | tree / chain |",
        "|---:|---:|---:|---:|",
        *(f"| {r} | {c:.2f} | {t:.2f} | {t / c:.2f} |" for r, c, t in costs),
        "",
        "| way | new tokens | passes | tokens/pass | tokens/s | x chains |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    base = totals["chains"][0] / totals["chains"][2]
    for way, (tokens, passes, seconds) in totals.items():
        rate = tokens / seconds
        lines.append(
            f"| {way} | {tokens} | {passes} | {tokens / passes:.2f} | {rate:.1f} | "
            f"{rate / base:.2f} |"
        )
    lines += ["", f"Outputs identical to the chains': {'yes' if identical else 'NO'}."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
