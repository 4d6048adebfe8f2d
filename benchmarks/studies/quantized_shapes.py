"""Resident memory and pass costs of quantized weights at real model sizes.

Writes random-weight GGUF files of Llama-3.2-1B's and Llama-3.1-8B's shapes, and of Qwen3-1.7B's,
Gemma-3-1B's and Phi-4-mini's (each family's own tensors and metadata), in llama.cpp's
Q4_0 and Q4_K_M tensor mixes (random blocks with finite scales, written with the ``gguf``
package: memory and speed do not depend on the values), loads each with promptlookup's
quantized weights in a fresh process, and reports the peak and resident memory after loading
and after passes of 1/2/4/8/16 tokens at the given contexts (median of a few); with
``--llama-bench``, llama.cpp's times for the same passes of the same files (which carry the
metadata llama.cpp reads, and no vocabulary).

    python benchmarks/studies/quantized_shapes.py --shapes 1b,8b --formats Q4_0,Q4_K_M \\
        --contexts 512,2048 --folder /tmp/shapes --llama-bench /path/to/llama-bench \\
        --out benchmarks/runs/quantized-shapes.md

The files are large (8B: about 4.5 GB each); ``--folder`` should have room for them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

SHAPES = {  # hidden, intermediate, layers, heads, kv heads, vocab, tied
    "1b": (2048, 8192, 16, 32, 8, 128256, True),
    "8b": (4096, 14336, 32, 32, 8, 128256, False),
    "qwen3-1.7b": (2048, 6144, 28, 16, 8, 151936, True),
    "gemma3-1b": (1152, 6912, 26, 4, 1, 262144, True),
    "phi4-mini": (3072, 8192, 32, 24, 8, 200064, True),
}
#: The GGUF architecture of a shape (Llama's where not named), its head size where it is not
#: hidden / heads, and its family's metadata (Gemma 3: a 512-token window on 5 layers of 6).
ARCHS = {"qwen3-1.7b": "qwen3", "gemma3-1b": "gemma3", "phi4-mini": "phi3"}
HEAD_DIMS = {"qwen3-1.7b": 128, "gemma3-1b": 256}


def kind_of(tensor: str, layer: int, layers: int, mix: str, k: int) -> str:
    """The type llama-quantize gives a tensor of rows of ``k`` in ``mix`` (Q4_K_M: Q6_K for
    the head and, in the layers its rule picks, the value and down projections; rows that are
    not whole 256-blocks fall back to Q5_0 for Q4_K and Q8_0 for Q6_K, as Gemma-3-1B's do)."""
    kind = _kind(tensor, layer, layers, mix)
    if kind.endswith("_K") and k % 256:
        return {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[kind]
    return kind


def _kind(tensor: str, layer: int, layers: int, mix: str) -> str:
    if tensor == "output":
        return "Q6_K"
    if mix == "Q4_0":
        return "Q4_0"
    more_bits = layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2
    return "Q6_K" if tensor in ("attn_v", "attn_qkv", "ffn_down") and more_bits else "Q4_K"


def write_gguf(path: Path, shape: str, mix: str) -> dict:
    import gguf
    from gguf import GGMLQuantizationType as T

    hidden, inter, layers, heads, kv, vocab, tied = SHAPES[shape]
    head_dim = HEAD_DIMS.get(shape, hidden // heads)
    arch = ARCHS.get(shape, "llama")
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), arch)
    # The metadata llama.cpp reads, so that llama-bench runs the same file (no vocabulary:
    # llama-bench feeds token ids).
    writer.add_block_count(layers)
    writer.add_context_length(8192)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    rotated = head_dim * 3 // 4 if arch == "phi3" else head_dim  # Phi-4-mini: partial RoPE
    writer.add_rope_dimension_count(rotated)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("none")
    if arch == "gemma3":
        writer.add_sliding_window(512)
    if arch == "phi3":
        writer.add_uint32("phi3.rope.scaling.original_context_length", 4096)
        writer.add_float32("phi3.rope.scaling.attn_factor", 1.19)
    tensors = [("token_embd", -1, vocab, hidden), ("output_norm", -1, hidden, 0)]
    if arch == "phi3":
        tensors += [
            ("rope_factors_long", -1, rotated // 2, 0),
            ("rope_factors_short", -1, rotated // 2, 0),
        ]
    if not tied:
        tensors.append(("output", -1, vocab, hidden))
    width, kv_width = heads * head_dim, kv * head_dim
    for i in range(layers):
        tensors += [
            ("attn_norm", i, hidden, 0), ("ffn_norm", i, hidden, 0),
            ("attn_output", i, hidden, width), ("ffn_down", i, hidden, inter),
        ]  # fmt: skip
        if arch == "phi3":  # fused, as Phi-3's files are
            tensors += [
                ("attn_qkv", i, width + 2 * kv_width, hidden),
                ("ffn_up", i, 2 * inter, hidden),
            ]
        else:
            tensors += [
                ("attn_q", i, width, hidden), ("attn_k", i, kv_width, hidden),
                ("attn_v", i, kv_width, hidden), ("ffn_gate", i, inter, hidden),
                ("ffn_up", i, inter, hidden),
            ]  # fmt: skip
        if arch in ("qwen3", "gemma3"):
            tensors += [("attn_q_norm", i, head_dim, 0), ("attn_k_norm", i, head_dim, 0)]
        if arch == "gemma3":
            tensors += [("post_attention_norm", i, hidden, 0), ("post_ffw_norm", i, hidden, 0)]
    for name, layer, n, k in tensors:
        full = name if layer < 0 else f"blk.{layer}.{name}"
        if k == 0:
            writer.add_tensor(full + ".weight", np.ones(n, dtype=np.float32))
            continue
        kind = T[kind_of(name, layer, layers, mix, k)]
        size, nbytes = gguf.GGML_QUANT_SIZES[kind]
        raw = rng.integers(0, 256, (n, k // size, nbytes), dtype=np.uint8)
        halves = {T.Q6_K: [208], T.Q4_0: [0], T.Q5_0: [0], T.Q8_0: [0]}.get(kind, [0, 2])
        for offset in halves:
            raw[..., offset : offset + 2] = np.array([0.002], dtype=np.float16).view(np.uint8)
        writer.add_tensor(full + ".weight", raw.reshape(n, -1), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {
        "model_type": "llama", "vocab_size": vocab, "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": tied, "rope_theta": 500000.0,
    }  # fmt: skip


MEASURE = r"""
import json, resource, statistics, sys, time
import psutil, torch
from promptlookup.backends.gguf.loader import load_quantized
from promptlookup.backends.hf.target import TorchTarget
path, config, contexts, threads = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
rss = lambda: psutil.Process().memory_info().rss / 2**20
start = time.perf_counter()
model, formats = load_quantized(path, __import__("pathlib").Path(config))
loaded = {"load_s": time.perf_counter() - start, "rss_loaded_mib": rss(),
          "peak_loading_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
target = TorchTarget(model)
passes = {}
for context in contexts:
    target.reset()
    target.extend(list(range(5, 5 + context)))  # one prefill per context; passes cropped back
    for tokens in (1, 2, 4, 8, 16):
        seconds = []
        for repeat in range(3):
            begin = time.perf_counter()
            target.forward(list(range(7, 7 + tokens)))
            seconds.append(time.perf_counter() - begin)
            target.crop(context)
        passes[f"{context}x{tokens}"] = 1000 * statistics.median(seconds)
print(json.dumps({**loaded, "formats": formats, "pass_ms": passes, "rss_after_mib": rss(),
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def llama_bench(
    binary: str, path: Path, contexts: list[int], threads: int, repetitions: int = 3
) -> dict:
    """llama-bench's milliseconds per pass of t tokens after c (its prompt-processing test of
    t tokens at depth c): {(c, t): ms}. Where its repacked weights crash (some CPUs' AMX
    kernels), the file's own layout (``--repack 0``)."""
    command = [binary, "-m", str(path), "-t", str(threads), "-p", "1,2,4,8,16", "-n", "0",
               "-d", ",".join(map(str, contexts)), "-r", str(repetitions), "-o", "json"]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        out = subprocess.run(
            command + ["--repack", "0"], capture_output=True, text=True, check=True
        )
    return {
        (run["n_depth"], run["n_prompt"]): 1000 * run["n_prompt"] / run["avg_ts"]
        for run in json.loads(out.stdout)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1b,8b", help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--formats", default="Q4_0,Q4_K_M")
    parser.add_argument("--contexts", default="512,2048")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/quantized-shapes"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--llama-bench", help="also time the same passes with llama.cpp's llama-bench (its path)"
    )
    parser.add_argument(
        "--repetitions", type=int, default=3, help="llama-bench's runs of each pass (-r)"
    )
    args = parser.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    contexts = [int(c) for c in args.contexts.split(",")]
    lines = [
        "| shape | mix | file MiB | load s | peak loading MiB | resident after passes MiB |"
        + "".join(f" {c}x{t} ms |" for c in contexts for t in (1, 2, 4, 8, 16)),
        "|---|---|---:|---:|---:|---:|" + "---:|" * (5 * len(contexts)),
    ]
    for shape in args.shapes.split(","):
        for mix in args.formats.split(","):
            path = args.folder / f"random-{shape}-{mix}.gguf"
            config = path.with_suffix(".json")  # Llama's; the families read their own metadata
            if not path.exists():
                values = write_gguf(path, shape, mix)
                if shape not in ARCHS:
                    config.write_text(json.dumps(values))
            out = subprocess.run(
                [sys.executable, "-c", MEASURE, str(path), str(config), json.dumps(contexts),
                 str(args.threads)], capture_output=True, text=True, check=True,
            )  # fmt: skip
            row = json.loads(out.stdout.strip().splitlines()[-1])
            cells = "".join(f" {row['pass_ms'][f'{c}x{t}']:.0f} |" for c in contexts
                            for t in (1, 2, 4, 8, 16))  # fmt: skip
            lines.append(
                f"| {shape} | {mix} | {path.stat().st_size / 2**20:.0f} | {row['load_s']:.0f} "
                f"| {row['peak_mib']:.0f} | {row['rss_after_mib']:.0f} |{cells}"
            )
            print(lines[-1], flush=True)
            if args.llama_bench:
                ms = llama_bench(args.llama_bench, path, contexts, args.threads, args.repetitions)
                cells = "".join(f" {ms[(c, t)]:.0f} |" for c in contexts for t in (1, 2, 4, 8, 16))
                lines.append(f"| {shape} | {mix}, llama-bench | | | | |{cells}")
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
