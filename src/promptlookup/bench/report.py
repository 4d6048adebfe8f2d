"""Summaries, tables and figures computed from ``results.jsonl`` (nothing else is trusted).

Summary columns, per task (and ``all`` tasks together) and method:

- ``tokens_per_second``: sum of new tokens / sum of seconds.
- ``speedup``: that rate divided by ``plain``'s over the same prompts (a ratio of totals).
- ``median_speedup``: median over prompts of the per-prompt ratio of tokens per second.
- ``tokens_per_forward``: sum of new tokens / sum of forward passes (null if any is unknown).
- ``acceptance_rate``: sum of accepted / sum of drafted tokens (null if none drafted or unknown).
- ``identical_fraction``: share of prompts whose output equals ``plain``'s (null when sampling).
- ``identical_to_none_fraction``: share equal to ``promptlookup-none``'s, promptlookup's own
  plain decoding (null unless it ran): 1.0 wherever passes are row-invariant, in any dtype.
- ``first_token_seconds``: median over prompts of the time to the first new token (the prompt's
  prefill, mostly: the same work for every method, and with short answers most of the time).
- ``decode_speedup``: the speed-up after the first forward pass that produced tokens (tokens
  after it / time after it, ratio of totals against ``plain``'s; see :func:`after_first_pass`):
  how much faster the decoding itself is, without the prefill's share and its noise.

When greedy outputs differ from ``plain``'s (bfloat16), ``agreed_summary.json`` and the report
also give the speeds on *agreed prefixes*, the tokens every method produced (see
:mod:`promptlookup.bench.agreed`), with ``agreed_share`` = agreed / plain's new tokens.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Sequence

from .agreed import agreed_records, agreed_share
from .data import BenchDataError
from .figures import bar_figure, headline_methods, sweep_figure
from .methods import ALL_TASKS, BASELINE

SUMMARY_KEYS = ("task", "method", "prompts", "tokens_per_second", "speedup", "median_speedup",
                "tokens_per_forward", "acceptance_rate", "identical_fraction",
                "identical_to_none_fraction", "first_token_seconds", "decode_speedup")


def read_results(path: str | Path, tolerate_partial_last_line: bool = False) -> list[dict]:
    """Rows of a results.jsonl; a malformed line raises naming file and line, except a cut-off
    last line of an interrupted run when ``tolerate_partial_last_line``."""
    path = Path(path)
    if not path.is_file():
        raise BenchDataError(f"{path}: no such results file")
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if tolerate_partial_last_line and number == len(lines):
                break
            raise BenchDataError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
    return records


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


#: Tokens that arrive within this many seconds of the one before came from the same forward
#: pass (a pass takes milliseconds; the loop yields its tokens within microseconds: in this
#: project's runs every gap between tokens was under 0.4 ms or over 4 ms).
SAME_PASS_GAP = 0.001


def after_first_pass(record: dict) -> tuple[int, float] | None:
    """``(tokens, seconds)`` of a row's decoding after the first forward pass that produced
    tokens (the prefill's, with the first step's draft where a method drafts there); None
    without token times. The first pass's tokens are the leading ones that each came within
    :data:`SAME_PASS_GAP` of the one before.

    >>> after_first_pass({"token_seconds": [0.9, 0.9001, 0.9002, 1.0, 1.2, 1.2001]})
    (3, 0.2999)
    """
    times = record.get("token_seconds")
    if not times:
        return None
    first = 1
    while first < len(times) and times[first] - times[first - 1] < SAME_PASS_GAP:
        first += 1
    return len(times) - first, round(times[-1] - times[first - 1], 9)


def _decode_rate(records: Sequence[dict]) -> float | None:
    parts = [after_first_pass(r) for r in records]
    if not parts or any(part is None for part in parts):
        return None
    return _ratio(sum(tokens for tokens, _ in parts), sum(seconds for _, seconds in parts))


def _summary_row(task: str, method: str, mine: list[dict], plain: dict[tuple, dict]) -> dict:
    def total(key: str, records: Sequence[dict]) -> float | None:
        values = [r[key] for r in records]
        return None if any(v is None for v in values) else sum(values)

    rate = _ratio(total("new_tokens", mine), total("seconds", mine))
    paired = [(r, plain[(r["task"], r["id"])]) for r in mine if (r["task"], r["id"]) in plain]
    speedup = None
    if paired:
        plain_rate = _ratio(sum(p["new_tokens"] for _, p in paired),
                            sum(p["seconds"] for _, p in paired))
        mine_rate = _ratio(sum(r["new_tokens"] for r, _ in paired),
                           sum(r["seconds"] for r, _ in paired))
        speedup = _ratio(mine_rate, plain_rate) if mine_rate is not None and plain_rate else None
    per_prompt = [_ratio(_ratio(r["new_tokens"], r["seconds"]) or 0.0,
                         _ratio(p["new_tokens"], p["seconds"]) or 0.0) for r, p in paired]
    per_prompt = [x for x in per_prompt if x is not None]
    forwards = total("forward_passes", mine)
    drafted, accepted = total("drafted_tokens", mine), total("accepted_tokens", mine)
    identical = [r["identical_to_plain"] for r in mine if r["identical_to_plain"] is not None]
    same_as_none = [r["identical_to_none"] for r in mine if r.get("identical_to_none") is not None]
    firsts = [r["token_seconds"][0] for r in mine if r.get("token_seconds")]
    decode = _decode_rate([r for r, _ in paired])
    plain_decode = _decode_rate([p for _, p in paired])
    return dict(zip(SUMMARY_KEYS, (
        task, method, len(mine), _round(rate, 3), _round(speedup),
        _round(statistics.median(per_prompt)) if per_prompt else None,
        _round(_ratio(total("new_tokens", mine), forwards)) if forwards is not None else None,
        _round(_ratio(accepted, drafted)) if drafted is not None and accepted is not None else None,
        _round(sum(identical) / len(identical)) if identical else None,
        _round(sum(same_as_none) / len(same_as_none)) if same_as_none else None,
        _round(statistics.median(firsts)) if len(firsts) == len(mine) else None,
        _round(_ratio(decode, plain_decode)) if decode is not None and plain_decode else None)))


def summarize(records: Sequence[dict]) -> list[dict]:
    """summary.json rows: each task in order of appearance, then ``all`` when there are
    several; methods in order of appearance."""
    tasks = list(dict.fromkeys(r["task"] for r in records))
    methods = list(dict.fromkeys(r["method"] for r in records))
    plain = {(r["task"], r["id"]): r for r in records if r["method"] == BASELINE}
    groups = [(task, [r for r in records if r["task"] == task]) for task in tasks]
    if len(tasks) > 1:
        groups.append((ALL_TASKS, list(records)))
    summary = []
    for task, task_records in groups:
        for method in methods:
            mine = [r for r in task_records if r["method"] == method]
            if mine:
                summary.append(_summary_row(task, method, mine, plain))
    return summary


def best_promptlookup(summary: Sequence[dict]) -> list[dict]:
    """Per task, the fastest fixed ``promptlookup:...`` setting (when several promptlookup
    methods were measured), with the default ``promptlookup``'s speed-up beside it
    (``default_speedup``, None when not measured), and the default's decode speed-up over the
    best fixed setting's by that measure (``decode_ratio``: prefill left out)."""
    best = []
    for task in dict.fromkeys(row["task"] for row in summary):
        rows = [r for r in summary if r["task"] == task and r["speedup"] is not None
                and r["method"].split(":")[0] == "promptlookup"]
        fixed = [r for r in rows if r["method"] != "promptlookup"] or rows
        default = next((r for r in rows if r["method"] == "promptlookup"), {})
        decoded = [r["decode_speedup"] for r in fixed if r.get("decode_speedup")]
        decode_ratio = (_ratio(default["decode_speedup"], max(decoded))
                        if default.get("decode_speedup") and decoded else None)
        if len(rows) > 1:
            best.append({**max(fixed, key=lambda r: r["speedup"]),
                         "default_speedup": default.get("speedup"),
                         "decode_ratio": _round(decode_ratio)})
    return best


