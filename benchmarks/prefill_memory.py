"""Prefill memory: peak resident memory over idle when one prompt is prefilled in process.

For each prompt length a fresh process loads the model (``promptlookup.load_model``), warms
it up (:meth:`~promptlookup.generation.LanguageModel.warm_up`), reads its resident memory
(idle), resets the kernel's high-water mark (``VmHWM``, :mod:`promptlookup.bench.memory`),
answers one prompt of that many tokens with one new token (plain decoding, prefix cache
off), and reads the mark again. The peak over idle is split into the keys and values the
prompt keeps by design (``kv_bytes_per_token`` times its length) and the rest: transient
buffers of the prefill (activations, attention scores, logits, allocator slack) and the
cache's own room to grow.

    python benchmarks/prefill_memory.py --tokens 1000,2000,4000,8000
    python benchmarks/prefill_memory.py --model gemma-3-270m --tokens 24000

The prompt is seeded random token ids (memory does not depend on which tokens they are).
Every figure is in MiB; "per 1,000" is the peak over idle divided by thousands of tokens.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys

MIB = 1024 * 1024


def _status_mib(key: str) -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def measure(model: str | None, tokens: int, threads: int | None) -> dict:
    """One prompt of ``tokens`` tokens in this process; the figures (see the module doc)."""
    import torch

    import promptlookup
    from promptlookup.bench.memory import reset_peak

    if threads:
        torch.set_num_threads(threads)
    lm = promptlookup.load_model(model)
    lm.warm_up()
    vocab = lm.target.config.vocab_size
    ids = random.Random(tokens).choices(range(vocab // 8, vocab - vocab // 8), k=tokens)
    idle = _status_mib("VmRSS")
    if not reset_peak():
        raise RuntimeError("cannot reset VmHWM (/proc/self/clear_refs)")
    lm.generate(ids, max_new_tokens=1, drafter="none", prefix_cache=False)
    peak = _status_mib("VmHWM")
    kv = tokens * lm.target.kv_bytes_per_token / MIB
    return {
        "tokens": tokens,
        "idle_mib": round(idle, 1),
        "peak_mib": round(peak, 1),
        "over_idle_mib": round(peak - idle, 1),
        "kv_mib": round(kv, 1),
        "rest_mib": round(peak - idle - kv, 1),
        "per_1000_mib": round((peak - idle) / tokens * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a model load_model takes (default: its)")
    parser.add_argument("--tokens", default="1000,2000,4000,8000", help="prompt lengths")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child's one length
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.model, args.one, args.threads)))
        return
    header = "tokens | idle | peak | over idle | KV | rest | over idle per 1,000 tokens"
    print(header)
    print("|".join("---:" for _ in header.split("|")))
    for tokens in [int(text) for text in args.tokens.split(",")]:
        command = [sys.executable, __file__, "--one", str(tokens)]
        command += ["--model", args.model] if args.model else []
        command += ["--threads", str(args.threads)] if args.threads else []
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        row = json.loads(output.strip().splitlines()[-1])
        print(" | ".join(str(value) for value in row.values()), flush=True)


if __name__ == "__main__":
    main()
