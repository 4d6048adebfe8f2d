"""The prefix cache of ``promptlookup serve``, measured through its API: whether one tenant's
reply times reveal another tenant's prompt (``isolation``), and whether memory stays within
the budget under a mixed load of many tenants (``soak``). Each starts its own servers on free
127.0.0.1 ports (the default model, ``--threads``), with a keys file of tenants, and stops
them; loopback only, bounded in requests and time.

    python benchmarks/prefix_cache.py isolation --out benchmarks/runs/prefix-isolation
    python benchmarks/prefix_cache.py soak --minutes 5 --out benchmarks/runs/prefix-soak
    python benchmarks/prefix_cache.py restart --prompts 3 --prefix-chars 18000 --out ...
    python benchmarks/prefix_cache.py shared --against pl=http://127.0.0.1:8000 \
        --against llama-server=http://127.0.0.1:8080 --out benchmarks/runs/prefix-shared

``isolation``: for each of ``--prompts`` fresh prompts (a standard-library module's source,
about 1,500 tokens), tenant A sends it, then tenant B, then A again, one token each (the time
of a request is then its prefill); under ``--prefix-cache-scope per-tenant`` (the default)
and ``global``. Reports the median seconds of each.

``soak``: ``--clients`` clients hold conversations, each of a tenant drawn among
``--tenants`` (each turn the last one's messages, its answer and a new question) for
``--minutes``, with a small ``--prefix-cache-mib``; the server's RSS and the cache's use
(``GET /metrics``, the sum of ``promptlookup:prefix_cache_bytes`` over tenants) are sampled
every few seconds. Reports their maxima against the budget.

``restart``: for each of ``--prompts`` conversations (a module's source of ``--prefix-chars``
characters to summarize), turn 1 goes to a server with ``--prefix-cache-dir``, which is then
stopped (SIGTERM) and started again over the same folder for turn 2 (the question, its answer
and a new question); the same turn 2 also goes to a server with ``--prefix-cache-mib 0``.
Reports per conversation how much of turn 2's prompt was cached after the restart and whether
its text equals the one without a cache.

``shared``: 8 requests that share a long prefix (a module's source, then each its own
question), against servers already running (``--against NAME=URL``, each with its own
defaults): one by one first (so that every server has seen the prompts), then all 8 at once,
twice; reports the aggregate completion tokens/s at once (the better of the two rounds) and
how many answers equal the one-by-one ones.
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load_test import free_port, wait_healthy  # noqa: E402  (benchmarks/ is not a package)

MODEL = "SmolLM2-135M-Instruct.Q4_1"


def start(keys: Path, threads: int, *flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "promptlookup", "serve", "--port", str(port)]
    command += ["--threads", str(threads), "--api-keys-file", str(keys), *flags]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, time.monotonic() + 300, process)
    return process, url


def ask(url: str, key: str, messages: list, max_tokens: int) -> tuple[float, dict]:
    start = time.perf_counter()
    response = httpx.post(
        url + "/v1/chat/completions",
        json={"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0},
        headers={"Authorization": f"Bearer {key}"},
        timeout=600,
    )
    response.raise_for_status()
    return time.perf_counter() - start, response.json()


def sources(count: int, chars: int = 6000) -> list[str]:
    """Fresh prompts: the first ``chars`` characters of standard-library modules' sources."""
    import importlib

    found = []
    for name in ("textwrap", "shlex", "fnmatch", "calendar", "difflib", "statistics", "pprint"):
        source = inspect.getsource(importlib.import_module(name))
        found += [source[i : i + chars] for i in range(0, len(source) - chars, chars)]
    return found[:count]