def held_out_ratio(records: Sequence[dict], task: str) -> float | None:
    """The default ``promptlookup``'s tokens/s over the best fixed setting's, where the fixed
    setting used on each prompt was chosen on the *other* prompts (two folds: the task's odd
    and even prompts). The plain maximum over settings measured on the very prompts it is
    reported on favours whichever setting was lucky there; this does not. ``task`` "all": one
    setting for every task. None when the task has fewer than two prompts or no default or no
    fixed setting. Example: two prompts, where each fixed setting is fast on one of them; the
    plain maximum says the default reaches 10 / 8 = 1.25x the best, held out it reaches 2x
    (20 tokens in 2 s against the held-out choices' 20 tokens in 4 s):

    >>> rows = [{"task": "t", "id": i, "method": m, "new_tokens": 10, "seconds": s}
    ...         for m, times in (("promptlookup", (1, 1)), ("promptlookup:k=4", (0.5, 2)),
    ...                          ("promptlookup:k=8", (2, 0.5))) for i, s in enumerate(times)]
    >>> held_out_ratio(rows, "t")
    2.0
    """
    mine = [r for r in records if task in (ALL_TASKS, r["task"]) and r.get("seconds")
            and r["method"].split(":")[0] == "promptlookup"]
    by = {(r["method"], (r["task"], r["id"])): r for r in mine}
    ids = list(dict.fromkeys((r["task"], r["id"]) for r in mine))
    fixed = sorted({r["method"] for r in mine} - {"promptlookup"})
    if len(ids) < 2 or not fixed or not any(r["method"] == "promptlookup" for r in mine):
        return None

    def totals(method: str, prompt_ids) -> tuple[float, float]:
        rows = [by[(method, i)] for i in prompt_ids if (method, i) in by]
        return sum(r["new_tokens"] for r in rows), sum(r["seconds"] for r in rows)

    def rate(method: str, prompt_ids) -> float:
        tokens, seconds = totals(method, prompt_ids)
        return tokens / seconds if seconds else 0.0

    folds = (ids[0::2], ids[1::2])
    tokens = seconds = 0.0
    for fold, other in zip(folds, reversed(folds)):
        chosen = max(fixed, key=lambda method: rate(method, other))
        fold_tokens, fold_seconds = totals(chosen, fold)
        tokens, seconds = tokens + fold_tokens, seconds + fold_seconds
    return _round(rate("promptlookup", ids) / (tokens / seconds)) if tokens and seconds else None


