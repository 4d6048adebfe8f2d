"""Assemble benchmarks/RESULTS.md from the output folders of `promptlookup bench` runs.

Every number in RESULTS.md comes from a run's summary.json / report.md; this script only copies
them and computes ratios between methods of the same run (never across runs).

    python benchmarks/make_results.py benchmarks/runs/float32 benchmarks/runs/bfloat16 ... \
        --extra benchmarks/runs/extra.md > benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def ratio_rows(summary: list[dict], method: str, against: str) -> list[tuple[str, float, int]]:
    """(task, tokens/s of ``method`` / tokens/s of ``against``, prompts) per task."""
    by_key = {(row["task"], row["method"]): row for row in summary}
    rows = []
    for (task, name), row in by_key.items():
        other = by_key.get((task, against))
        if name == method and other and other["tokens_per_second"]:
            rows.append((task, row["tokens_per_second"] / other["tokens_per_second"], row["prompts"]))
    return rows


def losses(run: Path, method: str = "promptlookup") -> list[str]:
    """Per task: on how many prompts ``method`` was slower than each other method."""
    rates: dict[tuple[str, str], dict[str, float]] = {}
    for line in (run / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["seconds"] > 0:
            rates.setdefault((row["task"], row["id"]), {})[row["method"]] = row["new_tokens"] / row["seconds"]
    counts: dict[tuple[str, str], list[int]] = {}
    for (task, _), by_method in rates.items():
        mine = by_method.get(method)
        for other, rate in by_method.items():
            if other != method and mine is not None:
                slower, total = counts.setdefault((task, other), [0, 0])
                counts[(task, other)] = [slower + (mine < rate), total + 1]
    if not counts:
        return []
    lines = [f"#### Where `{method}` loses: prompts on which it was slower (tokens/s)", "",
             "| task | slower than | prompts |", "|---|---|---:|"]
    lines += [f"| {task} | `{other}` | {slower} of {total} |"
              for (task, other), (slower, total) in sorted(counts.items())]
    return lines + [""]


def _versus_anchor(by_key: dict, task: str, key: str = "tokens_per_second") -> str:
    """promptlookup's tokens/s (or ``key``) over the anchor's, formatted ("–" when either is
    missing)."""
    mine = by_key.get((task, "promptlookup"))
    anchor = by_key.get((task, "hf-pld")) or by_key.get((task, "llamacpp-pld"))
    if not mine or not anchor or not anchor.get(key) or mine.get(key) is None:
        return "–"
    return f"{mine[key] / anchor[key]:.2f}"


def headline(runs: list[Path]) -> str:
    """One table over all runs: promptlookup's tokens/s against plain and against the
    backend's own prompt lookup, per task (ratios within each run)."""
    lines = ["## At a glance", "",
             "promptlookup's tokens/s divided by plain decoding's and by the anchor's (transformers' "
             "`hf-pld` or llama.cpp's `llamacpp-pld`), each within its own run; `identical`: share "
             "of promptlookup's outputs token-identical to plain's (– when sampling); *agreed*: "
             "the same two ratios on the tokens every method wrote first (runs from 0.6.3 on whose "
             "outputs part, see each run's \"Speed on agreed prefixes\"); *decode*: against the "
             "anchor after each request's first forward pass (prefill left out; runs whose "
             "summaries have it, from 0.7.0 on).", "",
             "| run | backend, dtype, decoding | task | prompts | vs plain | vs anchor | identical "
             "| agreed share | vs plain, agreed | vs anchor, agreed | vs anchor, decode |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        meta = json.loads((run / "meta.json").read_text())
        temperature = meta["settings"]["temperature"]
        backend = meta["backend"]
        kind = (f"{backend}, {'Q4_1' if backend == 'llama.cpp' else meta['dtype']}, "
                + (f"sampling T={temperature}" if temperature else "greedy"))
        agreed_path = run / "agreed_summary.json"
        agreed = json.loads(agreed_path.read_text()) if agreed_path.is_file() else []
        agreed_by_key = {(row["task"], row["method"]): row for row in agreed}
        by_key = {(row["task"], row["method"]): row for row in summary}
        for (task, method), row in by_key.items():
            if method != "promptlookup":
                continue
            identical = row["identical_fraction"]
            mine = agreed_by_key.get((task, method))
            share, speedup = ((f"{mine['agreed_share']:.2f}", f"{mine['speedup']:.2f}")
                              if mine else ("–", "–"))
            lines.append(f"| `{run.name}` | {kind} | {task} | {row['prompts']} | "
                         f"{row['speedup']:.2f} | {_versus_anchor(by_key, task)} | "
                         f"{'–' if identical is None else f'{identical:.2f}'} | {share} | "
                         f"{speedup} | "
                         f"{_versus_anchor(agreed_by_key, task)} | "
                         f"{_versus_anchor(by_key, task, 'decode_speedup')} |")
    return "\n".join(lines)


def section(run: Path, root: Path) -> str:
    report = (run / "report.md").read_text()
    relative = run.relative_to(root)
    # Figures live beside the run's report: point at them from RESULTS.md's folder.
    report = re.sub(r"!\[([^\]]*)\]\(([^)/]+\.png)\)", rf"![\1]({relative}/\2)", report)
    report = report.replace("# promptlookup benchmark", f"## Run `{relative}`", 1)
    report = re.sub(r"^## (Summary|Figures|Best|Speed)", r"### \1", report, flags=re.M)
    summary = json.loads((run / "summary.json").read_text())
    methods = {row["method"] for row in summary}
    lines = [report.rstrip(), ""]
    for method, against in (("promptlookup", "hf-pld"), ("promptlookup", "plain"),
                            ("promptlookup", "llamacpp-pld")):
        if {method, against} <= methods:
            lines += [f"#### `{method}` tokens/s divided by `{against}` tokens/s (same run)", "",
                      "| task | ratio | prompts |", "|---|---:|---:|"]
            lines += [f"| {task} | {value:.2f} | {n} |" for task, value, n in ratio_rows(summary, method, against)]
            lines.append("")
    return "\n".join(lines + losses(run))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="bench --out folders, in order")
    parser.add_argument("--root", type=Path, default=Path("benchmarks"),
                        help="folder RESULTS.md is written to (figure paths are relative to it)")
    parser.add_argument("--intro", type=Path, help="markdown put before the runs")
    parser.add_argument("--extra", type=Path, nargs="*", default=[],
                        help="markdown files appended after the runs (other measurements)")
    args = parser.parse_args()
    parts = [args.intro.read_text().rstrip() if args.intro else "# Measured results"]
    runs = [run for run in (r.resolve() for r in args.runs) if (run / "summary.json").is_file()]
    parts.append(headline(runs))
    parts += [section(run, args.root.resolve()) for run in runs]
    parts += [extra.read_text().rstrip() for extra in args.extra]
    print("\n\n".join(parts))


if __name__ == "__main__":
    main()
