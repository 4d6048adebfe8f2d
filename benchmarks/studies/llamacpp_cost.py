"""What one llama.cpp forward pass over n tokens costs, for the default model in several GGUF
weight types (converted with llama.cpp's own ``llama_model_quantize``), through promptlookup's
llama.cpp target. Speculative decoding pays only where a pass over a few tokens costs little
more than over one; this shows how far each weight type is from that on this CPU.

Prints a markdown table: milliseconds per pass (median of rounds) and, in brackets, the ratio to
the one-token pass of the same file.

    python benchmarks/studies/llamacpp_cost.py --threads 2 > benchmarks/runs/llamacpp-cost.md
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import tempfile
import time
from pathlib import Path

from promptlookup.backends.llamacpp.target import LlamaCppTarget, open_llama
from promptlookup.models import resolve_model

SIZES = (1, 2, 3, 4, 8, 16)
#: llama.cpp file types (``LLAMA_FTYPE_*``) to convert the default Q4_1 model to.
FILE_TYPES = {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "q4_0": 2}


def convert(source: Path, name: str, folder: Path) -> Path:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[name]
    params.allow_requantize = True
    out = folder / f"{source.stem}.{name}.gguf"
    if (
        llama_cpp.llama_model_quantize(
            str(source).encode(), str(out).encode(), ctypes.byref(params)
        )
        != 0
    ):
        raise SystemExit(f"llama_model_quantize failed for {name}")
    return out


def measure(path: Path, threads: int, context: int, rounds: int) -> dict[int, float]:
    target = LlamaCppTarget(open_llama(path, n_threads=threads))
    target.prefill(list(range(1000, 1000 + context)))
    target.forward([5])
    length = target.cache_length
    times: dict[int, list[float]] = {n: [] for n in SIZES}
    for _ in range(rounds):
        for n in SIZES:
            start = time.perf_counter()
            target.forward(list(range(200, 200 + n)))
            times[n].append(time.perf_counter() - start)
            target.crop(length)
    return {n: statistics.median(v) for n, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, action="append", default=None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--types",
        default="q4_1," + ",".join(FILE_TYPES),
        help="q4_1 (the default model's own file) and conversions of it",
    )
    args = parser.parse_args()
    source = resolve_model(None)
    original = Path(source.location) / source.gguf_file
    print("## llama.cpp forward-pass cost by weight type\n")
    print(
        f"`python benchmarks/studies/llamacpp_cost.py --threads {args.threads}` ({args.rounds} rounds, "
        "median). Milliseconds per forward pass over n new tokens after a context of the given "
        "length; in brackets, the ratio to the same file's one-token pass.\n"
    )
    header = " | ".join(f"n={n}" for n in SIZES)
    print(f"| weights | context | {header} |")
    print("|---|---:|" + "---:|" * len(SIZES))
    with tempfile.TemporaryDirectory() as folder:
        for name in args.types.split(","):
            path = original if name == "q4_1" else convert(original, name, Path(folder))
            for context in args.context or [500, 2000]:
                costs = measure(path, args.threads, context, args.rounds)
                cells = " | ".join(
                    f"{costs[n] * 1e3:.1f} ({costs[n] / costs[1]:.2f}x)" for n in SIZES
                )
                print(f"| {name} | {context} | {cells} |", flush=True)
            if path != original:
                path.unlink()


if __name__ == "__main__":
    main()
