"""What one target forward pass over n tokens costs, with transformers' stock attention and cache
and with promptlookup's (folded grouped-query attention, a cache that appends in place, matrix
products by the kernel measured fastest for the pass size, and since 0.7.0 a Llama's pass
written out): modes ``stock``, ``own-forward`` (promptlookup's target running the model's own
forward, as before 0.7.0 and for models other than Llama), ``fastest`` (the written-out pass
with the fastest kernels whatever their rounding: not row-invariant), ``blas-attention`` (the
row-invariant pass with attention over the BLAS, where no C compiler builds the native kernel)
and ``promptlookup`` (row-invariant, native attention: the default).

Both run the same loaded model on the same random context; sizes and modes are interleaved
round by round and each cell is the median over rounds. Prints a markdown table.

    python benchmarks/studies/forward_cost.py --dtype float32 --dtype bfloat16 --context 500 --context 2000 \
        --threads 1 > benchmarks/runs/forward-cost.md
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from promptlookup.backends.hf.target import TorchTarget
from promptlookup.models import load_pretrained

SIZES = (1, 2, 4, 8, 16, 32)
MODES = ("stock", "own-forward", "fastest", "blas-attention", "promptlookup")


class StockTarget(TorchTarget):
    """The same target with transformers' own ``DynamicCache``, ``sdpa`` attention and
    ``nn.Linear`` products."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.can_crop = True  # DynamicLayer crops as well
        self.decoder_pass = None  # `_run` below is the model's own forward

    def reset(self) -> None:
        super().reset()
        self.cache = DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def _run(self, token_ids, logits_to_keep):
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        return self.model(
            input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=logits_to_keep
        ).logits[0]


def measure(model, context: int, rounds: int, repeats: int) -> dict[tuple[str, int], float]:
    """Median seconds per pass, by (mode, size); size 0 is the prefill of the context itself."""
    generator = torch.Generator().manual_seed(context)
    ids = torch.randint(100, 40000, (context + max(SIZES),), generator=generator).tolist()
    targets = {
        "stock": StockTarget(model),
        "own-forward": TorchTarget(model),
        "fastest": TorchTarget(model, row_invariant=False),
        "blas-attention": TorchTarget(model),
        "promptlookup": TorchTarget(model),
    }
    targets["own-forward"].decoder_pass = None
    targets["blas-attention"].decoder_pass.native_attention = False
    targets["blas-attention"].reset()  # its caches: keys not transposed
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for mode, target in targets.items():
            target.reset()
            start = time.perf_counter()
            target.extend(ids[:context])  # runs the prompt now (prefill() would wait)
            times.setdefault((mode, 0), []).append(time.perf_counter() - start)
            for size in SIZES:
                target.forward(ids[context : context + size])  # warm-up
                target.crop(context)
                start = time.perf_counter()
                for _ in range(repeats):
                    target.forward(ids[context : context + size])
                    target.crop(context)
                times.setdefault((mode, size), []).append((time.perf_counter() - start) / repeats)
    return {key: statistics.median(values) for key, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", action="append", default=None)
    parser.add_argument("--context", type=int, action="append", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from promptlookup import __version__

    print(
        f"## Forward-pass cost (version {__version__}): stock transformers vs promptlookup's "
        "target\n"
    )
    print(
        "Modes: `stock` (transformers' cache, attention and products), `own-forward` "
        "(promptlookup's target running the model's own forward: versions before 0.7.0, and "
        "models other than Llama), `fastest` (the written-out pass, fastest kernels whatever "
        "their rounding: `row_invariant=False`), `blas-attention` (row-invariant, attention "
        "over the BLAS: no C compiler), `promptlookup` (row-invariant, native attention: the "
        "target as it is).\n"
    )
    print(
        f"`python benchmarks/studies/forward_cost.py` ({args.threads} thread(s), {args.rounds} rounds "
        f"x {args.repeats} passes per cell, median). Milliseconds per forward pass over n new "
        "tokens after a context of the given length; in brackets, the ratio to the stock "
        "one-token pass (what plain decoding with `model.generate` pays per token). "
        "Prefill: milliseconds to feed the context itself (the prompt), in brackets the "
        "ratio to stock's.\n"
    )
    header = " | ".join(f"n={n}" for n in SIZES)
    print(f"| dtype | context | target | prefill | {header} |")
    print("|---|---:|---|---:|" + "---:|" * len(SIZES))
    for dtype in args.dtype or ["float32", "bfloat16"]:
        model = load_pretrained(None, dtype=dtype)
        model = model[0] if isinstance(model, tuple) else model
        for context in args.context or [500, 2000]:
            costs = measure(model, context, args.rounds, args.repeats)
            one = costs[("stock", 1)]
            for mode in MODES:
                cells = " | ".join(
                    f"{costs[(mode, n)] * 1e3:.0f} ({costs[(mode, n)] / one:.2f}x)" for n in SIZES
                )
                prefill = (
                    f"{costs[(mode, 0)] * 1e3:.0f} ({costs[(mode, 0)] / costs[('stock', 0)]:.2f}x)"
                )
                print(f"| {dtype} | {context} | {mode} | {prefill} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
