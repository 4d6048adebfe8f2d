"""One driver or two: a single stream through the batch decoder (what ``lm.generate`` runs on a
batch-capable target) against the reference loop, ``speculative_generate``, on the same
prompts, interleaved, the default model; tokens/s of each, and a check that both give the
same tokens.

    python benchmarks/studies/drivers.py --data ../shared/data --per-task 3 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import promptlookup
from promptlookup.drafters import make_drafter


def loop_tokens(lm, ids: list[int], max_new_tokens: int) -> list[int]:
    """The reference loop over the same target, drafter and policy as ``lm.generate``."""
    drafter = make_drafter("prompt-lookup", eos_token_ids=lm.eos_token_ids)
    return list(
        promptlookup.speculative_generate(
            lm.target, ids, max_new_tokens=max_new_tokens, drafter=drafter,
            eos_token_ids=lm.eos_token_ids, policy=lm.policy,
        )
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a folder of TASK.jsonl files")
    parser.add_argument("--tasks", default="code_edit,summarization,qa,chat")
    parser.add_argument("--per-task", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("-n", "--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    lm = promptlookup.load_model()
    lm.warm_up()
    prompts = []
    for task in args.tasks.split(","):
        with open(args.data / f"{task}.jsonl") as lines:
            prompts += [
                lm.encode(json.loads(next(lines))["messages"]) for _ in range(args.per_task)
            ]
    totals = {"batch decoder": [0, 0.0], "loop": [0, 0.0]}
    for repeat in range(args.repeat):
        for number, ids in enumerate(prompts):
            order = list(totals) if (repeat + number) % 2 == 0 else list(reversed(totals))
            tokens = {}
            for method in order:  # interleaved, each first in turn
                start = time.perf_counter()
                if method == "loop":
                    tokens[method] = loop_tokens(lm, ids, args.max_new_tokens)
                else:
                    tokens[method] = lm.generate(ids, max_new_tokens=args.max_new_tokens).token_ids
                totals[method][1] += time.perf_counter() - start
                totals[method][0] += len(tokens[method])
            assert tokens["loop"] == tokens["batch decoder"], "the drivers disagree"
    for method, (count, seconds) in totals.items():
        print(f"{method}: {count} tokens in {seconds:.2f} s = {count / seconds:.1f} tokens/s")
    ratio = (totals["batch decoder"][0] / totals["batch decoder"][1]) / (
        totals["loop"][0] / totals["loop"][1]
    )
    print(f"batch decoder / loop: {ratio:.3f}; every output the same")


if __name__ == "__main__":
    main()
