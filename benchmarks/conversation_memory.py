"""Peak resident memory of one long conversation with the prefix cache on, in-process: a
repository-sized context (Python standard library sources, about ``--context`` tokens), then
``--turns`` turns, each the whole conversation so far and a new question, greedy, ``--answer``
tokens per answer. Prints, per turn, the prompt's tokens, those found in the cache and the
process's peak resident memory (VmHWM) so far, and the peak over the memory held before the
first turn (the model loaded and warmed up); ``--check`` then runs the same turns with the
cache off and says whether every answer is the same.

    python benchmarks/conversation_memory.py                  # the default model, 4 turns
    python benchmarks/conversation_memory.py --context 5000 --check
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys

QUESTIONS = [
    "Summarise what the first module above does, in three sentences.",
    "Which function above would you test first, and why?",
    "Write a short docstring for the longest function above.",
    "Name one bug risk in the code above and how to avoid it.",
    "Suggest a clearer name for one of the helpers above.",
    "What would you change to make the second module faster?",
]


def context_text(lm, tokens: int) -> str:
    """Standard-library sources, whole modules, until about ``tokens`` tokens."""
    import difflib
    import fnmatch
    import shlex
    import textwrap

    text = ""
    for module in (textwrap, shlex, fnmatch, difflib):
        text += f"# {module.__name__}.py\n{inspect.getsource(module)}\n"
        if len(lm.tokenizer.encode(text)) >= tokens:
            break
    ids = lm.tokenizer.encode(text)[:tokens]
    return lm.tokenizer.decode(ids)


def conversation(lm, context: str, turns: int, answer: int, cache) -> list[dict]:
    """The turns' token counts and answers, and the peak resident memory after each."""
    from promptlookup.bench.memory import peak_rss_mib

    messages = [{"role": "user", "content": f"{context}\n\n{QUESTIONS[0]}"}]
    rows = []
    for turn in range(turns):
        result = lm.generate(
            messages, max_new_tokens=answer, temperature=0, prefix_cache=cache or False
        )
        stats = result.stats
        print(f"turn {turn + 1}: {stats.prompt_tokens} prompt tokens, ", end="")
        print(f"{stats.cached_tokens} cached, peak {peak_rss_mib()} MiB", flush=True)
        rows.append(
            {
                "turn": turn + 1,
                "prompt_tokens": result.stats.prompt_tokens,
                "cached_tokens": result.stats.cached_tokens,
                "peak_mib": peak_rss_mib(),
                "text": result.text,
            }
        )
        messages += [
            {"role": "assistant", "content": result.text},
            {"role": "user", "content": QUESTIONS[(turn + 1) % len(QUESTIONS)]},
        ]
    return rows


def rss_mib() -> float | None:
    """This process's resident memory now (MiB)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None
    return round(kib / 1024, 1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a model (default: the default model)")
    parser.add_argument("--context", type=int, default=3500, help="context tokens (3500)")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--answer", type=int, default=200, help="tokens per answer (200)")
    parser.add_argument("--mib", type=float, default=1024, help="the cache's budget (1024)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--check", action="store_true", help="also run with the cache off")
    args = parser.parse_args(argv)

    import torch

    import promptlookup
    from promptlookup.bench.memory import peak_rss_mib

    if args.threads:
        torch.set_num_threads(args.threads)
    lm = promptlookup.load_model(args.model)
    context = context_text(lm, args.context)
    lm.generate("Hello", max_new_tokens=4, prefix_cache=False)  # warm up
    before = rss_mib()
    cache = promptlookup.PrefixCache(mib=args.mib)
    rows = conversation(lm, context, args.turns, args.answer, cache)
    print("| turn | prompt tokens | cached | peak RSS (MiB) |\n|---:|---:|---:|---:|")
    for row in rows:
        print("| {turn} | {prompt_tokens} | {cached_tokens} | {peak_mib} |".format(**row))
    peak = peak_rss_mib()
    summary = {"rss_before_mib": before, "peak_mib": peak, "peak_over_before_mib": None}
    if before is not None and peak is not None:
        summary["peak_over_before_mib"] = round(peak - before, 1)
    summary["cache_used_mib"] = round(cache.used_bytes / 2**20, 1)
    if args.check:
        plain = conversation(lm, context, args.turns, args.answer, None)
        summary["same_with_cache_off"] = [r["text"] for r in rows] == [r["text"] for r in plain]
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
