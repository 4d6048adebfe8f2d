"""Where a long prompt's prefill goes: one prompt chunk's forward pass (``PREFILL_CHUNK`` tokens)
after a context of several lengths, split into attention, the matrix products and the rest.

The default model is loaded with ``promptlookup.load_model`` (the quantized engine, float16
keys and values), a seeded random context is fed with ``target.extend`` (in the chunks a
prompt goes in), then one more chunk is timed and cropped away again, round after round:

- ``one call``: the pass as the engine runs it (every layer in one C call,
  ``quantized_layers.c``);
- ``by layer``: the same pass layer by layer from Python (``DecoderPass.quantized_layers``
  off), with the native attention (``native_attention``) and every quantized product
  (``QuantizedLinear.forward``) timed by wrapping them; the rest (norms, rotary embedding,
  cache writes, the head) is the pass's time less those two. Both paths call the same C
  kernels, so the split stands for the one-call pass too.

Each cell is the median over rounds (seconds). ``--prefill TOKENS`` measures a whole prompt
instead, as a user runs it (``generate``, plain decoding): prefill tokens/s to the first new
token and decoding tokens/s after it (one process per run: alternate checkouts with
``PYTHONPATH``). ``--old FOLDER`` times the attention kernel
alone instead: ``row_attention.c`` from ``FOLDER`` (another checkout's ``native`` folder, e.g.
the previous commit's) against this checkout's, both built as the package builds them, on one
layer's chunk after each context (the default model's shape, float16 keys and values),
alternating call by call, and checks that both give the same bits.

    nice -n 5 python benchmarks/studies/prefill_profile.py --context 0 --context 2048 --context 4096
    git archive HEAD~1 src/promptlookup/backends/gguf/native | tar -x -C /tmp/old
    nice -n 5 python benchmarks/studies/prefill_profile.py --old /tmp/old/src/promptlookup/backends/gguf/native
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import torch

import promptlookup
from promptlookup.backends.base import PREFILL_CHUNK
from promptlookup.backends.gguf import decoder_layer, native_attention
from promptlookup.backends.gguf.native_build import NATIVE, compiled
from promptlookup.backends.gguf.quantized import QuantizedLinear


class Timers:
    """Seconds spent in the wrapped functions, by name, since :meth:`reset`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def reset(self) -> None:
        self.seconds = {}

    def wrap(self, name: str, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

        return timed


@contextmanager
def by_layer(target, timers: Timers):
    """The target's passes layer by layer, attention and products timed by ``timers``."""
    decoder_pass = target.decoder_pass
    one_call, attention, linear = (
        decoder_pass.quantized_layers,
        decoder_layer.native_attention,
        QuantizedLinear.forward,
    )
    decoder_pass.quantized_layers = None
    decoder_layer.native_attention = timers.wrap("attention", attention)
    QuantizedLinear.forward = timers.wrap("linear", linear)
    try:
        yield
    finally:
        decoder_pass.quantized_layers = one_call
        decoder_layer.native_attention = attention
        QuantizedLinear.forward = linear


def chunk_seconds(target, ids: list[int], context: int) -> float:
    """Seconds of one pass over ``ids[context : context + PREFILL_CHUNK]`` after the cached
    ``ids[:context]``, which the target holds again afterwards."""
    start = time.perf_counter()
    target.extend(ids[context : context + PREFILL_CHUNK])
    seconds = time.perf_counter() - start
    target.crop(context)
    return seconds


def measure(target, context: int, rounds: int) -> dict[str, float]:
    """Median seconds per cell (see the module doc) of a chunk after ``context`` tokens."""
    vocab = target.config.vocab_size
    generator = torch.Generator().manual_seed(context)
    ids = torch.randint(
        vocab // 8, vocab - vocab // 8, (context + PREFILL_CHUNK,), generator=generator
    )
    ids = ids.tolist()
    target.reset()
    if context:
        target.extend(ids[:context])
    timers = Timers()
    cells: dict[str, list[float]] = {}
    chunk_seconds(target, ids, context)  # warm-up (kernel choices, pages)
    for _ in range(rounds):
        cells.setdefault("one call", []).append(chunk_seconds(target, ids, context))
        timers.reset()
        with by_layer(target, timers):
            total = chunk_seconds(target, ids, context)
        cells.setdefault("by layer", []).append(total)
        for name in ("attention", "linear"):
            cells.setdefault(name, []).append(timers.seconds.get(name, 0.0))
        cells.setdefault("rest", []).append(total - sum(timers.seconds.values()))
    return {name: statistics.median(values) for name, values in cells.items()}


def attention_library(native: Path):
    """``native``'s ``row_attention.c`` (a checkout's ``native`` folder) built as the package
    builds it, loaded; its entry point typed as :func:`native_attention.kernel` types it."""
    library = compiled([str(native / "row_attention.c")], "PROMPTLOOKUP_NATIVE_ATTENTION", "")
    library.row_attention.restype = native_attention.kernel().row_attention.restype
    library.row_attention.argtypes = native_attention.kernel().row_attention.argtypes
    return library


def attention_inputs(context: int, shape=(9, 3, 64)) -> dict:
    """One layer's attention of a prompt chunk after ``context`` tokens, the default model's
    shape (query heads, key/value heads, head size): float32 queries, float16 keys and values."""
    heads, kv_heads, dim = shape
    rows = PREFILL_CHUNK
    capacity = -(-(context + rows) // 64) * 64
    generator = torch.Generator().manual_seed(context)
    return {
        "query": torch.randn(rows, heads, dim, generator=generator),
        "keys": torch.randn(kv_heads, dim, capacity, generator=generator).half(),
        "values": torch.randn(kv_heads, capacity, dim, generator=generator).half(),
        "sequence": torch.zeros(rows, dtype=torch.int64),
        "position": torch.arange(context, context + rows, dtype=torch.int64),
        "capacity": capacity,
        "shape": shape,
    }


def attend(library, inputs: dict, threads: int) -> tuple[torch.Tensor, float]:
    """One call of ``library``'s kernel over ``inputs``: the output and its seconds."""
    heads, kv_heads, dim = inputs["shape"]
    out = torch.empty_like(inputs["query"])
    pointers = [torch.tensor([inputs[name].data_ptr()]) for name in ("keys", "values")]
    capacities = torch.tensor([inputs["capacity"]])
    f32, f16 = (native_attention.ELEMENT_TYPES[t] for t in (torch.float32, torch.float16))
    start = time.perf_counter()
    status = library.row_attention(
        f32, f16, inputs["query"].data_ptr(), out.data_ptr(), inputs["query"].shape[0],
        inputs["sequence"].data_ptr(), inputs["position"].data_ptr(), pointers[0].data_ptr(),
        pointers[1].data_ptr(), capacities.data_ptr(), heads, kv_heads, dim, 0.125, 0, threads,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    assert status == 0
    return out, seconds


def compare_kernels(old: Path, contexts: list[int], threads: int, rounds: int) -> None:
    """The attention kernel of ``old`` (a checkout's ``native`` folder) against this one's, on
    one layer's chunk after each context, alternating call by call; outputs compared bit for
    bit."""
    libraries = {"old": attention_library(old), "new": attention_library(NATIVE)}
    print(f"\n`--old {old}`: one layer's attention over a {PREFILL_CHUNK}-token chunk (9 query "
          f"heads, 3 key/value heads, head size 64, float16 keys and values), {threads} threads, "
          f"median of {rounds} calls each, alternating; x30 for the model's layers\n")  # fmt: skip
    print("| context | old (s) | new (s) | old / new | outputs |")
    print("|---:|---:|---:|---:|---|")
    for context in contexts:
        inputs = attention_inputs(context)
        seconds: dict[str, list[float]] = {"old": [], "new": []}
        outs = {}
        for _ in range(rounds):
            for name, library in libraries.items():
                outs[name], took = attend(library, inputs, threads)
                seconds[name].append(took)
        old_s, new_s = (statistics.median(seconds[name]) for name in ("old", "new"))
        same = (
            "identical"
            if torch.equal(outs["old"].view(torch.int32), outs["new"].view(torch.int32))
            else "DIFFER"
        )
        print(
            f"| {context} | {old_s:.3f} | {new_s:.3f} | {old_s / new_s:.2f}x | {same} |", flush=True
        )


def prefill_and_decode(model: str | None, tokens: int, new_tokens: int) -> dict:
    """One prompt of ``tokens`` seeded random ids through ``LanguageModel.generate`` (plain
    decoding, prefix cache off): prefill tokens/s (to the first new token) and decoding
    tokens/s after it, at that context."""
    lm = promptlookup.load_model(model)
    lm.warm_up()
    vocab = lm.target.config.vocab_size
    generator = torch.Generator().manual_seed(tokens)
    ids = torch.randint(vocab // 8, vocab - vocab // 8, (tokens,), generator=generator).tolist()
    result = lm.generate(ids, max_new_tokens=new_tokens, drafter="none", prefix_cache=False)
    times = result.stats.token_seconds  # from the start to each new token
    decoded = len(times) - 1
    return {
        "prefill_tokens_per_s": round(tokens / times[0], 1),
        "decode_tokens_per_s": round(decoded / (times[-1] - times[0]), 2) if decoded else None,
        "decoded": decoded,
        "load_average": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a model load_model takes (default: its)")
    parser.add_argument("--context", type=int, action="append", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--old", type=Path, help="another checkout's native folder: compare kernels"
    )
    parser.add_argument(
        "--prefill", type=int, help="instead: tokens/s of one prompt this long, end to end (JSON)"
    )
    parser.add_argument("--new-tokens", type=int, default=33, help="with --prefill: decoded")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.prefill:
        print(json.dumps(prefill_and_decode(args.model, args.prefill, args.new_tokens)))
        return
    contexts = args.context or [0, 2048, 4096]
    if args.old:
        compare_kernels(args.old, contexts, args.threads, max(args.rounds, 5))
        return
    lm = promptlookup.load_model(args.model)
    target = lm.target
    print(
        f"`prefill_profile.py` ({args.threads} threads, {args.rounds} rounds, median): seconds "
        f"of one {PREFILL_CHUNK}-token prompt chunk after a context; tokens/s of the one-call pass\n"
    )
    print("| context | one call | tokens/s | by layer | attention | linear | rest |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for context in contexts:
        cells = measure(target, context, args.rounds)
        share = {name: cells[name] / cells["by layer"] for name in ("attention", "linear", "rest")}
        print(
            f"| {context} | {cells['one call']:.2f} | {PREFILL_CHUNK / cells['one call']:.0f} "
            f"| {cells['by layer']:.2f} "
            + " ".join(
                f"| {cells[n]:.2f} ({share[n]:.0%})" for n in ("attention", "linear", "rest")
            )
            + " |",
            flush=True,
        )


if __name__ == "__main__":
    main()
