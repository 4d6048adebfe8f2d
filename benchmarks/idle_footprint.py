"""Where an idle `promptlookup serve` keeps its resident memory: the steps of its start-up in
one process (Python and torch, the server's imports, the tokenizer, the model's weights, the
target and its warm-up), each step's resident set (VmRSS) and peak (VmHWM), then the largest
mappings (/proc/self/smaps) and the model's tensors by kind. A markdown table on stdout.

Usage: python benchmarks/idle_footprint.py [--model MODEL] [--threads 2]
"""

from __future__ import annotations

import argparse
import collections
import gc


def memory() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in MiB."""
    values = {}
    for line in open("/proc/self/status"):
        key, _, rest = line.partition(":")
        values[key] = int(rest.split()[0]) // 1024 if key in ("VmRSS", "VmHWM") else None
    return values["VmRSS"], values["VmHWM"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    rows = [("Python", *memory())]
    import torch

    torch.set_num_threads(args.threads)
    rows.append(("import torch", *memory()))
    import promptlookup.server.app  # noqa: F401  (what serve imports before loading)
    import promptlookup.server.command  # noqa: F401
    import promptlookup.server.state  # noqa: F401

    rows.append(("the server's imports (FastAPI, uvicorn, transformers, llguidance...)", *memory()))
    from promptlookup.loading import gguf_tokenizer, load_model
    from promptlookup.models import resolve_model

    source = resolve_model(args.model)
    if source.kind == "gguf":
        gguf_tokenizer(f"{source.location}/{source.gguf_file}")
        rows.append(("the tokenizer", *memory()))
    lm = load_model(args.model)
    rows.append(("load_model (weights, target)", *memory()))
    lm.warm_up()
    rows.append(("warm_up (as serve does before /health)", *memory()))
    print(f"Idle footprint of {source.name}, {args.threads} threads\n")
    print("| step | VmRSS (MiB) | + | VmHWM (MiB) |\n|---|---:|---:|---:|")
    before = 0
    for name, rss, hwm in rows:
        print(f"| {name} | {rss} | {rss - before:+d} | {hwm} |")
        before = rss
    # The model's tensors, each storage once: packed weights (uint8 panels) and float ones.
    seen, kinds = set(), collections.Counter()
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
            storage = obj.untyped_storage()
            if storage.data_ptr() and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                kinds[str(obj.dtype)] += storage.nbytes()
    print("\nTensors alive (each storage once), MiB: ", end="")
    print(", ".join(f"{kind} {size / 2**20:.1f}" for kind, size in kinds.most_common()))
    mappings, current = collections.Counter(), None
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            current = fields[5] if len(fields) > 5 else "[anonymous]"
        elif fields[0] == "Rss:":
            mappings[current] += int(fields[1])
    print("\n| mapping | resident (MiB) |\n|---|---:|")
    for name, kib in mappings.most_common(8):
        print(f"| {name.rpartition('/')[2]} | {kib // 1024} |")


if __name__ == "__main__":
    main()
