"""Is a round of requests at once cheaper than the same requests one by one, in the batch
decoder itself (issue 53: "many at once, no slower than one by one")?

The round: code-editing prompts (rows of ``--code-edit``, default the built-in suite's) and
short open questions (the built-in suite's ``open_ended``), alternating, chat-formatted, greedy,
plain prompt lookup (no cross-request index, no prefix cache: every prompt computed afresh).
Each pair runs the round through :class:`~promptlookup.batching.BatchDecoder` one request after
another and all at once (``max_batch`` = the round), in alternating order, and reports per
mode: wall seconds, the process's CPU seconds, forward passes, rows fed (prompt tokens, last
tokens and drafts) and logit rows kept; per pair, one by one over at once for each measure; and
whether every output is identical to the first pair's one-by-one outputs.

On a machine shared with other work, wall time varies with the load (its average is printed
beside each pair); the CPU seconds of ``--threads 1`` do not wait on another thread, so they
measure the work itself.

    python benchmarks/studies/batch_round.py --code-edit ../shared/data/code_edit.jsonl \\
        --requests 8 --max-tokens 48 --pairs 2 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code-edit", type=Path, help="a code_edit.jsonl [default: built-in]")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", help="the model [default: the default model]")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    import promptlookup
    from promptlookup.batching import BatchDecoder
    from promptlookup.bench.data import load_rows
    from promptlookup.bench.suite import suite_rows

    half = -(-args.requests // 2)
    code = load_rows(args.code_edit) if args.code_edit else suite_rows(half, ("code_edit",))
    questions = suite_rows(half, ("open_ended",))
    round_ = [row.messages for pair in zip(code, questions) for row in pair][: args.requests]
    lm = promptlookup.load_model(args.model)
    target = lm.target
    passes: list[tuple[int, int]] = []  # (rows fed, logit rows kept) per forward pass
    forward_batch = target.forward_batch

    def counted(caches, token_ids, logits_to_keep):
        passes.append((sum(map(len, token_ids)), sum(logits_to_keep)))
        return forward_batch(caches, token_ids, logits_to_keep)

    target.forward_batch = counted

    def run(prompts) -> list[list[int]]:
        decoder = BatchDecoder(target, lm.policy, max_batch=len(round_))
        sequences = [
            decoder.add(lm.batch_sequence(messages, chat=True, max_new_tokens=args.max_tokens)[0])
            for messages in prompts
        ]
        for _ in decoder.run():
            pass
        return [sequence.tokens[len(sequence.prompt_ids) :] for sequence in sequences]

    def measured(mode: str) -> dict:
        passes.clear()
        wall, cpu = time.perf_counter(), time.process_time()
        if mode == "one by one":
            outputs = [tokens for messages in round_ for tokens in run([messages])]
        else:
            outputs = run(round_)
        return {
            "wall": time.perf_counter() - wall,
            "cpu": time.process_time() - cpu,
            "passes": len(passes),
            "rows": sum(rows for rows, _ in passes),
            "kept": sum(kept for _, kept in passes),
            "outputs": outputs,
        }

    run(round_[:1])  # warm-up: kernels chosen and costs measured before any timing
    reference = None
    for pair in range(args.pairs):
        modes = ("one by one", "at once") if pair % 2 == 0 else ("at once", "one by one")
        results = {mode: measured(mode) for mode in modes}
        reference = reference or results["one by one"]["outputs"]
        same = all(result["outputs"] == reference for result in results.values())
        for mode in ("one by one", "at once"):
            r = results[mode]
            print(
                f"pair {pair} {mode}: wall {r['wall']:.2f} s, cpu {r['cpu']:.2f} s, "
                f"{r['passes']} passes, {r['rows']} rows fed, {r['kept']} kept"
            )
        one, once = results["one by one"], results["at once"]
        print(
            json.dumps(
                {
                    "pair": pair,
                    "wall_ratio": round(one["wall"] / once["wall"], 3),
                    "cpu_ratio": round(one["cpu"] / once["cpu"], 3),
                    "identical": same,
                    "load_average": round(os.getloadavg()[0], 2),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
