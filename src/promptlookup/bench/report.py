"""The report of a bench run: tables (console and markdown), ``report.md``, ``summary.json``
and the figures, all from the summaries of :mod:`promptlookup.bench.summary` (the summary
columns are defined there)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from .figures import bar_figure, headline_methods, sweep_figure
from .summary import (
    SUMMARY_COLUMNS,
    agreed_summary,
    best_promptlookup,
    held_out_ratio,
    read_results,
    repeat_spread,
    speedup_parts,
    summarize,
)


def _cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


#: Columns of the agreed-prefix table (rows of :func:`agreed_summary`): key, header.
AGREED_COLUMNS = (
    ("task", "task"),
    ("method", "method"),
    ("prompts", "prompts"),
    ("agreed_share", "share"),
    ("tokens_per_second", "tokens/s"),
    ("speedup", "speed-up"),
    ("median_speedup", "median speed-up"),
    ("decode_speedup", "decode speed-up"),
)
#: Columns of the speed-up's parts (rows of :func:`speedup_parts`): key, header.
PARTS_COLUMNS = (
    ("task", "task"),
    ("method", "method"),
    ("speedup", "speed-up vs plain"),
    ("engine", "engine's part (promptlookup-none vs plain)"),
    ("drafting", "drafting's part (method vs promptlookup-none)"),
)
#: The bars of the parts figure: each row's value and its label.
PART_LABELS = (
    ("speedup", "total vs plain"),
    ("engine", "engine's part (promptlookup-none vs plain)"),
    ("drafting", "drafting's part (vs promptlookup-none)"),
)
Columns = Sequence[tuple[str, str]]


def _known_columns(rows: Sequence[dict], columns: Columns):
    """The columns to show (keys, headers): all but a peak-RSS column that no row measured
    (older runs)."""
    shown = [
        (k, h)
        for k, h in columns
        if k != "peak_rss_mib" or any(row.get(k) is not None for row in rows)
    ]
    return [k for k, _ in shown], [h for _, h in shown]


def markdown_table(rows: Sequence[dict], columns: Columns = SUMMARY_COLUMNS) -> str:
    keys, headers = _known_columns(rows, columns)
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join(["---"] * 2 + ["---:"] * (len(headers) - 2)) + "|",
    ]
    lines += ["| " + " | ".join(_cell(row[k]) for k in keys) + " |" for row in rows]
    return "\n".join(lines)


def text_table(rows: Sequence[dict], columns: Columns = SUMMARY_COLUMNS) -> str:
    """Summary rows as aligned plain text (printed at the end of a run)."""
    keys, headers = _known_columns(rows, columns)
    cells = [list(headers)] + [[_cell(row[k]) for k in keys] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        for row in cells
    )


def console_tables(records: Sequence[dict], summary: Sequence[dict]) -> str:
    """What a finished run prints: the summary, and speeds on agreed prefixes where greedy
    outputs parted from plain's (a sweep's grid left to the report)."""
    text = text_table(summary)
    parts = speedup_parts(summary)
    if parts:
        text += "\n\nWhat the speed-up is made of (engine x drafting):\n"
        text += text_table(parts, PARTS_COLUMNS)
    agreed, _ = agreed_summary(records)
    if agreed:
        shown = set(headline_methods(agreed))
        text += (
            "\n\nOn agreed prefixes (the tokens every method wrote first; share: of "
            "plain's tokens):\n"
            + text_table([r for r in agreed if r["method"] in shown], AGREED_COLUMNS)
        )
    return text


def _meta_lines(meta: dict, records: Sequence[dict] = ()) -> list[str]:
    machine = meta.get("machine") or {}
    settings = meta.get("settings") or {}
    mode = (
        f"sampling (temperature {settings.get('temperature')}, top-k {settings.get('top_k')}, "
        f"top-p {settings.get('top_p')}, seed {settings.get('seed')} + prompt index)"
        if settings.get("temperature")
        else "greedy"
    )
    version = f"promptlookup {machine['promptlookup']}, " if machine.get("promptlookup") else ""
    return (
        [
            f"- Command: `{meta.get('command', '?')}`",
            f"- Date: {meta.get('date', '?')}",
            f"- Machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, torch threads "
            f"{machine.get('torch_threads', '?')}, load average {machine.get('load_average_1m', '?')} "
            f"at start ({version}torch {machine.get('torch', '?')}, transformers "
            f"{machine.get('transformers', '?')}, Python {machine.get('python', '?')})",
            f"- Backend: {meta.get('backend', '?')}; model: {meta.get('model', '?')}; dtype: "
            f"{meta.get('dtype', '?')}; device: {meta.get('device', '?')}"
            + (f"; weights: {meta['weights']}" if meta.get("weights") else ""),
        ]
        + [
            f"- Server `{name}`: {server.get('url')}, model `{server.get('model')}`"
            + (f", process {server['pid']}" if server.get("pid") else ", process not found")
            for name, server in (meta.get("against") or {}).items()
        ]
        + [
            *([f"- Prompts: {meta['data']}"] if meta.get("data") else []),
            f"- Decoding: {mode}; max new tokens: {settings.get('max_new_tokens', '?')}"
            + (
                f"; each method's fastest of {meta['repeat']} runs per prompt"
                if meta.get("repeat", 1) > 1
                else ""
            ),
        ]
        + (
            [
                f"- Noise: the slowest run of one method on one prompt took {spread[0]:.2f}x as long "
                f"as its fastest (median over rows; {spread[1]:.2f}x at the 90th percentile), for "
                "the same work; differences between methods within that are not resolved by one run"
            ]
            if (spread := repeat_spread(records))
            else []
        )
    )


def best_lines(summary: Sequence[dict], records: Sequence[dict], where: str = "") -> list[str]:
    """The report's table of the best fixed setting per task against the default (a sweep)."""
    best = best_promptlookup(summary)
    if not best:
        return []
    lines = [
        "",
        f"## Best promptlookup setting per task{where}",
        "",
        "The fastest fixed setting measured, and the default (adaptive) against it. "
        "*Held out*: the default against the best fixed setting chosen on the other "
        "half of the task's prompts (odd vs even), which removes the luck of taking a "
        "maximum on the very prompts it is reported on. *Decode*: the default's decode "
        "speed-up over the best fixed setting's by that measure (time after the first "
        "forward pass, so without the prefill's share and noise).",
        "",
        "| task | best fixed setting | its speed-up | tokens/forward | default speed-up "
        "| default / best | default / best, held out | default / best, decode |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    return lines + [
        f"| {r['task']} | {r['method']} | {_cell(r['speedup'])} | "
        f"{_cell(r['tokens_per_forward'])} | {_cell(r['default_speedup'])} | "
        f"{_cell(r['default_speedup'] / r['speedup'] if r['default_speedup'] else None)}"
        f" | {_cell(held_out_ratio(records, r['task']))} | {_cell(r['decode_ratio'])} |"
        for r in best
    ]


