"""vLLM benchmark: tokens/s of vLLM's OpenAI server with no speculation, with vLLM's own n-gram
and suffix speculation, and with promptlookup's proposer (with and without a prediction), on
the same prompts and model, at several concurrency levels.

Each method is one vLLM server a user would run (``python -m
vllm.entrypoints.openai.api_server``, started by this script on a free 127.0.0.1 port, with the
same ``--max-model-len``, ``--dtype`` and ``--max-num-seqs``). All servers are started first and
stay up; the methods then take turns (interleaved), so that a machine whose speed drifts (a
shared one) slows every method alike: for each task and concurrency level, ``--rounds`` rounds,
each running every method once over the prompts, the order rotated by one method per round.
A method's tokens/s is its completion tokens over its time, summed over the rounds.

- ``plain``: no speculation;
- ``ngram``: ``{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 4,
  "prompt_lookup_min": 2}`` (vLLM's n-gram proposer as its docs set it up);
- ``suffix``: ``{"method": "suffix", "num_speculative_tokens": 16,
  "suffix_decoding_max_cached_requests": 0}`` (needs the package ``arctic-inference``; skipped
  with a note when it is missing): vLLM's suffix decoding from each request's own prompt and
  output, without its global tree of earlier answers, which in this benchmark's repeated
  prompts would replay the answers of earlier rounds and levels;
- ``promptlookup``: promptlookup's proposer, exactly as ``promptlookup vllm-serve`` runs it
  (drafts of up to 16 tokens, the middleware, ``--per-request-spec-decode-metrics summary``);
- ``spec-off`` (not in the default methods): vLLM's speculative path (``custom_class``, the
  same flags) with a proposer that never drafts, :class:`NoDrafts`: what the path costs by
  itself, so the bound of any proposer where drafting does not pay;
- ``promptlookup-throughput`` (not in the default methods): the same with
  ``PROMPTLOOKUP_VLLM_BATCH_RULE=throughput``, the policy's own rule in batches (before the
  bottleneck rule, ``promptlookup.vllm.batch_policy``);
- ``promptlookup-predicted``: the same server, each request carrying OpenAI's ``prediction``:
  plain's answer to it (a prediction that matches the answer, as when re-sending an edit); its
  answers' ``usage.completion_tokens_details`` (accepted and rejected prediction tokens) are
  summed into the results.

Requests: chat completions, greedy (temperature 0), ``max_tokens`` fixed, not streamed; the
first ``--prompts`` prompts of each task of promptlookup's built-in bench suite (``--suite``,
the prompts of ``promptlookup bench``), or of each task file (``--tasks``, JSONL rows with
``messages``), sent with N in flight at once (N client threads over the list), after one warm-up request per server.
Recorded per task and level: completion tokens over wall time (tokens/s), and whether each
text equals plain's at the same level (first round). Results go to ``--out`` (JSON) and a table
on stdout with each method's ratio to plain and to ngram.

    python benchmarks/vllm_bench.py --suite code_edit,summarization,open_ended \\
        --prompts 8 --max-tokens 96 --concurrency 1,8 --rounds 2 --out bench-out/vllm.json
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

METHODS = {
    "plain": None,
    "ngram": {
        "method": "ngram",
        "num_speculative_tokens": 8,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    },
    # No global tree of earlier answers: the rounds repeat the same prompts, and it would
    # replay their answers (a prediction in disguise); each request's prompt tree stays.
    "suffix": {
        "method": "suffix",
        "num_speculative_tokens": 16,
        "suffix_decoding_max_cached_requests": 0,
    },
    "promptlookup": {
        "method": "custom_class",
        "model": "promptlookup.vllm.PromptLookupProposer",
        "num_speculative_tokens": 16,
    },
    # Not in the default methods: the same proposer with the policy's own rule in batches
    # (tokens per second over all rows, as before the bottleneck rule; METHOD_ENV).
    "promptlookup-throughput": {
        "method": "custom_class",
        "model": "promptlookup.vllm.PromptLookupProposer",
        "num_speculative_tokens": 16,
    },
    # Not in the default methods: vLLM's speculative path with a proposer that never drafts
    # (NoDrafts, below): what the path costs by itself, the bound of any proposer's figures
    # where drafting does not pay.
    "spec-off": {
        "method": "custom_class",
        "model": "vllm_bench.NoDrafts",
        "num_speculative_tokens": 16,
    },
    # Not in the default methods: the same proposer allowed drafts of up to 32 tokens.
    "promptlookup-32": {
        "method": "custom_class",
        "model": "promptlookup.vllm.PromptLookupProposer",
        "num_speculative_tokens": 32,
    },
}


#: Environment variables of a method's server, besides the common ones.
METHOD_ENV = {
    "promptlookup-throughput": {"PROMPTLOOKUP_VLLM_BATCH_RULE": "throughput"},
    "spec-off": {"PYTHONPATH": str(Path(__file__).resolve().parent)},  # finds NoDrafts here
}


class NoDrafts:
    """A proposer for vLLM's ``custom_class`` that never drafts (the ``spec-off`` method)."""

    def __init__(self, vllm_config) -> None:
        pass

    def load_model(self, *args, **kwargs) -> None:
        pass

    def propose(self, sampled_token_ids, *args, **kwargs) -> list[list[int]]:
        return [[] for _ in sampled_token_ids]


