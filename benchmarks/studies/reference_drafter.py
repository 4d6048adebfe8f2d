"""Reference-text drafting on code edits: does a "predicted output" help prompt lookup?

For the first N rows of ``code_edit.jsonl`` (a buggy function, its failing tests, "fix the
bug"), the default model generates the reply greedily with three drafters, interleaved prompt
by prompt (the order rotates from row to row):

- ``prompt-lookup``: drafts from the prompt and the output so far;
- ``reference:answer``: the same, plus the row's ``reference`` field as a reference text, i.e.
  the corrected code, what an OpenAI "predicted output" user would pass;
- ``reference:original``: the same, plus the original (buggy) code block extracted from the
  prompt: the realistic case when the fix is unknown. The prompt already holds that code, so
  this shows what a reference adds when it holds nothing new.

Each reference goes through the ``reference:FILE`` drafter spec (a temporary file). It prints
a markdown table: tokens per forward pass and tokens/s per drafter, and whether all three
outputs are token-identical (they must be: every drafter is lossless).

    .venv/bin/python benchmarks/studies/reference_drafter.py --rows 5 --max-new-tokens 128 --threads 1
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "code_edit.jsonl"
METHODS = ("prompt-lookup", "reference:answer", "reference:original")


def original_code(prompt: str) -> str:
    """The first fenced code block of the prompt (the code to fix)."""
    match = re.search(r"```[a-zA-Z0-9_+-]*\n(.*?)```", prompt, flags=re.S)
    return match.group(1) if match else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--rows", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--speculation",
        choices=["adaptive", "fixed"],
        default="adaptive",
        help="The loop's draft trimming policy (library default: adaptive).",
    )
    parser.add_argument("--model", default=None)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (1 is fastest on a busy shared CPU).",
    )
    args = parser.parse_args()

    import torch

    import promptlookup

    if args.threads:
        torch.set_num_threads(args.threads)

    lm = promptlookup.load_model(args.model)
    with args.data.open(encoding="utf-8") as lines:
        rows = [json.loads(line) for _, line in zip(range(args.rows), lines)]
    table = []
    with tempfile.TemporaryDirectory() as folder:
        for index, row in enumerate(rows):
            references = {
                "answer": row["reference"],
                "original": original_code(row["messages"][-1]["content"]),
            }
            specs = {"prompt-lookup": "prompt-lookup"}
            for name, text in references.items():
                path = Path(folder) / f"{index}-{name}.txt"
                path.write_text(text, encoding="utf-8")
                specs[f"reference:{name}"] = f"reference:{path}"
            order = METHODS[index % 3 :] + METHODS[: index % 3]  # interleave, rotating the order
            results = {
                method: lm.generate(
                    row["messages"],
                    drafter=specs[method],
                    max_new_tokens=args.max_new_tokens,
                    speculation=args.speculation,
                )
                for method in order
            }
            first = results[METHODS[0]]
            table.append(
                {
                    "id": row["id"],
                    "prompt_tokens": first.stats.prompt_tokens,
                    "new_tokens": first.stats.new_tokens,
                    "identical": all(r.token_ids == first.token_ids for r in results.values()),
                    **{f"tpf {m}": results[m].stats.tokens_per_forward for m in METHODS},
                    **{f"tps {m}": results[m].stats.tokens_per_second for m in METHODS},
                }
            )
            print(f"[{index + 1}/{len(rows)}] {row['id']} done", flush=True)
    print_table(table, args)


def print_table(table: list[dict], args) -> None:
    print(
        f"\nReference drafter on the first {len(table)} code_edit rows, {args.max_new_tokens} "
        f"new tokens max, greedy float32, speculation={args.speculation}, threads="
        f"{args.threads or 'default'}. tpf = tokens per "
        "forward pass, tok/s = tokens per second.\n"
    )
    header = [
        "row",
        "prompt tok",
        "new tok",
        *(f"tpf {m}" for m in METHODS),
        *(f"tok/s {m}" for m in METHODS),
        "identical",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for r in table:
        cells = [
            r["id"],
            r["prompt_tokens"],
            r["new_tokens"],
            *(f"{r[f'tpf {m}']:.2f}" for m in METHODS),
            *(f"{r[f'tps {m}']:.1f}" for m in METHODS),
            "yes" if r["identical"] else "NO",
        ]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    total_new = sum(r["new_tokens"] for r in table)
    mean = {m: total_new / sum(r["new_tokens"] / r[f"tpf {m}"] for r in table) for m in METHODS}
    speed = {m: total_new / sum(r["new_tokens"] / r[f"tps {m}"] for r in table) for m in METHODS}
    cells = [
        "all (pooled)",
        sum(r["prompt_tokens"] for r in table),
        total_new,
        *(f"{mean[m]:.2f}" for m in METHODS),
        *(f"{speed[m]:.1f}" for m in METHODS),
        "yes" if all(r["identical"] for r in table) else "NO",
    ]
    print("| " + " | ".join(str(c) for c in cells) + " |")
    base = METHODS[0]
    for m in METHODS[1:]:
        print(
            f"\n{m} vs {base}: tokens/forward x{mean[m] / mean[base]:.2f}, "
            f"tokens/s x{speed[m] / speed[base]:.2f}",
            end="",
        )
    print()


if __name__ == "__main__":
    main()
