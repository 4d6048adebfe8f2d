"""What the size of a prompt's prefill passes costs: prefill tokens/s and the peak memory over
the process's idle, per chunk size and slice budget of the quantized C layers, for each model,
in one interleaved run.

Each model is loaded with ``promptlookup.load_model`` (the quantized engine, float16 keys and
values); a prompt of ``--tokens`` tokens (standard-library sources, as
``window_memory.py`` takes them) is prefilled as the batch decoder prefills a prompt with
nobody decoding: its cache reserved at once (``target.reserve``), then passes of ``chunk``
tokens (``target.forward_batch``), the last one keeping its logits, the C layers taking the
pass in slices of ``--variant CHUNK:SLICE_MIB``'s budget (``QuantizedLayers.slice_bytes``; 0:
512-row slices, as before it). Rounds go model by model, variant by variant, the order of the
variants turned each round, so that load changes on a shared machine touch every one alike. Per cell: the median tokens/s over rounds, and the
largest rise of resident memory (``VmHWM`` reset before each prefill, over the resident memory
before it) with the sequence's cache, which stays after the prefill, counted apart.

    nice -n 5 python benchmarks/studies/prefill_chunks.py --variant 2048:0 --variant 512:8
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from window_memory import prompt_ids  # noqa: E402

import promptlookup  # noqa: E402
from promptlookup.bench.memory import peak_rss_mib, reset_peak, rss_mib  # noqa: E402
from promptlookup.machine import return_freed_memory  # noqa: E402


def prefill(target, prompt: list[int], chunk: int) -> tuple[float, float, float]:
    """Seconds of one prefill of ``prompt`` in passes of ``chunk`` tokens, the peak rise of
    resident memory during it (MiB over the resident memory before it) and the MiB its cache's
    buffers hold."""
    return_freed_memory()
    before = rss_mib()
    reset_peak()
    start = time.perf_counter()
    cache = target.new_sequence()
    target.reserve(cache, len(prompt), 16)
    for first in range(0, len(prompt), chunk):
        keep = int(first + chunk >= len(prompt))
        target.forward_batch([cache], [prompt[first : first + chunk]], [keep])
    seconds = time.perf_counter() - start
    rise = peak_rss_mib() - before
    held = sum(
        getattr(layer, name).nbytes
        for layer in cache.layers
        for name in ("key_storage", "value_buffer")
        if isinstance(getattr(layer, name, None), torch.Tensor)
    )
    del cache
    gc.collect()
    return seconds, rise, held / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", help="default: the default model and Gemma")
    parser.add_argument("--tokens", type=int, default=4096, help="prompt tokens")
    parser.add_argument(
        "--variant",
        action="append",
        help="CHUNK:SLICE_MIB (default: 2048:0 1024:8 512:8 512:0 2048:8)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = args.model or ["default", "gemma-3-270m"]
    variants = [
        tuple(int(part) for part in variant.split(":"))
        for variant in args.variant or ["2048:0", "1024:8", "512:8", "512:0", "2048:8"]
    ]
    models = {}
    for name in names:
        lm = promptlookup.load_model(None if name == "default" else name)
        prompt = prompt_ids(lm.tokenizer, args.tokens)
        lm.target.forward_batch([lm.target.new_sequence()], [prompt[:64]], [1])  # warm-up
        models[name] = (lm.target, prompt)
    cells: dict[tuple, list[tuple[float, float, float]]] = {}
    for round_ in range(args.rounds):
        turn = round_ % len(variants)
        for name, (target, prompt) in models.items():
            for chunk, slice_mib in variants[turn:] + variants[:turn]:
                layers = target.decoder_pass.quantized_layers
                layers.slice_bytes = int(slice_mib * 2**20)  # 0: 512-row slices
                cell = cells.setdefault((name, chunk, slice_mib), [])
                cell.append(prefill(target, prompt, chunk))
                seconds, rise, held = cell[-1]
                print(
                    f"round {round_ + 1} {name} {chunk}:{slice_mib}: {len(prompt) / seconds:.0f} "
                    f"tokens/s, peak +{rise:.0f} MiB (cache {held:.0f})",
                    file=sys.stderr,
                    flush=True,
                )
    print(
        f"\n{args.tokens}-token prompt, {args.threads} threads, median of {args.rounds} rounds; "
        "peak rise: the largest over rounds (MiB over the resident memory before the prefill)\n"
    )
    print(
        "| model | chunk | slice budget | prefill tokens/s | vs the first variant | "
        "peak rise MiB | of it the cache MiB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (_, prompt) in models.items():
        speed = {
            variant: statistics.median(len(prompt) / s for s, _, _ in cells[(name, *variant)])
            for variant in variants
        }
        for variant in variants:
            rise = max(r for _, r, _ in cells[(name, *variant)])
            held = cells[(name, *variant)][-1][2]
            budget = f"{variant[1]} MiB" if variant[1] else "512 rows"
            print(
                f"| {name} | {variant[0]} | {budget} | {speed[variant]:.0f} | "
                f"{speed[variant] / speed[variants[0]]:.2f} | {rise:.0f} | {held:.0f} |"
            )


if __name__ == "__main__":
    main()