def _cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


TABLE_HEADERS = ("task", "method", "prompts", "tokens/s", "speed-up", "median speed-up",
                 "tokens/forward", "acceptance", "identical", "identical to -none",
                 "first token s", "decode speed-up")
#: Columns of the agreed-prefix table (rows of :func:`agreed_summary`).
AGREED_KEYS = ("task", "method", "prompts", "agreed_share", "tokens_per_second", "speedup",
               "median_speedup", "decode_speedup")
AGREED_HEADERS = ("task", "method", "prompts", "share", "tokens/s", "speed-up", "median speed-up",
                  "decode speed-up")


def markdown_table(rows: Sequence[dict], keys: Sequence[str] = SUMMARY_KEYS,
                   headers: Sequence[str] = TABLE_HEADERS) -> str:
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join(["---"] * 2 + ["---:"] * (len(headers) - 2)) + "|"]
    lines += ["| " + " | ".join(_cell(row[k]) for k in keys) + " |" for row in rows]
    return "\n".join(lines)


def text_table(rows: Sequence[dict], keys: Sequence[str] = SUMMARY_KEYS,
               headers: Sequence[str] = TABLE_HEADERS) -> str:
    """Summary rows as aligned plain text (printed at the end of a run)."""
    cells = [list(headers)] + [[_cell(row[k]) for k in keys] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths))) for row in cells)


