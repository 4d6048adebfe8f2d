"""Where a model's peak resident memory comes from, phase by phase, in one process: loading
(the tokenizer, the weights, the target), a short request, a long prompt's forward passes
one by one, the prefix cache's store, decoding.

Each phase resets the kernel's high-water mark of resident memory (``VmHWM``, through
``/proc/self/clear_refs``) before it and reads it after, so a row says what the process held
before the phase, at most during it, and after it. The rows of a request are its forward
passes (``target.forward_batch``, the batch decoder's one pass per step: a prompt chunk or a
decoding step) and its prefix cache's stores; passes of the same kind in a row are folded into
one line (their count, the largest rise during one).

``--race``: instead of the long prompt, the requests of ``benchmarks/gemma_race.sh`` one after
another as ``promptlookup serve`` runs them with its defaults (the first ``--limit`` prompts
of each data file, the messages' contents joined with blank lines as the race's template
does, 128 new tokens, prompt lookup, a 1,024 MiB prefix cache, blocks under 64 MiB from the
heap and what was freed given back between requests, as the server's worker does): one row
per request, with the prefix cache's tensors (what its blocks hold) beside the request's peak.

    nice python benchmarks/studies/memory_phases.py --model gemma-3-270m --tokens 24000
    nice python benchmarks/studies/memory_phases.py --model gemma-3-270m --race
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from window_memory import prompt_ids  # noqa: E402

from promptlookup.bench.memory import peak_rss_mib, reset_peak, rss_mib  # noqa: E402


class Phases:
    """Rows of (phase, count, RSS before, largest peak over before, RSS after)."""

    def __init__(self) -> None:
        self.rows: list[list] = []
        self.peak = peak_rss_mib()  # the process's own peak so far (kept across the resets)
        self.open: list[list[float]] = []  # the peaks seen so far by the phases under way

    def measure(self, label: str, call, *args, **kwargs):
        before = rss_mib()
        for seen in self.open:  # a reset forgets the outer phases' peak so far: keep it
            seen[0] = max(seen[0], peak_rss_mib())
        reset_peak()
        self.open.append([0.0])
        start = time.perf_counter()
        try:
            result = call(*args, **kwargs)
        finally:
            seconds = time.perf_counter() - start
            peak = max(peak_rss_mib(), self.open.pop()[0])
        after = rss_mib()
        for seen in self.open:
            seen[0] = max(seen[0], peak)
        self.peak = max(self.peak, peak)
        last = self.rows[-1] if self.rows else None
        if last is not None and last[0] == label:  # fold a run of the same kind
            last[1] += 1
            last[3] = max(last[3], peak - before)
            last[4], last[5], last[6] = after, max(last[5], peak), last[6] + seconds
        else:
            self.rows.append([label, 1, before, peak - before, after, peak, seconds])
        return result

    def wrap(self, owner, name: str, label) -> None:
        """Measure every call of ``owner.name`` (``label(*args)`` names its row)."""
        original = getattr(owner, name)

        @functools.wraps(original)
        def measured(*args, **kwargs):
            return self.measure(label(*args, **kwargs), original, *args, **kwargs)

        setattr(owner, name, measured)

    def table(self) -> str:
        lines = [
            "| phase | calls | RSS before | largest rise during one | RSS after | peak | s |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for label, count, before, rise, after, peak, seconds in self.rows:
            lines.append(
                f"| {label} | {count} | {before:.0f} | {rise:+.0f} | {after:.0f} | "
                f"{peak:.0f} | {seconds:.2f} |"
            )
        return "\n".join(lines)


def pass_label(caches, token_ids, logits_to_keep) -> str:
    """A forward pass's row name: its rows and whether it is a prompt chunk."""
    rows = sum(len(tokens) for tokens in token_ids)
    context = max(cache.get_seq_length() for cache in caches)
    kind = "prompt chunk" if not any(logits_to_keep) else "pass with logits"
    size = "1 row" if rows == 1 else f"{rows} rows" if rows < 64 else f"{rows // 64 * 64}+ rows"
    if context == 0:
        return f"{kind}, {size}, first"
    return f"{kind}, {size}"


def race_prompts(data: Path, limit: int) -> list[tuple[str, str]]:
    """``(id, text)`` of the race's requests: each data file's first ``limit``, then the
    open-ended prompts' (``bench/open_ended.py``), each its messages' contents joined."""
    from promptlookup.bench.open_ended import OPEN_ENDED

    prompts = []
    for name in ("code_edit", "summarization"):
        with open(data / f"{name}.jsonl") as lines:
            for line in list(lines)[:limit]:
                record = json.loads(line)
                text = "\n\n".join(m["content"] for m in record["messages"])
                prompts.append((record["id"], text))
    prompts += [(f"open_ended-{i:02d}", text) for i, text in enumerate(OPEN_ENDED[:limit])]
    return prompts


