"""Load test for ``promptlookup serve``: many concurrent clients against one local server.

Bounded in count and time, and loopback only. By default it starts the server itself
(``promptlookup serve`` on a free 127.0.0.1 port, default model, ``--max-queue 8``), so with 16
clients some requests meet a full queue: those 429 answers are deliberate, counted apart, and
retried after a short backoff (for at most ``--retry-window`` seconds). Every other failure is
an error.

    python benchmarks/load_test.py                       # 200 requests, 16 clients
    python benchmarks/load_test.py --url http://127.0.0.1:8000 --out load.json

Requests mix chat and text completions, streaming and not, greedy and seeded sampling, some
with a ``prediction``, each with 16-32 new tokens. Reported: requests/s, latency p50/p95
(successful attempt; streaming also time to first token), tokens/s, 429s, errors, and the
server's memory (RSS) when ready, after one warm-up request, right after the load and after
``--settle`` seconds idle (the server returns freed memory when idle). Prints a
markdown table; ``--out`` writes JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import httpx
import psutil

LOOPBACK = {"127.0.0.1", "localhost", "::1"}

# Short prompts that invite copying (where prompt lookup drafts well) and some that do not.
PROMPTS = [
    "Rewrite this sentence in the past tense: The cat sits on the mat and watches the birds.",
    "Fix the typo and repeat the line: def add(a, b): retrun a + b",
    "Translate to French: Good morning, how are you today?",
    "Repeat exactly: alpha beta gamma delta epsilon zeta eta theta",
    "List three colors.",
    "Correct the grammar: She don't like apples and he don't like pears.",
    "Write one sentence about the sea.",
    "Convert to uppercase: the quick brown fox jumps over the lazy dog",
]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))], 3)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_process(port: int) -> psutil.Process | None:
    """The process listening on ``port`` (None if it cannot be seen)."""
    try:
        for conn in psutil.net_connections(kind="tcp"):
            listening = conn.status == psutil.CONN_LISTEN
            if conn.laddr and conn.laddr.port == port and listening and conn.pid:
                return psutil.Process(conn.pid)
    except (psutil.AccessDenied, PermissionError):
        pass
    return None


def rss_mib(process: psutil.Process | None) -> float | None:
    try:
        return round(process.memory_info().rss / 2**20, 1) if process else None
    except psutil.Error:
        return None


def wait_healthy(url: str, deadline: float, process: subprocess.Popen | None) -> None:
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            sys.exit(f"the server exited with status {process.returncode} before it was ready")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    sys.exit("the server did not become healthy in time")


def make_request(i: int, model: str, rng: random.Random) -> tuple[str, dict]:
    """The i-th request: (path, JSON body)."""
    prompt = PROMPTS[i % len(PROMPTS)]
    body = {"model": model, "max_tokens": rng.randint(16, 32), "stream": i % 2 == 0}
    if i % 3 == 0:
        body.update(temperature=0.7, seed=i)
    else:
        body["temperature"] = 0
    if body["stream"]:
        body["stream_options"] = {"include_usage": True}
    if i % 4 == 1:  # the answer will mostly repeat the text after the colon
        body["prediction"] = {"type": "content", "content": prompt.split(":", 1)[-1].strip()}
    if i % 5 == 4:
        return "/v1/completions", {**body, "prompt": prompt + "\n"}
    return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}


def one_attempt(client: httpx.Client, path: str, body: dict) -> dict:
    """Send once; returns status, seconds, first-token seconds, tokens, and an error text."""
    start = time.perf_counter()
    out = {"status": None, "seconds": None, "ttft": None, "tokens": 0, "error": None}
    if not body["stream"]:
        response = client.post(path, json=body)
        out["status"] = response.status_code
        if response.status_code == 200:
            data = response.json()
            out["tokens"] = data["usage"]["completion_tokens"]
            if not data.get("choices"):
                out["error"] = "no choices"
        elif response.status_code != 429:
            out["error"] = f"HTTP {response.status_code}: {response.text[:200]}"
        out["seconds"] = time.perf_counter() - start
        return out
    with client.stream("POST", path, json=body) as response:
        out["status"] = response.status_code
        if response.status_code != 200:
            response.read()
            if response.status_code != 429:
                out["error"] = f"HTTP {response.status_code}: {response.text[:200]}"
            out["seconds"] = time.perf_counter() - start
            return out
        done = False
        for line in response.iter_lines():
            if line.startswith("event: error"):
                out["error"] = "error event in stream"
            elif line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    out["tokens"] = chunk["usage"]["completion_tokens"]
                elif out["ttft"] is None and any(
                    c.get("text") or c.get("delta", {}).get("content") for c in chunk["choices"]
                ):
                    out["ttft"] = time.perf_counter() - start
        if not done and out["error"] is None:
            out["error"] = "stream ended without [DONE]"
    out["seconds"] = time.perf_counter() - start
    return out


def run_load(url: str, model: str, args) -> dict:
    counter = itertools.count()
    lock = threading.Lock()
    results: list[dict] = []
    rejected = [0]  # 429 answers
    stop_at = time.monotonic() + args.time_limit

    def client_loop(client_id: int) -> None:
        rng = random.Random(client_id)
        with httpx.Client(
            base_url=url, timeout=args.request_timeout, headers=auth_headers(args.api_key)
        ) as client:
            while time.monotonic() < stop_at:
                with lock:
                    i = next(counter)
                if i >= args.requests:
                    return
                path, body = make_request(i, model, random.Random(i))  # the same mix every run
                first_start = time.perf_counter()
                give_up = first_start + args.retry_window
                for attempt in itertools.count():
                    try:
                        out = one_attempt(client, path, body)
                    except httpx.HTTPError as exc:
                        out = {
                            "status": None,
                            "seconds": None,
                            "ttft": None,
                            "tokens": 0,
                            "error": f"{type(exc).__name__}: {exc}",
                        }
                    if out["status"] == 429:
                        with lock:
                            rejected[0] += 1
                    if out["status"] != 429 or time.perf_counter() > give_up:
                        break
                    time.sleep(min(2.0, 0.1 * 2**attempt) * (0.5 + rng.random()))
                out.update(
                    index=i,
                    stream=body["stream"],
                    path=path,
                    retries=attempt,
                    end_to_end=time.perf_counter() - first_start,
                )
                if out["status"] == 429:
                    out["error"] = f"still 429 after {args.retry_window:g} s of retries"
                with lock:
                    results.append(out)

    start = time.perf_counter()
    with ThreadPoolExecutor(args.clients) as pool:
        list(pool.map(client_loop, range(args.clients)))
    wall = time.perf_counter() - start
    ok = [r for r in results if r["error"] is None]
    latencies = [r["seconds"] for r in ok]
    ttfts = [r["ttft"] for r in ok if r["stream"] and r["ttft"] is not None]
    return {
        "requests_planned": args.requests,
        "requests_done": len(results),
        "succeeded": len(ok),
        "errors": len(results) - len(ok),
        "rejected_429": rejected[0],
        "wall_seconds": round(wall, 2),
        "requests_per_second": round(len(ok) / wall, 3),
        "completion_tokens_per_second": round(sum(r["tokens"] for r in ok) / wall, 2),
        "latency_p50": percentile(latencies, 50),
        "latency_p95": percentile(latencies, 95),
        "end_to_end_p50": percentile([r["end_to_end"] for r in ok], 50),
        "end_to_end_p95": percentile([r["end_to_end"] for r in ok], 95),
        "ttft_p50": percentile(ttfts, 50),
        "ttft_p95": percentile(ttfts, 95),
        "mean_completion_tokens": (
            round(statistics.mean(r["tokens"] for r in ok), 2) if ok else None
        ),
        "error_samples": [r["error"] for r in results if r["error"]][:20],
    }


def markdown(summary: dict) -> str:
    def s(value):
        return "n/a" if value is None else f"{value:.2f}"

    m = summary["metrics"]
    rows = [
        ("requests (succeeded / planned)", f"{m['succeeded']} / {m['requests_planned']}"),
        ("concurrent clients", summary["clients"]),
        ("server queue capacity", summary["max_queue"] if summary["max_queue"] else "n/a"),
        ("server torch threads", summary["server_threads"] or "default"),
        ("wall time (s)", s(m["wall_seconds"])),
        ("requests/s", s(m["requests_per_second"])),
        ("completion tokens/s", s(m["completion_tokens_per_second"])),
        ("latency p50 / p95 (s)", f"{s(m['latency_p50'])} / {s(m['latency_p95'])}"),
        ("incl. 429 retries p50 / p95 (s)", f"{s(m['end_to_end_p50'])} / {s(m['end_to_end_p95'])}"),
        ("streaming first token p50 / p95 (s)", f"{s(m['ttft_p50'])} / {s(m['ttft_p95'])}"),
        ("429 answers (deliberate, retried)", m["rejected_429"]),
        ("errors", m["errors"]),
        (
            "server RSS ready / after warm-up / after load / idle after it (MiB)",
            f"{s(summary['rss_ready_mib'])} / {s(summary['rss_before_mib'])} / "
            f"{s(summary['rss_after_mib'])} / {s(summary.get('rss_idle_mib'))}",
        ),
    ]
    lines = ["| metric | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


def auth_headers(api_key: str | None) -> dict:
    """The Authorization header for a server started with ``--api-key`` (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server on 127.0.0.1 (default: start one)")
    parser.add_argument("--api-key", help="the server's --api-key (sent as a bearer token)")
    parser.add_argument("--model", help="--model for the server this script starts")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-queue", type=int, default=8, help="for the server it starts")
    parser.add_argument("--threads", type=int, help="serve --threads, for the server it starts")
    parser.add_argument(
        "--retry-window",
        type=float,
        default=600,
        help="seconds a request keeps retrying 429 answers (0.1-2 s apart)",
    )
    parser.add_argument(
        "--time-limit", type=float, default=900, help="seconds after which no new request starts"
    )
    parser.add_argument("--request-timeout", type=float, default=300)
    parser.add_argument("--startup-timeout", type=float, default=600)
    parser.add_argument(
        "--settle", type=float, default=5, help="seconds idle before the last RSS reading"
    )
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not (1 <= args.requests <= 10_000 and 1 <= args.clients <= 64):
        parser.error("--requests must be in 1..10000 and --clients in 1..64")

    process = None
    if args.url:
        parsed = urlparse(args.url)
        if parsed.hostname not in LOOPBACK:
            parser.error(f"refusing non-loopback host {parsed.hostname!r}; this is a local test")
        url, port = args.url.rstrip("/"), parsed.port or 80
        max_queue = None
    else:
        port, max_queue = free_port(), args.max_queue
        command = [
            sys.executable,
            "-m",
            "promptlookup",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-queue",
            str(max_queue),
            "--log-level",
            "warning",
        ]
        if args.model:
            command += ["--model", args.model]
        if args.threads:
            command += ["--threads", str(args.threads)]
        process = subprocess.Popen(command, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, time.monotonic() + args.startup_timeout, process)
        model = httpx.get(
            url + "/v1/models", timeout=10, headers=auth_headers(args.api_key)
        ).json()["data"][0]["id"]
        server = psutil.Process(process.pid) if process else server_process(port)
        rss_ready = rss_mib(server)
        # One warm-up request pages in the weights, so "before" vs "after" shows what load adds.
        warm = httpx.post(
            url + "/v1/completions",
            timeout=args.request_timeout,
            headers=auth_headers(args.api_key),
            json={"model": model, "prompt": "Hello", "max_tokens": 4},
        )
        warm.raise_for_status()
        rss_before = rss_mib(server)
        metrics = run_load(url, model, args)
        rss_after = rss_mib(server)
        time.sleep(args.settle)  # the server returns what the load held once it is idle
        rss_idle = rss_mib(server)
    finally:
        if process is not None:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
    summary = {
        "url": url,
        "model": model,
        "clients": args.clients,
        "max_queue": max_queue,
        "server_threads": args.threads if process else None,
        "cpu_count": os.cpu_count(),
        "rss_ready_mib": rss_ready,
        "rss_before_mib": rss_before,
        "rss_after_mib": rss_after,
        "rss_idle_mib": rss_idle,
        "metrics": metrics,
    }
    print(markdown(summary))
    if metrics["error_samples"]:
        print("\nerrors:", *metrics["error_samples"], sep="\n  ")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
    return 1 if metrics["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