def parts_lines(summary: Sequence[dict]) -> list[str]:
    """The section saying what each promptlookup speed-up is made of (when
    ``promptlookup-none`` ran)."""
    parts = speedup_parts(summary)
    if not parts:
        return []
    return [
        "",
        "## What the speed-up is made of",
        "",
        "`plain` is `transformers`' `generate` over the same model; `promptlookup-none` is "
        "promptlookup's loop and forward passes without a drafter. So a speed-up over `plain` "
        "is the product of two parts: the *engine's* (`promptlookup-none` against `plain`: "
        "our forward passes and loop, one token per pass) and *drafting's* (the method "
        "against `promptlookup-none`: more tokens per pass on the same engine).",
        "",
        markdown_table(parts, PARTS_COLUMNS),
    ]


def agreed_lines(records: Sequence[dict]) -> list[str]:
    rows, agreed = agreed_summary(records)
    if not rows:
        return []
    shown = set(headline_methods(rows))  # a sweep's grid only in the best-setting table below
    lines = [
        "",
        "## Speed on agreed prefixes",
        "",
        "Greedy outputs that differ from plain's (bfloat16 rounding) make tokens/s compare "
        "different texts. Here every method is timed until it had produced the tokens that "
        "*all* methods produced first on that prompt (`promptlookup.bench.agreed`); share: "
        "agreed tokens / plain's new tokens.",
        "",
        markdown_table([r for r in rows if r["method"] in shown], AGREED_COLUMNS),
    ]
    return lines + best_lines(rows, agreed, ", on agreed prefixes")


