"""Session benchmark: the cross-request index off, per tenant and global, on request sequences
whose later answers repeat earlier ones (:mod:`promptlookup.bench.sessions.workload`: extraction to a
fixed JSON shape, unit tests, an agent loop's tool calls, repeated edits of one file, all
built at run time from the installed Python standard library's sources).

    python benchmarks/cross_request_sessions.py --out benchmarks/runs/sessions           # the default model
    python benchmarks/cross_request_sessions.py --per-kind 1 --requests 2 --max-new-tokens 32   # a smoke test
    python benchmarks/cross_request_sessions.py --concurrency 8 ...     # 8 sessions' requests share passes
    python benchmarks/cross_request_sessions.py --memory-only            # the index's memory over a long run

Prints a markdown table (tokens per forward pass, tokens/s and the speed-up over the index
off, per kind and over all sessions) and whether every output equalled the index-off output;
``--out DIR`` also writes sessions.md and sessions.json. ``--memory-only`` fills an index of
``--max-tokens`` with many times its budget and prints its tokens, entries and traced bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from pathlib import Path

from promptlookup.bench.sessions import cross_request, workload
from promptlookup.drafters import CrossRequestIndex


def measure_memory(max_tokens: int, rounds: int = 8) -> dict:
    """Traced bytes of an index after adding ``rounds`` times its budget of varied tokens."""
    import random

    rng = random.Random(0)
    vocabulary = list(range(49152))
    tracemalloc.start()
    index = CrossRequestIndex(max_tokens=max_tokens)
    added, start = 0, time.perf_counter()
    while added < rounds * max_tokens:
        document = index.open(rng.sample(vocabulary, 32))
        skeleton = rng.sample(vocabulary, 64)  # outputs that repeat a skeleton, with changes
        index.extend(
            document, [t if rng.random() < 0.7 else rng.choice(vocabulary) for t in skeleton * 4]
        )
        added += 32 + 256
    seconds = time.perf_counter() - start
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "max_tokens": max_tokens,
        "tokens_added": added,
        "tokens_held": len(index),
        "entries": index.entries,
        "traced_bytes": current,
        "peak_bytes": peak,
        "bytes_per_token_held": round(current / max(1, len(index))),
        "microseconds_per_token_added": round(1e6 * seconds / added, 2),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model (default: the default model)")
    parser.add_argument(
        "--dtype", default="auto", help="auto: a GGUF in its own quantization [auto]"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads [1]")
    parser.add_argument("--kinds", default=",".join(workload.KINDS))
    parser.add_argument("--modes", default=",".join(cross_request.MODES))
    parser.add_argument("--per-kind", type=int, default=2, help="sessions per kind [2]")
    parser.add_argument("--requests", type=int, default=6, help="requests per session [6]")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--concurrency", type=int, default=1, help="sessions sharing passes [1]")
    parser.add_argument("--max-tokens", type=int, default=32768, help="index budget [32768]")
    parser.add_argument(
        "--against",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="an OpenAI-compatible server, raced as one more mode (repeatable)",
    )
    parser.add_argument("--memory-only", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    if args.memory_only:
        print(json.dumps(measure_memory(args.max_tokens), indent=2))
        return 0
    import torch

    import promptlookup

    torch.set_num_threads(args.threads)
    lm = promptlookup.load_model(args.model, dtype=args.dtype)
    lm.warm_up()
    from promptlookup.bench.servers import ServerMethod, parse_against

    servers = [ServerMethod(*parse_against(item), lm=lm) for item in args.against]
    modes = args.modes.split(",")
    sessions = workload.build_sessions(args.kinds.split(","), args.per_kind, args.requests)
    started = time.perf_counter()
    run = cross_request.run_sessions(
        lm,
        sessions,
        modes=modes,
        max_new_tokens=args.max_new_tokens,
        requests=args.requests,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        servers=servers,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    table = cross_request.report(run, modes)
    command = "python benchmarks/cross_request_sessions.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    text = (
        f"Session benchmark: {lm.name}, {args.dtype}, {args.threads} thread(s), concurrency "
        f"{args.concurrency}, {args.per_kind} session(s) per kind x {args.requests} requests, "
        f"max_new_tokens {args.max_new_tokens}, {time.perf_counter() - started:.0f} s.\n"
        f"Command: `{command}`\n\n{table}\n"
    )
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sessions.md").write_text(text, encoding="utf-8")
        data = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "identical": run.identical,
            "mismatches": run.mismatches,
            "index_tokens": run.index_tokens,
            "same_text": run.same_text,
            "records": run.records,
            "tallies": [
                {"kind": kind, "mode": mode, **tally.as_dict()}
                for (kind, mode), tally in run.tallies.items()
            ],
        }
        (args.out / "sessions.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
    return 0 if run.identical else 1


if __name__ == "__main__":
    sys.exit(main())