def console_tables(records: Sequence[dict], summary: Sequence[dict]) -> str:
    """What a finished run prints: the summary, and speeds on agreed prefixes where greedy
    outputs parted from plain's (a sweep's grid left to the report)."""
    text = text_table(summary)
    agreed, _ = agreed_summary(records)
    if agreed:
        shown = set(headline_methods(agreed))
        text += ("\n\nOn agreed prefixes (the tokens every method wrote first; share: of "
                 "plain's tokens):\n" + text_table([r for r in agreed if r["method"] in shown],
                                                    AGREED_KEYS, AGREED_HEADERS))
    return text


def repeat_spread(records: Sequence[dict]) -> tuple[float, float] | None:
    """With ``--repeat``: how far apart the runs of one method on one prompt were, as the median
    and 90th percentile over rows of slowest / fastest run time (the host's own noise, which a
    comparison between methods cannot resolve below); None without repeated rows.

    >>> repeat_spread([{"repeat_seconds": [1.0, 1.5]}, {"repeat_seconds": [2.0, 2.2, 2.0]},
    ...                {"repeat_seconds": [3.0]}])
    (1.3, 1.46)
    """
    spreads = sorted(max(r["repeat_seconds"]) / min(r["repeat_seconds"]) for r in records
                     if len(r.get("repeat_seconds") or ()) > 1 and min(r["repeat_seconds"]) > 0)
    if not spreads:
        return None
    p90 = statistics.quantiles(spreads, n=10, method="inclusive")[-1] if len(spreads) > 1 \
        else spreads[0]
    return round(statistics.median(spreads), 2), round(p90, 2)


def _meta_lines(meta: dict, records: Sequence[dict] = ()) -> list[str]:
    machine = meta.get("machine") or {}
    settings = meta.get("settings") or {}
    mode = (f"sampling (temperature {settings.get('temperature')}, top-k {settings.get('top_k')}, "
            f"top-p {settings.get('top_p')}, seed {settings.get('seed')} + prompt index)"
            if settings.get("temperature") else "greedy")
    version = f"promptlookup {machine['promptlookup']}, " if machine.get("promptlookup") else ""
    return [
        f"- Command: `{meta.get('command', '?')}`",
        f"- Date: {meta.get('date', '?')}",
        f"- Machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, torch threads "
        f"{machine.get('torch_threads', '?')}, load average {machine.get('load_average_1m', '?')} "
        f"at start ({version}torch {machine.get('torch', '?')}, transformers "
        f"{machine.get('transformers', '?')}, Python {machine.get('python', '?')})",
        f"- Backend: {meta.get('backend', '?')}; model: {meta.get('model', '?')}; dtype: "
        f"{meta.get('dtype', '?')}; device: {meta.get('device', '?')}",
        f"- Decoding: {mode}; max new tokens: {settings.get('max_new_tokens', '?')}"
        + (f"; each method's fastest of {meta['repeat']} runs per prompt"
           if meta.get("repeat", 1) > 1 else ""),
    ] + ([f"- Noise: the slowest run of one method on one prompt took {spread[0]:.2f}x as long "
          f"as its fastest (median over rows; {spread[1]:.2f}x at the 90th percentile), for "
          "the same work; differences between methods within that are not resolved by one run"]
         if (spread := repeat_spread(records)) else [])


def best_lines(summary: Sequence[dict], records: Sequence[dict], where: str = "") -> list[str]:
    """The report's table of the best fixed setting per task against the default (a sweep)."""
    best = best_promptlookup(summary)
    if not best:
        return []
    lines = ["", f"## Best promptlookup setting per task{where}", "",
             "The fastest fixed setting measured, and the default (adaptive) against it. "
             "*Held out*: the default against the best fixed setting chosen on the other "
             "half of the task's prompts (odd vs even), which removes the luck of taking a "
             "maximum on the very prompts it is reported on. *Decode*: the default's decode "
             "speed-up over the best fixed setting's by that measure (time after the first "
             "forward pass, so without the prefill's share and noise).", "",
             "| task | best fixed setting | its speed-up | tokens/forward | default speed-up "
             "| default / best | default / best, held out | default / best, decode |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    return lines + [f"| {r['task']} | {r['method']} | {_cell(r['speedup'])} | "
                    f"{_cell(r['tokens_per_forward'])} | {_cell(r['default_speedup'])} | "
                    f"{_cell(r['default_speedup'] / r['speedup'] if r['default_speedup'] else None)}"
                    f" | {_cell(held_out_ratio(records, r['task']))} | {_cell(r['decode_ratio'])} |"
                    for r in best]


