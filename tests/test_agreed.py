"""Speed on agreed prefixes: the prefix policy, the cut rows, the token clocks of every bench
method (both backends), and the report section that appears only when outputs part."""

from __future__ import annotations

import json

import pytest

from promptlookup.bench import BenchRow, MethodOutput, Settings, read_results, run_bench
from promptlookup.bench.agreed import agreed_length, agreed_records
from promptlookup.bench.methods import make_method
from promptlookup.bench.report import console_tables
from promptlookup.bench.summary import summarize

TEXTS = ["abcabcabd abcabcabd abcab", "xyzxyz qxyz xyzx"]


def rows(n: int = 2) -> list[BenchRow]:
    return [BenchRow("t", f"p{i}", [{"role": "user", "content": TEXTS[i]}]) for i in range(n)]


def row(method, ids, times, prompt="p0", identical=True, task="t"):
    return {
        "task": task,
        "id": prompt,
        "method": method,
        "identical_to_plain": identical,
        "new_tokens": len(ids),
        "seconds": times[-1] if times else 0.0,
        "token_ids": ids,
        "token_seconds": times,
    }


def test_agreed_prefix_is_the_longest_run_of_leading_tokens_every_method_produced():
    assert agreed_length([[1, 2, 3], [1, 2, 3]]) == 3
    assert agreed_length([[1, 2, 3], [1, 2]]) == 2  # one stopped (EOS) earlier
    assert agreed_length([[1, 2, 3], [1, 4, 3]]) == 1  # tokens after a split do not count
    assert agreed_length([[1, 2], [3, 2]]) == 0
    assert agreed_length([[1, 2], []]) == 0
    assert agreed_length([]) == 0


def test_rows_are_cut_to_the_agreed_prefix_and_timed_until_its_last_token():
    records = [
        row("plain", [1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0]),
        row("fast", [1, 2, 3, 9], [0.2, 0.3, 0.9, 1.0], identical=False),
        row("other", [1, 2, 3, 4], [0.5, 0.6, 0.7, 0.8]),
        # p1: parts at the first token, so it has no agreed prefix and is left out.
        row("plain", [5, 6], [1.0, 2.0], prompt="p1"),
        row("fast", [7, 6], [0.5, 0.6], prompt="p1", identical=False),
        row("other", [5, 6], [0.5, 0.6], prompt="p1"),
        # p2: one method without token times (an older run): left out.
        row("plain", [5], [1.0], prompt="p2"),
        {**row("fast", [5], [0.5], prompt="p2"), "token_seconds": None},
        row("other", [5], [0.5], prompt="p2"),
        # s0: sampled (identity unknown): left out.
        row("plain", [5], [1.0], prompt="s0", identical=None),
    ]
    cut = {(r["id"], r["method"]): r for r in agreed_records(records)}
    assert set(cut) == {("p0", "plain"), ("p0", "fast"), ("p0", "other")}
    assert [
        (cut["p0", m]["new_tokens"], cut["p0", m]["seconds"]) for m in ("plain", "fast", "other")
    ] == [(3, 3.0), (3, 0.9), (3, 0.7)]
    assert all(r["forward_passes"] is None for r in cut.values())


class ChangedLastToken:
    """Wraps a method and changes the last new token it writes (as a bfloat16 near-tie might)."""

    name = "changed"

    def __init__(self, inner) -> None:
        self.inner = inner

    def run(self, prompt_ids, settings) -> MethodOutput:
        out = self.inner.run(prompt_ids, settings)
        out.token_ids = [*out.token_ids[:-1], (out.token_ids[-1] + 1) % 32]
        return out


def test_every_method_records_when_each_of_its_tokens_arrived(tiny_lm):
    specs = ["plain", "hf-pld", "promptlookup", "promptlookup-none", "hf-custom"]
    result = run_bench(tiny_lm, rows(2), specs, Settings(max_new_tokens=10), warmup=False)
    for record in result.records:
        times = record["token_seconds"]
        assert len(record["token_ids"]) == record["new_tokens"] == len(times), record["method"]
        assert times == sorted(times) and 0 < times[0]
        assert times[-1] <= record["seconds"] + 1e-5


def test_report_adds_agreed_prefix_speeds_only_when_outputs_part(tiny_lm, tmp_path):
    same = tmp_path / "same"
    run_bench(
        tiny_lm,
        rows(2),
        ["plain", "promptlookup"],
        Settings(max_new_tokens=8),
        out_dir=same,
        warmup=False,
    )
    assert "agreed prefixes" not in (same / "report.md").read_text()
    assert not (same / "agreed_summary.json").exists()
    same_records = read_results(same / "results.jsonl")
    assert "agreed prefixes" not in console_tables(same_records, summarize(same_records))

    parted = tmp_path / "parted"
    changed = ChangedLastToken(make_method("torch", "promptlookup", tiny_lm))
    run_bench(
        tiny_lm,
        rows(2),
        ["plain", changed],
        Settings(max_new_tokens=8),
        out_dir=parted,
        warmup=False,
    )
    records = read_results(parted / "results.jsonl")
    assert "## Speed on agreed prefixes" in (parted / "report.md").read_text()
    printed = console_tables(records, summarize(records))
    assert "On agreed prefixes" in printed and "share" in printed.split("agreed prefixes")[1]
    agreed = {
        (r["task"], r["method"]): r
        for r in json.loads((parted / "agreed_summary.json").read_text())
    }
    plain = [r for r in records if r["method"] == "plain"]
    assert all(r["new_tokens"] >= 2 for r in plain)  # so every prompt keeps an agreed prefix
    # Each prompt loses its last token, and is timed until the one before it.
    assert agreed[("t", "plain")]["agreed_share"] == pytest.approx(
        sum(r["new_tokens"] - 1 for r in plain) / sum(r["new_tokens"] for r in plain), abs=1e-4
    )
    for method in ("plain", "changed"):
        mine = [r for r in records if r["method"] == method]
        rate = sum(r["new_tokens"] - 1 for r in mine) / sum(r["token_seconds"][-2] for r in mine)
        assert agreed[("t", method)]["tokens_per_second"] == pytest.approx(rate, rel=1e-3)