def held_mib(cache) -> float:
    """MiB of the tensors a prefix cache's blocks hold (each storage once)."""
    storages = {
        tensor.untyped_storage().data_ptr(): tensor.untyped_storage().nbytes()
        for tensor in _tensors(cache._tree)
    }
    return sum(storages.values()) / 2**20


def _tensors(root) -> list[torch.Tensor]:
    """Every tensor reachable from ``root`` through containers and objects' fields."""
    found, seen, stack = [], set(), [root]
    while stack:
        item = stack.pop()
        if id(item) in seen or item is None:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, dict):
            stack += list(item.keys()) + list(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack += list(item)
        elif hasattr(item, "__dict__") and not isinstance(item, type):
            stack += list(vars(item).values())
        elif hasattr(item, "__slots__"):
            stack += [getattr(item, name, None) for name in item.__slots__]
    return found


def race(lm, args, phases: Phases) -> None:
    """The race's requests one by one, as the server runs them (see the module doc)."""
    from promptlookup.machine import return_freed_memory
    from promptlookup.prefix_cache import PrefixCache

    cache = PrefixCache(mib=args.prefix_cache_mib or 1024)
    return_freed_memory(map_from=64 << 20)  # the server's worker, while busy
    print("| request | prompt tokens | RSS before | peak | RSS after | prefix cache's tensors |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, text in race_prompts(Path(args.data), args.limit):
        prompt = lm.encode(text)
        before = rss_mib()
        phases.measure(
            f"request {name}", lm.generate, prompt, max_new_tokens=128, prefix_cache=cache
        )
        peak = phases.rows[-1][5]
        print(
            f"| {name} | {len(prompt)} | {before:.0f} | {peak:.0f} | {rss_mib():.0f} | "
            f"{held_mib(cache):.0f} MiB |",
            flush=True,
        )
        return_freed_memory()  # the worker's clean-up once idle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--tokens", type=int, default=8000, help="the long prompt's tokens")
    parser.add_argument("--new", type=int, default=16, help="tokens generated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prefix-cache-mib", type=float, default=0)
    parser.add_argument("--drafter", default="none")
    parser.add_argument("--race", action="store_true", help="the Gemma race's requests instead")
    parser.add_argument("--data", default="../shared/data", help="the race's data files")
    parser.add_argument("--limit", type=int, default=4, help="the race's prompts per task")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import promptlookup
    from promptlookup import loading
    from promptlookup.backends.gguf import loader
    from promptlookup.prefix_cache import PrefixCache

    phases = Phases()
    imported = rss_mib()
    phases.wrap(loading, "gguf_tokenizer", lambda *a, **k: "load: tokenizer")
    phases.wrap(loader, "load_quantized", lambda *a, **k: "load: weights")
    phases.wrap(loading, "from_transformers", lambda *a, **k: "load: target")
    lm = phases.measure("load: all (the rows above inside it)", promptlookup.load_model, args.model)
    if args.race:
        print(f"{args.model}, the race's requests; after imports {imported:.0f} MiB\n")
        race(lm, args, phases)
        print(f"\n{phases.table()}\n\nprocess peak (VmHWM, all phases): {phases.peak:.0f} MiB")
        return
    target = lm.target
    phases.wrap(target, "forward_batch", pass_label)
    phases.wrap(PrefixCache, "store", lambda *a, **k: "prefix cache: store")
    cache = PrefixCache(mib=args.prefix_cache_mib) if args.prefix_cache_mib else False
    options = dict(drafter=args.drafter, prefix_cache=cache)
    short = lm.tokenizer("def fibonacci(n):", add_special_tokens=False)["input_ids"]
    phases.measure("request: short (first)", lm.generate, short, max_new_tokens=args.new, **options)
    phases.measure("request: short (again)", lm.generate, short, max_new_tokens=args.new, **options)
    prompt = prompt_ids(lm.tokenizer, args.tokens)
    phases.measure(
        f"request: {args.tokens} tokens", lm.generate, prompt, max_new_tokens=args.new, **options
    )
    print(
        f"{args.model}, {args.tokens}-token prompt, {args.new} new tokens, drafter "
        f"{args.drafter}, prefix cache {args.prefix_cache_mib:g} MiB, {args.threads} threads; "
        f"after imports {imported:.0f} MiB; MiB throughout\n"
    )
    print(phases.table())
    print(f"\nprocess peak (VmHWM, all phases): {phases.peak:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