def agreed_summary(records: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """``(rows, agreed records)``: the summary of the rows cut to agreed prefixes, each row
    with its ``agreed_share``; empty when every greedy output equals plain's (nothing to add)
    or no method recorded token times."""
    greedy = [r for r in records if r.get("identical_to_plain") is not None]
    if all(r["identical_to_plain"] for r in greedy):
        return [], []
    agreed = agreed_records(records)
    rows = summarize(agreed)
    for row in rows:
        row["agreed_share"] = _round(agreed_share(records, agreed, row["task"]))
    return rows, agreed


def agreed_lines(records: Sequence[dict]) -> list[str]:
    rows, agreed = agreed_summary(records)
    if not rows:
        return []
    shown = set(headline_methods(rows))  # a sweep's grid only in the best-setting table below
    lines = ["", "## Speed on agreed prefixes", "",
             "Greedy outputs that differ from plain's (bfloat16 rounding) make tokens/s compare "
             "different texts. Here every method is timed until it had produced the tokens that "
             "*all* methods produced first on that prompt (`promptlookup.bench.agreed`); share: "
             "agreed tokens / plain's new tokens.", "",
             markdown_table([r for r in rows if r["method"] in shown], AGREED_KEYS,
                            AGREED_HEADERS)]
    return lines + best_lines(rows, agreed, ", on agreed prefixes")


def render_markdown(summary: Sequence[dict], meta: dict, figures: Sequence[str],
                    records: Sequence[dict] = ()) -> str:
    parts = ["# promptlookup benchmark", "", *_meta_lines(meta, records), "", "## Summary", "",
             markdown_table(summary), "",
             "Speed-up: tokens per second against `plain` over the same prompts (ratio of "
             "totals); median speed-up: median of per-prompt ratios; tokens/forward: new tokens "
             "per target forward pass; acceptance: accepted / drafted tokens; identical: share "
             "of outputs token-identical to `plain` (– when sampling); identical to -none: "
             "share identical to `promptlookup-none`'s; first token s: median "
             "seconds to the first new token (mostly the prompt's prefill); decode speed-up: "
             "speed-up after each request's first forward pass that produced tokens (prefill "
             "left out)."]
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
        (out / "agreed_summary.json").write_text(json.dumps(agreed, indent=2) + "\n",
                                                 encoding="utf-8")
    else:
        (out / "agreed_summary.json").unlink(missing_ok=True)  # from an earlier run here
    figures = []
    if summary:
        bar_figure(summary, "speedup", "speed-up vs plain (tokens/s ratio)",
                    "Speed-up per task and method", out / "speedup.png")
        bar_figure(summary, "tokens_per_forward", "new tokens per forward pass",
                    "Tokens per target forward pass", out / "tokens_per_forward.png")
        figures = ["speedup.png", "tokens_per_forward.png"]
        if sweep_figure(summary, out / "sweep.png"):
            figures.append("sweep.png")
        else:
            (out / "sweep.png").unlink(missing_ok=True)  # from an earlier run in this folder
    (out / "report.md").write_text(render_markdown(summary, meta, figures, records),
                                    encoding="utf-8")
    return summary


def report_from_dir(out_dir: str | Path) -> list[dict]:
    """Regenerate summary.json, report.md and figures from ``out_dir/results.jsonl``."""
    out = Path(out_dir)
    records = read_results(out / "results.jsonl", tolerate_partial_last_line=True)
    meta_path = out / "meta.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
    return write_outputs(out, records, meta)