def isolation(args, keys: Path) -> dict:
    results = {}
    for scope in ("per-tenant", "global"):
        process, url = start(keys, args.threads, "--prefix-cache-scope", scope)
        try:
            ask(url, "key-a", [{"role": "user", "content": "Hello"}], 1)  # warm up
            times = {"A first": [], "B after A": [], "A again": []}
            for text in sources(args.prompts):
                messages = [{"role": "user", "content": f"Summarize this file.\n{text}"}]
                for label, key in (("A first", "key-a"), ("B after A", "key-b"), ("A again", "key-a")):  # fmt: skip
                    seconds, body = ask(url, key, messages, 1)
                    cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
                    times[label].append((seconds, cached))
                    print(scope, label, round(seconds, 3), cached, file=sys.stderr, flush=True)
            results[scope] = {
                label: {
                    "median_seconds": round(statistics.median(s for s, _ in runs), 3),
                    "median_cached_tokens": statistics.median(c for _, c in runs),
                }
                for label, runs in times.items()
            }
        finally:
            process.terminate()
            process.wait(30)
    return results


def cache_used_mib(url: str, key: str) -> float:
    """The MiB the server's prefix cache holds, all tenants together (its ``/metrics``)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    held = sum(
        sample.value
        for family in text_string_to_metric_families(text.text)
        if family.name == "promptlookup:prefix_cache_bytes"
        for sample in family.samples
    )
    return round(held / 2**20, 3)


def soak(args, keys: Path) -> dict:
    process, url = start(keys, args.threads, "--prefix-cache-mib", str(args.prefix_cache_mib))
    server = psutil.Process(process.pid)
    stop_at = time.monotonic() + 60 * args.minutes
    samples, counts, errors = [], {"requests": 0, "cached_tokens": 0}, []
    texts = sources(64, chars=2000)

    def client(number: int) -> None:
        rng = random.Random(number)
        while time.monotonic() < stop_at:
            key = f"key-{rng.randrange(args.tenants)}"  # each conversation a tenant's
            messages = [{"role": "user", "content": f"Explain this code.\n{rng.choice(texts)}"}]
            for _ in range(rng.randint(1, 4)):  # a conversation of 1-4 turns
                if time.monotonic() >= stop_at:
                    return
                try:
                    _, body = ask(url, key, messages, 48)
                except httpx.HTTPError as exc:
                    errors.append(str(exc))
                    return
                counts["requests"] += 1
                counts["cached_tokens"] += body["usage"]["prompt_tokens_details"]["cached_tokens"]
                answer = body["choices"][0]["message"]["content"]
                messages += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": "Now say it more briefly."},
                ]

    threads = [threading.Thread(target=client, args=(n,)) for n in range(args.clients)]
    for thread in threads:
        thread.start()
    try:
        while any(thread.is_alive() for thread in threads):
            samples.append(
                {
                    "seconds": round(time.monotonic() - stop_at + 60 * args.minutes, 1),
                    "rss_mib": round(server.memory_info().rss / 2**20, 1),
                    "cache_used_mib": cache_used_mib(url, "key-a"),
                }
            )
            print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
            time.sleep(5)
        for thread in threads:
            thread.join()
    finally:
        process.terminate()
        process.wait(30)
    return {
        "minutes": args.minutes,
        "clients": args.clients,
        "tenants": args.tenants,
        "prefix_cache_mib": args.prefix_cache_mib,
        **counts,
        "errors": errors,
        "max_cache_used_mib": max(s["cache_used_mib"] for s in samples),
        "max_rss_mib": max(s["rss_mib"] for s in samples),
        "rss_mib_first_sample": samples[0]["rss_mib"],
        "samples": samples,
    }


def restart(args, keys: Path) -> dict:
    import tempfile

    folder = Path(tempfile.mkdtemp()) / "prefix-cache"  # made 0700 by the server
    conversations = [
        [{"role": "user", "content": f"Summarize this file.\n{text}"}]
        for text in sources(args.prompts, chars=args.prefix_chars)
    ]
    turns = {}
    for label, flags in (
        ("turn 1", ("--prefix-cache-dir", str(folder))),
        ("turn 2 after a restart", ("--prefix-cache-dir", str(folder))),
        ("turn 2 without a cache", ("--prefix-cache-mib", "0")),
    ):
        process, url = start(keys, args.threads, *flags)
        try:
            turns[label] = [
                ask(url, "key-a", messages, args.max_tokens) for messages in conversations
            ]
        finally:
            process.terminate()  # SIGTERM, as a user stops the server
            process.wait(60)
        if label == "turn 1":  # each conversation goes on: its answer, then a new question
            for messages, (_, body) in zip(conversations, turns[label]):
                answer = body["choices"][0]["message"]["content"]
                messages += [{"role": "assistant", "content": answer},
                             {"role": "user", "content": "Which function is the longest?"}]  # fmt: skip
        print(
            label, [round(seconds, 2) for seconds, _ in turns[label]], file=sys.stderr, flush=True
        )
    rows = []
    for after, alone in zip(turns["turn 2 after a restart"], turns["turn 2 without a cache"]):
        usage = after[1]["usage"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        rows.append({
            "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": cached,
            "cached_fraction": round(cached / usage["prompt_tokens"], 4),
            "seconds_after_restart": round(after[0], 3),
            "seconds_without_cache": round(alone[0], 3),
            "same_text": after[1]["choices"][0]["message"]["content"]
            == alone[1]["choices"][0]["message"]["content"],
        })  # fmt: skip
    return {"conversations": rows}


def shared(args) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    head = f"Here is a file.\n{sources(1, chars=args.prefix_chars)[0]}\n"
    questions = [
        "List its functions.", "What does the first function return?",
        "Summarize it in one sentence.", "Which modules does it import?",
        "Name one possible bug.", "Suggest a better name for one function.",
        "Which function is the longest?", "Write a docstring for the first function.",
    ]  # fmt: skip
    requests = [[{"role": "user", "content": head + question}] for question in questions]
    results = {}
    for item in args.against:
        name, _, url = item.partition("=")
        one_by_one = [ask(url, "none", messages, args.max_tokens)[1] for messages in requests]
        rounds = []
        for _ in range(2):
            start = time.perf_counter()
            with ThreadPoolExecutor(len(requests)) as pool:
                answers = list(
                    pool.map(lambda m, u=url: ask(u, "none", m, args.max_tokens), requests)
                )
            wall = time.perf_counter() - start
            tokens = sum(body["usage"]["completion_tokens"] for _, body in answers)
            same = sum(
                a[1]["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
                for a, b in zip(answers, one_by_one)
            )
            rounds.append({"tokens": tokens, "seconds": round(wall, 3), "same_as_one_by_one": same})
            print(name, rounds[-1], file=sys.stderr, flush=True)
        best = max(rounds, key=lambda r: r["tokens"] / r["seconds"])
        results[name] = {
            "url": url,
            "prompt_tokens": one_by_one[0]["usage"]["prompt_tokens"],
            "tokens_per_second": round(best["tokens"] / best["seconds"], 2),
            "rounds": rounds,
        }
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["isolation", "soak", "shared", "restart"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=5, help="isolation: prompts [5]")
    parser.add_argument("--minutes", type=float, default=5.0, help="soak: duration [5]")
    parser.add_argument("--clients", type=int, default=4, help="soak: clients at once [4]")
    parser.add_argument("--tenants", type=int, default=16, help="soak: tenants [16]")
    parser.add_argument("--prefix-cache-mib", type=int, default=128, help="soak: budget [128]")
    parser.add_argument("--against", action="append", default=[], metavar="NAME=URL")
    parser.add_argument(
        "--max-tokens", type=int, default=128, help="shared, restart: per answer [128]"
    )
    parser.add_argument(
        "--prefix-chars", type=int, default=6000, help="shared, restart: prefix [6000]"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import tempfile

    keys = Path(tempfile.mkdtemp()) / "keys.txt"  # throwaway keys of this run's local servers
    keys.write_text(
        "\n".join(
            [f"tenant-{n} key-{n}" for n in range(args.tenants)] + ["alice key-a", "bob key-b"]
        )
    )
    if args.what == "shared":
        result = shared(args)
    elif args.what == "restart":
        result = restart(args, keys)
    else:
        result = isolation(args, keys) if args.what == "isolation" else soak(args, keys)
    result["command"] = "python benchmarks/prefix_cache.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.what}.json").write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