def openmp_preload() -> dict:
    from promptlookup.vllm.command import openmp_preload

    return openmp_preload()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    model: str, spec: dict | None, args, log: Path, extra_env: dict | None = None
) -> tuple[subprocess.Popen, str]:
    """vLLM's OpenAI server for one method (it is starting; :func:`wait_ready`)."""
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    command += ["--served-model-name", "model", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--max-model-len", str(args.max_model_len), "--dtype", args.dtype]
    command += ["--max-num-seqs", str(max(args.concurrency)), "--disable-log-stats"]
    command += ["--middleware", "promptlookup.vllm.PredictedOutputs"]
    if args.enforce_eager:
        command.append("--enforce-eager")
    if spec is not None:
        command += ["--speculative-config", json.dumps(spec)]
    if spec is not None and spec.get("method") == "custom_class":
        from promptlookup.vllm.command import SPEC_METRICS

        command += list(SPEC_METRICS)  # as promptlookup vllm-serve runs it
    # No vLLM plugin loads: arctic-inference's would patch vLLM (the suffix method only
    # imports its suffix tree).
    env = {
        **openmp_preload(),
        "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib),
        "VLLM_PLUGINS": "",
        **(extra_env or {}),
    }
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    return process, f"http://127.0.0.1:{port}"


def wait_ready(process: subprocess.Popen, url: str, args, log: Path) -> None:
    """Wait until the server's /health answers (RuntimeError if it exits or times out)."""
    deadline = time.monotonic() + args.start_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(2)
    process.terminate()
    raise RuntimeError(f"server did not start in {args.start_timeout} s; see {log}")


def chat(url: str, messages: list, max_tokens: int, prediction: str | None = None) -> dict:
    body = {"model": "model", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    if prediction is not None:
        body["prediction"] = {"type": "content", "content": prediction}
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=3600) as answer:
        data = json.loads(answer.read())
    details = data["usage"].get("completion_tokens_details") or {}
    return {
        "text": data["choices"][0]["message"]["content"],
        "tokens": data["usage"]["completion_tokens"],
        "accepted_prediction_tokens": details.get("accepted_prediction_tokens"),
        "rejected_prediction_tokens": details.get("rejected_prediction_tokens"),
    }


def run_level(url, prompts, max_tokens, concurrency, predictions=None) -> dict:
    """All ``prompts`` with ``concurrency`` in flight: tokens/s over the wall time, texts."""
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        answers = list(
            pool.map(
                lambda i: chat(url, prompts[i], max_tokens, predictions and predictions[i]),
                range(len(prompts)),
            )
        )
    seconds = time.perf_counter() - start
    cell = {"seconds": seconds, "tokens": sum(a["tokens"] for a in answers),
            "texts": [a["text"] for a in answers]}  # fmt: skip
    for key in ("accepted_prediction_tokens", "rejected_prediction_tokens"):
        counts = [a[key] for a in answers]
        if any(c is not None for c in counts):
            cell[key] = sum(c or 0 for c in counts)
    return cell


def add_round(total: dict | None, cell: dict) -> dict:
    """Sum a round's cell into the method's total (texts: the first round's)."""
    if total is None:
        return {**cell, "rounds": [round(cell["seconds"], 3)]}
    total["seconds"] += cell["seconds"]
    total["tokens"] += cell["tokens"]
    total["rounds"].append(round(cell["seconds"], 3))
    for key in ("accepted_prediction_tokens", "rejected_prediction_tokens"):
        if key in cell:
            total[key] = total.get(key, 0) + cell[key]
    return total


def read_prompts(path: str, count: int) -> list:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [row["messages"] for row in rows[:count]]


def ratio(cell: dict, other: dict | None) -> str:
    """``cell``'s tokens/s over ``other``'s, as text (empty without ``other``)."""
    return f"{cell['tokens_per_second'] / other['tokens_per_second']:.2f}" if other else ""


def table(results: dict, levels: list[int]) -> str:
    lines = ["| method | task | concurrency | tokens/s | x plain | x ngram | same text as plain |"]
    lines.append("|---|---|---:|---:|---:|---:|---:|")
    for method, tasks in results.items():
        if method == "config":
            continue
        for task, by_level in tasks.items():
            for level in levels:
                cell = by_level.get(str(level))
                if cell is None:
                    continue
                plain = results.get("plain", {}).get(task, {}).get(str(level))
                ngram = results.get("ngram", {}).get(task, {}).get(str(level))
                lines.append(
                    f"| {method} | {task} | {level} | {cell['tokens_per_second']:.1f} | "
                    f"{ratio(cell, plain)} | {ratio(cell, ngram)} | {cell.get('same_as_plain', '')} |"
                )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="as for promptlookup vllm-serve")
    parser.add_argument(
        "--suite",
        default="code_edit,summarization,open_ended",
        help="tasks of promptlookup's built-in bench suite (promptlookup bench's prompts)",
    )
    parser.add_argument("--tasks", help="name=path.jsonl,... (rows with messages), not the suite")
    parser.add_argument(
        "--methods", default="plain,ngram,suffix,promptlookup,promptlookup-predicted"
    )
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds per cell")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument("--enforce-eager", action="store_true", help="no torch.compile")
    parser.add_argument("--start-timeout", type=float, default=1200)
    parser.add_argument("--out", default="bench-out/vllm.json")
    args = parser.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    from promptlookup.vllm.command import model_folder

    model, _ = model_folder(None if args.model == "default" else args.model)
    if args.tasks:
        tasks = {
            name: read_prompts(path, args.prompts)
            for name, path in (item.split("=", 1) for item in args.tasks.split(","))
        }
    else:
        from promptlookup.bench.suite import suite_rows

        names = tuple(args.suite.split(","))
        rows = suite_rows(limit=args.prompts, tasks=names)
        tasks = {name: [r.messages for r in rows if r.task == name] for name in names}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    methods = args.methods.split(",")
    if "suffix" in methods and not _has("arctic_inference"):
        print("suffix: skipped, the package arctic-inference is not installed", flush=True)
        methods.remove("suffix")
    if "promptlookup-predicted" in methods and "plain" not in methods:
        raise SystemExit("promptlookup-predicted needs plain (its answers are the predictions)")
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    signal.signal(signal.SIGTERM, _interrupted)  # stopped: the servers are still stopped
    try:
        for method in dict.fromkeys(_server_of(m) for m in methods):
            log = out.with_name(f"{out.stem}-{method}.log")
            servers[method] = start_server(
                model, METHODS[method], args, log, METHOD_ENV.get(method)
            )
            try:  # one at a time: their start-ups (and warm-ups) compete for the cores
                wait_ready(*servers[method], args, log)
            except RuntimeError as exc:
                print(f"{method}: {exc}", flush=True)
                del servers[method]
                continue
            chat(servers[method][1], [{"role": "user", "content": "Hello"}], 8)  # warm-up
        methods = [m for m in methods if _server_of(m) in servers]
        results = run_interleaved(servers, methods, tasks, args, out)
    finally:
        for process, _ in servers.values():
            process.terminate()
        for process, _ in servers.values():
            process.wait(timeout=60)
    print(table(results, args.concurrency))


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt


