"""The summaries of a bench run, computed from ``results.jsonl`` (nothing else is trusted).

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
- ``peak_rss_mib``: the highest peak resident memory (MiB) of the process that generated,
  over the method's rows (null when unknown; local methods share one process and its model).

When greedy outputs differ from ``plain``'s (bfloat16), ``agreed_summary.json`` and the report
also give the speeds on *agreed prefixes*, the tokens every method produced (see
:mod:`promptlookup.bench.agreed`), with ``agreed_share`` = agreed / plain's new tokens.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from .agreed import agreed_records, agreed_share
from .data import BenchDataError
from .methods import ALL_TASKS, BASELINE, OWN_PLAIN

#: The summary's columns, in order: each row's key and the header the report's tables show.
SUMMARY_COLUMNS = (
    ("task", "task"),
    ("method", "method"),
    ("prompts", "prompts"),
    ("tokens_per_second", "tokens/s"),
    ("speedup", "speed-up"),
    ("median_speedup", "median speed-up"),
    ("tokens_per_forward", "tokens/forward"),
    ("acceptance_rate", "acceptance"),
    ("identical_fraction", "identical"),
    ("identical_to_none_fraction", "identical to -none"),
    ("first_token_seconds", "first token s"),
    ("decode_speedup", "decode speed-up"),
    ("peak_rss_mib", "peak RSS MiB"),
)
SUMMARY_KEYS = tuple(key for key, _ in SUMMARY_COLUMNS)


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
        plain_rate = _ratio(
            sum(p["new_tokens"] for _, p in paired), sum(p["seconds"] for _, p in paired)
        )
        mine_rate = _ratio(
            sum(r["new_tokens"] for r, _ in paired), sum(r["seconds"] for r, _ in paired)
        )
        speedup = _ratio(mine_rate, plain_rate) if mine_rate is not None and plain_rate else None
    per_prompt = [
        _ratio(
            _ratio(r["new_tokens"], r["seconds"]) or 0.0,
            _ratio(p["new_tokens"], p["seconds"]) or 0.0,
        )
        for r, p in paired
    ]
    per_prompt = [x for x in per_prompt if x is not None]
    forwards = total("forward_passes", mine)
    drafted, accepted = total("drafted_tokens", mine), total("accepted_tokens", mine)
    identical = [r["identical_to_plain"] for r in mine if r["identical_to_plain"] is not None]
    same_as_none = [r["identical_to_none"] for r in mine if r.get("identical_to_none") is not None]
    firsts = [r["token_seconds"][0] for r in mine if r.get("token_seconds")]
    decode = _decode_rate([r for r, _ in paired])
    plain_decode = _decode_rate([p for _, p in paired])
    peaks = [r["peak_rss_mib"] for r in mine if r.get("peak_rss_mib") is not None]
    row = dict(
        task=task,
        method=method,
        prompts=len(mine),
        tokens_per_second=_round(rate, 3),
        speedup=_round(speedup),
        median_speedup=_round(statistics.median(per_prompt)) if per_prompt else None,
        tokens_per_forward=_round(_ratio(total("new_tokens", mine), forwards))
        if forwards is not None
        else None,
        acceptance_rate=_round(_ratio(accepted, drafted))
        if drafted is not None and accepted is not None
        else None,
        identical_fraction=_round(sum(identical) / len(identical)) if identical else None,
        identical_to_none_fraction=_round(sum(same_as_none) / len(same_as_none))
        if same_as_none
        else None,
        first_token_seconds=_round(statistics.median(firsts)) if len(firsts) == len(mine) else None,
        decode_speedup=_round(_ratio(decode, plain_decode))
        if decode is not None and plain_decode
        else None,
        peak_rss_mib=max(peaks) if peaks else None,
    )
    return {key: row[key] for key in SUMMARY_KEYS}  # in the columns' order


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
        rows = [
            r
            for r in summary
            if r["task"] == task
            and r["speedup"] is not None
            and r["method"].split(":")[0] == "promptlookup"
        ]
        fixed = [r for r in rows if r["method"] != "promptlookup"] or rows
        default = next((r for r in rows if r["method"] == "promptlookup"), {})
        decoded = [r["decode_speedup"] for r in fixed if r.get("decode_speedup")]
        decode_ratio = (
            _ratio(default["decode_speedup"], max(decoded))
            if default.get("decode_speedup") and decoded
            else None
        )
        if len(rows) > 1:
            best.append(
                {
                    **max(fixed, key=lambda r: r["speedup"]),
                    "default_speedup": default.get("speedup"),
                    "decode_ratio": _round(decode_ratio),
                }
            )
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
    mine = [
        r
        for r in records
        if task in (ALL_TASKS, r["task"])
        and r.get("seconds")
        and r["method"].split(":")[0] == "promptlookup"
    ]
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


def repeat_spread(records: Sequence[dict]) -> tuple[float, float] | None:
    """With ``--repeat``: how far apart the runs of one method on one prompt were, as the median
    and 90th percentile over rows of slowest / fastest run time (the host's own noise, which a
    comparison between methods cannot resolve below); None without repeated rows.

    >>> repeat_spread([{"repeat_seconds": [1.0, 1.5]}, {"repeat_seconds": [2.0, 2.2, 2.0]},
    ...                {"repeat_seconds": [3.0]}])
    (1.3, 1.46)
    """
    spreads = sorted(
        max(r["repeat_seconds"]) / min(r["repeat_seconds"])
        for r in records
        if len(r.get("repeat_seconds") or ()) > 1 and min(r["repeat_seconds"]) > 0
    )
    if not spreads:
        return None
    p90 = (
        statistics.quantiles(spreads, n=10, method="inclusive")[-1]
        if len(spreads) > 1
        else spreads[0]
    )
    return round(statistics.median(spreads), 2), round(p90, 2)


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


def speedup_parts(summary: Sequence[dict]) -> list[dict]:
    """What each promptlookup method's speed-up over ``plain`` is made of, per task, when
    ``promptlookup-none`` (the same engine, no drafter) ran: ``engine``, its own speed-up
    (promptlookup's forward passes against ``transformers``' ``generate``), and ``drafting``,
    the method's over ``promptlookup-none`` (what drafting adds on that engine). Their product
    is the method's speed-up (every ratio is of totals over the same prompts)."""
    speedups = {(r["task"], r["method"]): r["speedup"] for r in summary}
    parts = []
    for row in summary:
        engine = speedups.get((row["task"], OWN_PLAIN))
        method, total = row["method"], row["speedup"]
        if method.split(":")[0] != "promptlookup" or method == OWN_PLAIN or not engine:
            continue
        if total is not None:
            drafting = _round(total / engine)
            parts.append(dict(task=row["task"], method=method, speedup=total, engine=engine,
                              drafting=drafting))  # fmt: skip
    return parts
