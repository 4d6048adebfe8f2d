"""Keys and values in 16 bits: bytes per token and decoding speed at long context.

Part 1, memory: for the default model (SmolLM2-135M), Gemma 3 270M and a 7B model's attention
shape (Qwen2.5-7B's: 28 layers, 4 key/value heads of 128; a random-weight GGUF written with
``gguf`` by ``quantized_shapes.py``'s writer, its hidden size, MLP and vocabulary shrunk,
which hold no keys or values), each target's ``kv_bytes_per_token`` with ``kv_dtype`` float32
and float16, the bytes its whole layers' cache buffers really hold per position after a prompt
of ``--memory-tokens`` tokens (their storage over their capacity) and its sliding-window
layers' bytes in all (they keep a window, whatever the length: ``backends/hf/window.py``), and
llama.cpp's float16 figure, 2 bytes x 2 x layers x key/value heads x head size, every layer
whole and, at long context, its layers without a sliding window only (llama.cpp keeps only the
window of the others, as we do).

Part 2, speed: the default model decoding plain (``drafter="none"``, one token per pass) after
a prompt of ``--context`` tokens (the installed Python's ``argparse.py``, as raw text), with
float32 and float16 keys and values, interleaved round by round (the order alternating), each
prompt restored from a prefix cache so that only decoding is timed: tokens/s after the first
token, per round and median.

Part 2b (``--kernel``): the attention kernel alone over ``--context`` keys, one query row.

Part 3 (``--agreement TOKENS``): how far the default model's greedy answers to four requests
with float16 and bfloat16 keys and values follow float32's (the choice of float16).

    nice python benchmarks/studies/kv_dtype.py --context 5200 --rounds 3 --tokens 48 \\
        --agreement 128 --folder /tmp/kv-dtype
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import promptlookup
from promptlookup.prefix_cache import PrefixCache

sys.path.insert(0, str(Path(__file__).parent))
import quantized_shapes  # noqa: E402 (the GGUF writer, beside this file)

#: Qwen2.5-7B's attention (hidden, intermediate, layers, heads, kv heads, vocab, tied), the
#: rest shrunk: keys and values per token depend on layers x kv heads x head size alone.
SEVEN_B = (512, 256, 28, 28, 4, 1024, True)


def seven_b_target(folder: Path, kv_dtype: str):
    from promptlookup.backends.gguf.loader import load_quantized
    from promptlookup.backends.hf.target import TorchTarget

    quantized_shapes.SHAPES["7b-attention"] = SEVEN_B
    quantized_shapes.HEAD_DIMS["7b-attention"] = 128
    path, config = folder / "7b-attention.gguf", folder / "7b-attention.json"
    if not path.is_file():
        values = quantized_shapes.write_gguf(path, "7b-attention", "Q4_0")
        config.write_text(json.dumps({**values, "head_dim": 128}))
    model, _ = load_quantized(path, config)
    return TorchTarget(model, kv_dtype=kv_dtype)


def held_per_position(target, prompt_tokens: int) -> tuple[float, int]:
    """Bytes the whole layers' cache buffers of one sequence hold per position (their storage
    over their capacity) after a prompt, and the bytes its windowed layers hold in all (a
    window each, whatever the length: ``backends/hf/window.py``)."""
    target.reset()
    target.extend(list(range(5, 5 + prompt_tokens)))
    whole, windowed, capacity = 0, 0, 0
    for layer in target.cache.layers:
        size = layer.key_storage.nbytes + layer.value_buffer.nbytes
        if getattr(layer, "offset", None) is None:
            whole, capacity = whole + size, layer.value_buffer.shape[-2]
        else:
            windowed += size
    return whole / max(capacity, 1), windowed


def memory_table(folder: Path, models: list[str], prompt_tokens: int) -> list[str]:
    rows = [
        "| model | layers x kv heads x head size | float32 | promptlookup float16 | held per "
        "position (float16, whole layers) | windowed layers (float16, in all) | llama.cpp "
        "float16 | llama.cpp float16, long context |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in models:
        figures = {}
        for kv in ("float32", "float16"):
            if name == "7b-attention":
                target = seven_b_target(folder, kv)
            else:
                target = promptlookup.load_model(
                    None if name == "default" else name, kv_dtype=kv
                ).target
            figures[kv] = (target.kv_bytes_per_token, *held_per_position(target, prompt_tokens))
        config = target.config
        shape = (config.num_hidden_layers, config.num_key_value_heads, target.attention.shape[2])
        llama_cpp = 2 * 2 * shape[0] * shape[1] * shape[2]
        # llama.cpp keeps only the window of sliding layers: at long context, the others count
        kinds = getattr(config, "layer_types", None) or ["full_attention"] * shape[0]
        whole_layers = sum(kind != "sliding_attention" for kind in kinds)
        kib = lambda n: f"{n / 1024:.2f} KiB"  # noqa: E731
        rows.append(
            f"| {name} | {' x '.join(map(str, shape))} | {kib(figures['float32'][0])} | "
            f"{kib(figures['float16'][0])} | {kib(figures['float16'][1])} | "
            f"{figures['float16'][2] / 2**20:.2f} MiB | {kib(llama_cpp)} | "
            f"{kib(llama_cpp * whole_layers / shape[0])} |"
        )
        print(rows[-1], flush=True)
    return rows


def decoding(lm, prompt: list[int], tokens: int, cache: PrefixCache) -> float:
    """Tokens/s after the first token of a plain greedy generation after ``prompt``."""
    stream = lm.stream(prompt, max_new_tokens=tokens, drafter="none", prefix_cache=cache)
    first = None
    for _ in stream:
        first = first or time.perf_counter()
    end = time.perf_counter()
    new = stream.result.stats.new_tokens
    return (new - 1) / (end - first)


def speed_table(context: int, rounds: int, tokens: int) -> list[str]:
    import argparse as source

    base = promptlookup.load_model(kv_dtype="float32")
    text = Path(source.__file__).read_text()
    prompt = base.tokenizer(text, add_special_tokens=False)["input_ids"][:context]
    lms = {
        kv: promptlookup.from_transformers(base.model, base.tokenizer, kv_dtype=kv)
        for kv in ("float32", "float16")
    }
    caches = {kv: PrefixCache(mib=2048) for kv in lms}
    for kv, lm in lms.items():  # the prompt into each cache (prefill), and a warm-up
        lm.generate(prompt, max_new_tokens=4, drafter="none", prefix_cache=caches[kv])
    speeds = {kv: [] for kv in lms}
    for round_ in range(rounds):
        for kv in list(lms) if round_ % 2 == 0 else list(reversed(lms)):
            speeds[kv].append(decoding(lms[kv], prompt, tokens, caches[kv]))
            print(f"round {round_ + 1} {kv}: {speeds[kv][-1]:.1f} tokens/s", flush=True)
    rows = [
        f"| keys and values | decoding tokens/s after {len(prompt)} prompt tokens, per round | median |",
        "|---|---|---:|",
    ]
    for kv, values in speeds.items():
        per_round = " / ".join(f"{v:.1f}" for v in values)
        rows.append(f"| {kv} | {per_round} | {statistics.median(values):.1f} |")
    ratio = statistics.median(speeds["float16"]) / statistics.median(speeds["float32"])
    rows.append(f"\nfloat16 / float32 (medians): {ratio:.3f}")
    return rows


def kernel_table(context: int, repeats: int = 7, calls: int = 50) -> list[str]:
    """Part 2b: the attention kernel alone, one query row (the default model's 9 heads over 3
    key/value heads of 64) over ``context`` cached keys, float32 against float16 keys and
    values, interleaved; the fastest of ``repeats`` runs of ``calls`` calls (less sensitive to
    a shared machine than whole generations)."""
    from promptlookup.backends.gguf.native_attention import PassRows, native_attention
    from promptlookup.backends.hf.cache import GrowingLayer

    generator = torch.Generator().manual_seed(0)
    states = [torch.randn(1, 3, context, 64, generator=generator) for _ in range(2)]
    query = torch.randn(1, 9, 1, 64, generator=generator)
    layers = {}
    for kv in (torch.float32, torch.float16):
        layers[kv] = GrowingLayer(transposed_keys=True, kv_dtype=kv)
        layers[kv].update(*states)
    rows = PassRows([context - 1], [1])
    best = {kv: float("inf") for kv in layers}
    for _ in range(repeats):
        for kv, layer in layers.items():
            begin = time.perf_counter()
            for _ in range(calls):
                native_attention(query, [layer], rows, 0.125)
            best[kv] = min(best[kv], (time.perf_counter() - begin) / calls)
    return [
        f"| kernel, one row over {context} keys | float32 {1e6 * best[torch.float32]:.0f} us | "
        f"float16 {1e6 * best[torch.float16]:.0f} us | "
        f"{best[torch.float32] / best[torch.float16]:.2f}x |"
    ]


#: Requests for part 3 (written for this study).
QUESTIONS = [
    "Explain in three sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "List five uses of a hash map, one line each.",
    "Rewrite this sentence more politely: send me the report by noon or else.",
]


def agreement_table(tokens: int) -> list[str]:
    """Part 3: greedy answers of the default model with each kv_dtype, against float32's:
    how many of the first ``tokens`` tokens each keeps before it parts from float32's."""
    base = promptlookup.load_model(kv_dtype="float32")
    answers = {}
    for kv in ("float32", "float16", "bfloat16"):
        lm = promptlookup.from_transformers(base.model, base.tokenizer, kv_dtype=kv)
        answers[kv] = [
            lm.generate([{"role": "user", "content": q}], max_new_tokens=tokens).token_ids
            for q in QUESTIONS
        ]

    def common(a: list[int], b: list[int]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    rows = [
        f"| keys and values | tokens equal to float32's before they part, of {tokens}, per request |",
        "|---|---|",
    ]
    for kv in ("float16", "bfloat16"):
        kept = [common(a, b) for a, b in zip(answers[kv], answers["float32"])]
        rows.append(f"| {kv} | {' / '.join(map(str, kept))} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=5200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/kv-dtype"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", default="default,gemma-3-270m,7b-attention")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--memory-tokens", type=int, default=2000, help="part 1's prompt")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--agreement", type=int, default=0, metavar="TOKENS")
    parser.add_argument("--kernel", action="store_true", help="part 2b: the kernel alone")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.folder.mkdir(parents=True, exist_ok=True)
    lines = []
    if not args.skip_memory:
        lines += memory_table(args.folder, args.models.split(","), args.memory_tokens) + [""]
    if not args.skip_speed:
        lines += speed_table(args.context, args.rounds, args.tokens) + [""]
    if args.kernel:
        lines += kernel_table(args.context) + [""]
    if args.agreement:
        lines += agreement_table(args.agreement)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
