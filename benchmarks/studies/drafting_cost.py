"""Micro-benchmark: the prompt lookup drafter's cost per decoding step against context length.

A context of N tokens (real text from ../shared/data, tokenized with the default model's
tokenizer, repeated as needed) is indexed once; then each step appends the tokens a decoding
step would accept (1 to 4) and asks for a draft, as the loop does. Prints a markdown table of
the median and 95th-percentile microseconds per step.

    .venv/bin/python benchmarks/studies/drafting_cost.py --contexts 1000 10000 100000
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from promptlookup.drafters import PromptLookupDrafter

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


def corpus_tokens(limit: int) -> list[int]:
    """Token ids of real prompts, concatenated (the default tokenizer, when available)."""
    texts = []
    for name in ("code_edit", "summarization", "qa", "chat"):
        path = DATA / f"{name}.jsonl"
        if path.is_file():
            for line in path.open():
                texts.append(json.loads(line)["messages"][-1]["content"])
    if not texts:
        raise SystemExit(f"no data in {DATA}")
    from transformers import AutoTokenizer

    from promptlookup.models import _convert_gguf, resolve_model

    tokenizer = AutoTokenizer.from_pretrained(_convert_gguf(resolve_model(None)))
    tokens: list[int] = []
    for text in texts:
        tokens += tokenizer(text)["input_ids"]
        if len(tokens) >= limit:
            break
    return tokens


def measure(context: list[int], steps: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    drafter = PromptLookupDrafter()
    tokens = list(context[: len(context) - steps * 4])
    drafter.propose(tokens, 64)  # index the context once (not timed: that is the prefill)
    source = context[len(tokens) :]
    timings = []
    for _ in range(steps):
        accepted = [source.pop(0) for _ in range(min(rng.randint(1, 4), len(source)))]
        start = time.perf_counter()
        tokens.extend(accepted)
        drafter.propose(tokens, 64)
        timings.append(time.perf_counter() - start)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    base = corpus_tokens(max(args.contexts) + 4 * args.steps)
    print("| context tokens | median µs/step | p95 µs/step |")
    print("|---:|---:|---:|")
    for n in args.contexts:
        need = n + 4 * args.steps
        context = (base * (need // len(base) + 1))[:need]
        timings = sorted(measure(context, args.steps))
        median = statistics.median(timings) * 1e6
        p95 = timings[int(0.95 * len(timings))] * 1e6
        print(f"| {n:,} | {median:.1f} | {p95:.1f} |")


if __name__ == "__main__":
    main()