def render_markdown(
    summary: Sequence[dict], meta: dict, figures: Sequence[str], records: Sequence[dict] = ()
) -> str:
    parts = [
        "# promptlookup benchmark",
        "",
        *_meta_lines(meta, records),
        "",
        "## Summary",
        "",
        markdown_table(summary),
        "",
        "Speed-up: tokens per second against `plain` over the same prompts (ratio of "
        "totals); median speed-up: median of per-prompt ratios; tokens/forward: new tokens "
        "per target forward pass; acceptance: accepted / drafted tokens; identical: share "
        "of outputs token-identical to `plain` (– when sampling); identical to -none: "
        "share identical to `promptlookup-none`'s; first token s: median "
        "seconds to the first new token (mostly the prompt's prefill); decode speed-up: "
        "speed-up after each request's first forward pass that produced tokens (prefill "
        "left out)."
        + (
            " Peak RSS MiB: the process's highest resident memory during the method's "
            "generations (local methods share one process and its model; a server, its own)."
            if any(row.get("peak_rss_mib") is not None for row in summary)
            else ""
        ),
    ]
    parts += parts_lines(summary)
    parts += best_lines(summary, records)
    parts += agreed_lines(records)
    if figures:
        parts += ["", "## Figures", ""] + [f"![{name}]({name})" for name in figures]
    return "\n".join(parts) + "\n"


def write_outputs(out_dir: str | Path, records: Sequence[dict], meta: dict) -> list[dict]:
    """(Re)write summary.json, report.md and the PNG figures from ``records``."""
    out = Path(out_dir)
    summary = summarize(records)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    agreed, _ = agreed_summary(records)
    if agreed:
        (out / "agreed_summary.json").write_text(
            json.dumps(agreed, indent=2) + "\n", encoding="utf-8"
        )
    else:
        (out / "agreed_summary.json").unlink(missing_ok=True)  # from an earlier run here
    figures = []
    if summary:
        bar_figure(
            summary,
            "speedup",
            "speed-up vs plain (tokens/s ratio)",
            "Speed-up per task and method",
            out / "speedup.png",
        )
        bar_figure(
            summary,
            "tokens_per_forward",
            "new tokens per forward pass",
            "Tokens per target forward pass",
            out / "tokens_per_forward.png",
        )
        figures = ["speedup.png", "tokens_per_forward.png"]
        parts = speedup_parts(summary)
        if parts:  # each promptlookup method's speed-up, its engine's part and drafting's
            bar_figure(
                [
                    {**row, "method": f"{row['method']}: {label}", "part": row[key]}
                    for row in parts
                    for key, label in PART_LABELS
                ],
                "part",
                "speed-up (tokens/s ratio)",
                "The speed-up and its parts: engine x drafting",
                out / "speedup_parts.png",
            )
            figures.append("speedup_parts.png")
        else:
            (out / "speedup_parts.png").unlink(missing_ok=True)  # from an earlier run here
        if sweep_figure(summary, out / "sweep.png"):
            figures.append("sweep.png")
        else:
            (out / "sweep.png").unlink(missing_ok=True)  # from an earlier run in this folder
    (out / "report.md").write_text(
        render_markdown(summary, meta, figures, records), encoding="utf-8"
    )
    return summary


def report_from_dir(out_dir: str | Path) -> list[dict]:
    """Regenerate summary.json, report.md and figures from ``out_dir/results.jsonl``."""
    out = Path(out_dir)
    records = read_results(out / "results.jsonl", tolerate_partial_last_line=True)
    meta_path = out / "meta.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
    return write_outputs(out, records, meta)
