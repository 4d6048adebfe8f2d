"""Memory of one long prompt: peak resident memory (VmHWM) and the keys and values a sequence
holds, for a model with sliding-window layers (Gemma 3 270M) before and after windowed caches.

Run it once per tree (``PYTHONPATH=<tree>/src``), each in a fresh process: it loads the model,
feeds a prompt of ``--tokens`` tokens (the installed Python's standard-library sources, as raw
text) and generates ``--new`` tokens greedily, with a prefix cache of ``--prefix-cache-mib`` MiB
(0: none; ``promptlookup serve``'s default is 1,024), then prints one Markdown row: the peak
resident memory (VmHWM) of loading, the resident memory before the request, the request's
peak (VmHWM reset before it), and the bytes the request's cache buffers hold at its end (whole
layers + windowed layers), per prompt token.

    nice python benchmarks/studies/window_memory.py --tokens 8000
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path

import torch

import promptlookup
from promptlookup.bench.memory import peak_rss_mib, reset_peak, rss_mib
from promptlookup.prefix_cache import PrefixCache


def prompt_ids(tokenizer, tokens: int) -> list[int]:
    """``tokens`` token ids of standard-library sources (argparse.py, then the others)."""
    folder = Path(sysconfig.get_paths()["stdlib"])
    ids: list[int] = []
    for path in [folder / "argparse.py", *sorted(folder.glob("*.py"))]:
        ids += tokenizer(path.read_text(errors="replace"), add_special_tokens=False)["input_ids"]
        if len(ids) >= tokens:
            return ids[:tokens]
    raise SystemExit(f"the standard library has fewer than {tokens} tokens here")


def held_bytes(cache) -> tuple[int, int]:
    """Bytes of the cache buffers of one sequence: whole layers, windowed ones."""
    whole = windowed = 0
    for layer in cache.layers:
        buffers = [getattr(layer, name, None) for name in ("key_storage", "value_buffer")]
        size = sum(b.nbytes for b in buffers if isinstance(b, torch.Tensor))
        if getattr(layer, "offset", None) is not None:
            windowed += size
        else:
            whole += size
    return whole, windowed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--tokens", type=int, default=8000, help="prompt tokens")
    parser.add_argument("--new", type=int, default=16, help="tokens generated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prefix-cache-mib", type=float, default=0)
    parser.add_argument("--label", default="this tree")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lm = promptlookup.load_model(args.model)
    loaded = peak_rss_mib()
    prompt = prompt_ids(lm.tokenizer, args.tokens)
    caches = []  # the request's sequence cache, kept to count its buffers
    new_sequence = lm.target.new_sequence
    lm.target.new_sequence = lambda: caches.append(new_sequence()) or caches[-1]
    cache = PrefixCache(mib=args.prefix_cache_mib) if args.prefix_cache_mib else False
    idle = rss_mib()
    reset_peak()  # VmHWM from here: the request's peak
    result = lm.generate(prompt, max_new_tokens=args.new, drafter="none", prefix_cache=cache)
    whole, windowed = held_bytes(caches[-1] if caches else lm.target.cache)
    kib = lambda n: f"{n / 1024 / args.tokens:.2f} KiB"  # noqa: E731
    print(
        f"| {args.label} | {args.model} | {args.tokens} | {args.prefix_cache_mib:g} | "
        f"{loaded:.0f} MiB | {idle:.0f} MiB | {peak_rss_mib():.0f} MiB | {kib(whole)} + "
        f"{kib(windowed)} "
        f"| {result.stats.new_tokens} |",
        flush=True,
    )


if __name__ == "__main__":
    main()