def _server_of(method: str) -> str:
    return "promptlookup" if method == "promptlookup-predicted" else method


def run_interleaved(servers: dict, methods: list[str], tasks: dict, args, out: Path) -> dict:
    """Every task and level: ``args.rounds`` rounds of every method in turn (the order
    rotated each round; plain first in the first round, since its answers are the
    predictions); results written to ``out`` after each cell."""
    results: dict = {"config": {"methods": methods, "rounds": args.rounds,
                                "prompts": args.prompts, "max_tokens": args.max_tokens}}  # fmt: skip
    for task, prompts in tasks.items():
        for level in args.concurrency:
            totals: dict[str, dict] = {}
            for round_ in range(args.rounds):
                shift = round_ % len(methods)
                for method in methods[shift:] + methods[:shift]:
                    predictions = None
                    if method == "promptlookup-predicted":
                        plain = results.get("plain", {}).get(task, {})
                        plain = plain.get("1") or plain.get(str(level)) or totals.get("plain")
                        predictions = plain["texts"]
                    url = servers[_server_of(method)][1]
                    cell = run_level(url, prompts, args.max_tokens, level, predictions)
                    print(f"{method} {task} x{level} round {round_ + 1}: "
                          f"{cell['tokens'] / cell['seconds']:.1f} tokens/s "
                          f"({cell['tokens']} tokens, {cell['seconds']:.1f} s)", flush=True)  # fmt: skip
                    totals[method] = add_round(totals.get(method), cell)
            for method, cell in totals.items():
                cell["tokens_per_second"] = cell["tokens"] / cell["seconds"]
                plain = totals.get("plain")
                if plain:
                    same = sum(a == b for a, b in zip(cell["texts"], plain["texts"]))
                    cell["same_as_plain"] = f"{same}/{len(prompts)}"
                results.setdefault(method, {}).setdefault(task, {})[str(level)] = cell
            out.write_text(json.dumps(results, indent=1))
    return results


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    main()
